"""`builder compile`: each refusal through the CLI, byte-identical rebuilds, atomic writes, and the
memory plan against the bytes really written (weights) and allocated (the CPU backend's KV pool)."""
from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

import toolcall.builder.compile
from toolcall.builder.cli import main as builder_cli
from toolcall.common.errors import EXIT_CODES
from toolcall.runtime.bundle.contract import CONTRACT_FILE
from toolcall.runtime.bundle.files import WEIGHTS_FILE
from toolcall.runtime.bundle.machine import MachineFacts
from toolcall.runtime.bundle.tensor_file import SafetensorsFile
from toolcall.runtime.engine import Engine

CATALOG = Path(__file__).resolve().parents[1] / "builder" / "data" / "tools-64.json"
# Small limits keep a tiny CPU build well under a second.
FAST = ["--max-input-tokens", "128", "--max-tokens-per-step", "128", "--prefill-chunk", "64"]
ROOMY_CPU = MachineFacts(free_bytes=1 << 40)


def compile_cli(*args):
    return CliRunner().invoke(builder_cli, ["compile", *map(str, args)])


def build(checkpoint, out, *extra) -> dict:
    """Compiles through the CLI with --json; the parsed result."""
    result = compile_cli(checkpoint, "--catalog", CATALOG, "--out", out, *FAST, *extra, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def snapshot(folder: Path) -> dict[str, str]:
    """Bundle-relative path -> sha256 of every file."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    """Temporary folders a build leaves beside its --out (partial or replaced bundles)."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# -- refusals ------------------------------------------------------------------------------------


def duplicate_tools_catalog(tmp: Path) -> Path:
    path = tmp / "dup.json"
    path.write_text(json.dumps({"tools": [{"name": "get_weather"}, {"name": "get_weather"}]}))
    return path


# id, extra args (given the tmp folder), error code, a detail the error must carry
REFUSALS = [
    ("missing-checkpoint", lambda t: ["--checkpoint-override", t / "no-such-checkpoint"], "checkpoint_invalid", "file"),
    ("bad-catalog", lambda t: ["--catalog", duplicate_tools_catalog(t)], "catalog_invalid", None),
    ("unknown-target", lambda t: ["--target", "tpu9"], "usage", "known"),
    ("budget-too-small", lambda t: ["--memory-budget", "512KiB"], "budget_too_small", "needed_bytes"),
    ("out-exists", lambda t: ["--out", t], "output_exists", "path"),
    ("page-size-0", lambda t: ["--page-size", "0"], "usage", "option"),
    ("max-sequences-0", lambda t: ["--max-sequences", "0"], "usage", "option"),
    ("step-below-sequences", lambda t: ["--max-sequences", "16", "--max-tokens-per-step", "8"], "usage",
     "max_sequences"),
    ("beyond-positions", lambda t: ["--max-input-tokens", "100000"], "usage", "limit"),
    ("bad-size-text", lambda t: ["--memory-budget", "6 parsecs"], "usage", "found"),
    ("page-size-not-int", lambda t: ["--page-size", "x"], "usage", "option"),  # click's own parse error
]


def refusal_args(checkpoint, tmp: Path, extra: list) -> list:
    """compile's arguments: the tiny checkpoint, --out tmp/out, then ``extra`` (later options win)."""
    if extra[:1] == ["--checkpoint-override"]:
        checkpoint, extra = extra[1], extra[2:]
    return [checkpoint, "--catalog", CATALOG, "--out", tmp / "out", *FAST, *extra]


@pytest.mark.parametrize("name,extra,code,detail", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_refusal_is_typed_with_exit_code_and_json(tmp_path, tiny_checkpoint, name, extra, code, detail):
    args = refusal_args(tiny_checkpoint, tmp_path, extra(tmp_path))
    as_json = compile_cli(*args, "--json")
    assert as_json.exit_code == EXIT_CODES[code], as_json.output
    err = json.loads(as_json.stdout)
    assert err["error"] == code and err["message"]
    assert detail is None or detail in err["details"], err
    plain = compile_cli(*args)
    assert plain.exit_code == EXIT_CODES[code]
    assert plain.stdout == "" and "rror" in plain.stderr
    for result in (as_json, plain):
        assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_refusal_messages_carry_the_numbers(tmp_path, tiny_checkpoint):
    err = json.loads(compile_cli(*refusal_args(tiny_checkpoint, tmp_path, ["--memory-budget", "512KiB"]),
                                 "--json").stdout)
    d = err["details"]
    for number in (d["budget_bytes"], d["needed_bytes"], d["one_sequence_kv_bytes"]):
        assert str(number) in err["message"]
    assert d["budget_bytes"] == 512 << 10 < d["needed_bytes"]
    err = json.loads(compile_cli(*refusal_args(tiny_checkpoint, tmp_path, ["--target", "tpu9"]), "--json").stdout)
    assert {"cpu", "h100", "h200", "b200", "sm_90"} <= set(err["details"]["known"])
    assert all(name in err["message"] for name in err["details"]["known"])


# -- reproducibility -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, tiny_checkpoint):
    """Two builds of the same inputs: (folder a, folder b)."""
    root = tmp_path_factory.mktemp("repro")
    build(tiny_checkpoint, root / "a")
    build(tiny_checkpoint, root / "b")
    return root / "a", root / "b"


def test_same_inputs_give_byte_identical_bundles(baseline):
    a, b = baseline
    sa, sb = snapshot(a), snapshot(b)
    assert sorted(sa) == sorted(sb)
    differing = [name for name in sa if sa[name] != sb[name]]
    where = {n: json_differences(json.loads((a / n).read_text()), json.loads((b / n).read_text()))
             for n in differing if n.endswith(".json")}
    assert differing == [], f"files differ between two identical builds: {differing}; JSON paths: {where}"
    ids = [json.loads((f / CONTRACT_FILE).read_text())["engine"]["bundle_id"] for f in (a, b)]
    assert ids[0] == ids[1]


def json_differences(x, y, path="$") -> list[str]:
    """JSON paths where two parsed documents differ (first 10)."""
    if isinstance(x, dict) and isinstance(y, dict):
        return [d for k in sorted(set(x) | set(y)) for d in json_differences(x.get(k), y.get(k), f"{path}.{k}")][:10]
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        return [d for i, (u, v) in enumerate(zip(x, y)) for d in json_differences(u, v, f"{path}[{i}]")][:10]
    return [] if x == y else [path]


OPTION_CHANGES = [["--precision", "nvfp4"], ["--precision", "bf16"], ["--max-sequences", "4"],
                  ["--page-size", "16"], ["--max-input-tokens", "96"], ["--max-output-tokens", "20"],
                  ["--max-tokens-per-step", "64"], ["--prefill-chunk", "32"], ["--memory-budget", "2MiB"],
                  ["--context-reserve", "1MiB"]]


@pytest.mark.parametrize("change", OPTION_CHANGES, ids=[" ".join(c) for c in OPTION_CHANGES])
def test_a_different_option_changes_bundle_id(tmp_path, tiny_checkpoint, baseline, change):
    a, b = baseline
    same = [json.loads((f / CONTRACT_FILE).read_text())["engine"]["bundle_id"] for f in (a, b)]
    assert same[0] == same[1], "same inputs gave different bundle_ids, so a different one would prove nothing"
    other = build(tiny_checkpoint, tmp_path / "other", *change)
    assert other["bundle_id"] != same[0], f"{change} built a different contract under the same bundle_id"


# -- atomic writes -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory, tiny_checkpoint):
    """The tiny checkpoint with one NaN in a decoder weight: the build fails after it started writing."""
    folder = tmp_path_factory.mktemp("nan-ckpt") / "ckpt"
    shutil.copytree(tiny_checkpoint, folder)
    name = "model.layers.1.mlp.down_proj.weight"
    (path,) = [p for p in folder.glob("*.safetensors") if name in SafetensorsFile(p).tensors]
    with SafetensorsFile(path) as st:
        info, (header_bytes,) = st.tensors[name], struct.unpack("<Q", path.read_bytes()[:8])
    nan = {"BF16": b"\xc0\x7f", "F16": b"\x00\x7e", "F32": b"\x00\x00\xc0\x7f"}[info.dtype]
    data = bytearray(path.read_bytes())
    data[8 + header_bytes + info.begin:8 + header_bytes + info.begin + len(nan)] = nan
    path.write_bytes(bytes(data))
    return folder


@pytest.mark.parametrize("why,code", [("nan", "quantize_invalid"), ("budget", "budget_too_small")])
def test_failed_build_leaves_nothing_and_keeps_the_old_bundle(tmp_path, tiny_checkpoint, nan_checkpoint, why, code):
    out = tmp_path / "bundle"
    build(tiny_checkpoint, out)
    before = snapshot(out)
    args = (nan_checkpoint, "--catalog", CATALOG, "--out", out, *FAST) if why == "nan" else \
        (tiny_checkpoint, "--catalog", CATALOG, "--out", out, *FAST, "--memory-budget", "512KiB")
    result = compile_cli(*args, "--force", "--json")
    assert result.exit_code == EXIT_CODES[code], result.output
    assert json.loads(result.stdout)["error"] == code
    assert snapshot(out) == before
    assert leftovers(tmp_path) == []


def test_force_replaces_only_once_the_new_bundle_is_complete(tmp_path, tiny_checkpoint, monkeypatch):
    out = tmp_path / "bundle"
    old_id = build(tiny_checkpoint, out)["bundle_id"]
    old = snapshot(out)
    seen_during_build = []
    real_canary = toolcall.builder.compile.record_canary

    def canary_watching_out(*args, **kwargs):  # runs after the new weights are written, before the rename
        seen_during_build.append(snapshot(out))
        return real_canary(*args, **kwargs)

    monkeypatch.setattr(toolcall.builder.compile, "record_canary", canary_watching_out)
    assert compile_cli(tiny_checkpoint, "--catalog", CATALOG, "--out", out, *FAST, "--force").exit_code == 0
    assert seen_during_build == [old]
    assert cli_verify(out) == 0
    result = compile_cli(tiny_checkpoint, "--catalog", CATALOG, "--out", out, *FAST, "--precision", "nvfp4",
                         "--force", "--json")
    assert result.exit_code == 0, result.output
    new_id = json.loads(result.stdout)["bundle_id"]
    contract = json.loads((out / CONTRACT_FILE).read_text())
    assert new_id != old_id and contract["engine"]["bundle_id"] == new_id
    assert contract["precision"]["weights"] == "nvfp4" and cli_verify(out) == 0
    assert leftovers(tmp_path) == []


def cli_verify(folder: Path) -> int:
    return CliRunner().invoke(builder_cli, ["verify", str(folder)]).exit_code


# -- the memory plan against real bytes ----------------------------------------------------------


def weights_data_bytes(path: Path) -> int:
    """Bytes of a safetensors file after its u64 header length and JSON header."""
    (header_bytes,) = struct.unpack("<Q", path.read_bytes()[:8])
    return path.stat().st_size - 8 - header_bytes


PLANS = [  # extra compile options
    ["--precision", "fp8"],
    ["--precision", "nvfp4", "--page-size", "16", "--max-sequences", "3"],
    ["--precision", "bf16", "--max-sequences", "2", "--max-output-tokens", "40"],
    ["--precision", "fp8", "--memory-budget", "2MiB"],
]


@pytest.mark.parametrize("extra", PLANS, ids=[" ".join(p) for p in PLANS])
def test_memory_plan_equals_written_and_allocated_bytes(tmp_path, tiny_checkpoint, extra):
    out = tmp_path / "bundle"
    memory = build(tiny_checkpoint, out, *extra)["memory"]
    assert memory["weights_bytes"] == weights_data_bytes(out / WEIGHTS_FILE)
    engine = Engine.load(out, facts=ROOMY_CPU)
    assert memory["kv_pool_bytes"] == engine.generator.kv.nbytes
    assert memory["total_bytes"] == sum(v for k, v in memory.items() if k != "total_bytes")
    if "--memory-budget" in extra:
        limits, budget = engine.contract.limits, 2 << 20
        page = memory["kv_pool_bytes"] // limits.num_pages
        assert memory["total_bytes"] <= budget < memory["total_bytes"] + page  # no whole page left unused
        assert limits.pages_per_sequence <= limits.num_pages < limits.max_sequences * limits.pages_per_sequence
