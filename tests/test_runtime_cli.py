"""`runtime run` as a person and a program use it: inputs from arguments, files and stdin, what it prints."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from toolcall.builder.cli import main as builder_cli
from toolcall.runtime import console
from toolcall.runtime.cli import ECHO_CHARS
from toolcall.runtime.cli import main as runtime_cli


def run(*args, stdin=None):
    return CliRunner().invoke(runtime_cli, [str(a) for a in args], input=stdin)


@pytest.mark.parametrize("cli, name", [(runtime_cli, "runtime"), (builder_cli, "builder")])
def test_version(cli, name):
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.output.startswith(f"{name} 0.")


@pytest.mark.parametrize("cli", [runtime_cli, builder_cli])
def test_help_names_no_source_files(cli):
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0 and ".py" not in result.output
    assert "canary_failed 29" in result.output or "output_exists 17" in result.output


def test_requests_from_arguments_file_and_stdin_in_order(tiny_bundle, tmp_path):
    path = tmp_path / "requests.txt"
    path.write_text("Find a hotel in Rome\n\nPlay some music\r\n")
    from_file = json.loads(run("run", tiny_bundle, "Book a flight to Paris", "-i", path, "--json").output)
    assert [r["request"] for r in from_file["results"]] == ["Book a flight to Paris", "Find a hotel in Rome",
                                                            "Play some music"]
    from_stdin = json.loads(run("run", tiny_bundle, "-i", "-", "--json", stdin="Find a hotel in Rome\n").output)
    alone, in_batch = from_stdin["results"][0], from_file["results"][1]
    assert (alone["request"], alone["tools"], alone["token_ids"]) == (in_batch["request"], in_batch["tools"],
                                                                      in_batch["token_ids"])


def test_no_requests_is_a_usage_error(tiny_bundle):
    result = run("run", tiny_bundle, "-i", "-", stdin="")
    assert result.exit_code == 2 and "no requests" in result.output


def test_plain_output_says_load_time_and_answer_tokens(tiny_bundle):
    result = run("run", tiny_bundle, "Book a flight to Paris")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"bound {tiny_bundle}") and "canary passed in" in lines[0]
    assert any(line.strip().startswith("answer: ") and "tokens, END included" in line for line in lines)


def test_a_refused_long_request_is_not_echoed_in_full(tiny_bundle):
    text = "book a flight " * 2000
    result = run("run", tiny_bundle, text)
    assert result.exit_code == 40  # prompt_too_long
    assert text not in result.output and f"({len(text):,} characters)" in result.output
    assert max(len(line) for line in result.output.splitlines() if line.startswith(">")) <= ECHO_CHARS + 2


def test_progress_only_on_a_terminal(tiny_bundle, capsys, monkeypatch):
    from toolcall.runtime.engine import Engine

    console.enable(False)
    Engine.load(tiny_bundle)
    assert capsys.readouterr().err == ""  # piped (or --json): nothing
    console.enable(True)
    try:
        Engine.load(tiny_bundle)
    finally:
        console.enable(False)
    err = capsys.readouterr().err
    assert "loading weights ... done" in err and "canary ... done" in err


@pytest.mark.parametrize("command", ["load", "run"])
def test_the_linear_kernel_family_is_a_gpu_option(tiny_bundle, command):
    """--gpu-kernels picks the GPU bundles' linear-layer kernels; on a CPU bundle anything but the default is a
    usage error that says so, before the weights are loaded."""
    args = [command, tiny_bundle, *(["Play some music"] if command == "run" else []), "--json"]
    assert run(*args, "--gpu-kernels", "fma").exit_code == 0
    refused = run(*args, "--gpu-kernels", "mma")
    assert refused.exit_code == 2 and "a kernel family of the GPU targets" in refused.output
    assert json.loads(refused.output)["error"] == "usage"
    unknown = run(*args, "--gpu-kernels", "wmma")
    assert unknown.exit_code == 2 and "fma" in unknown.output and "mma" in unknown.output
