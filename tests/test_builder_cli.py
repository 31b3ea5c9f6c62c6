"""`builder inspect`, `builder verify` and `builder plan` through the CLI, and the group's error handling.

verify is shown a bundle made wrong in exactly one way; where the wrong file's hash is fixed up,
only the consistency checks (not the runtime's hash checks) can catch it.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from contract_edits import retarget_h200

import toolcall.builder.inspect_bundle
from toolcall.builder.checkpoint import parse_config
from toolcall.builder.cli import main as builder_cli
from toolcall.builder.inspect_bundle import CHECKS
from toolcall.builder.tiers import (
    DEFAULT_MAX_INPUT_TOKENS,
    DEFAULT_MAX_OUTPUT_TOKENS,
    TIER_COLUMNS,
    plan_tiers,
    tier_rows,
)
from toolcall.common.errors import EXIT_CODES
from toolcall.kernels.cubin import sm_number
from toolcall.runtime.bundle.contract import CONTRACT_FILE, compute_bundle_id, parse_contract
from toolcall.runtime.bundle.files import GRAMMAR_FILE, WEIGHTS_FILE, check_files, file_entry, read_contract
from toolcall.runtime.grammar.trie import Grammar

GIB = 1 << 30
SECTIONS = ("format", "engine", "model", "target", "precision", "limits", "memory", "grammar", "canary", "prompt")


def cli(*args):
    return CliRunner().invoke(builder_cli, [str(a) for a in args])


@pytest.fixture
def bundle(tmp_path, tiny_bundle):
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, folder)
    return folder


# -- making a bundle wrong ------------------------------------------------------------------------


def edit_contract(folder: Path, edit, rehash: bool = True) -> None:
    """Edits contract.json as a forger would: bundle_id recomputed over the edited content (unless
    the edit leaves the schema, where no Contract can be read to hash)."""
    path = folder / CONTRACT_FILE
    d = json.loads(path.read_text())
    edit(d)
    if rehash:
        d["engine"]["bundle_id"] = compute_bundle_id(d)
    path.write_text(json.dumps(d, sort_keys=True, indent=2))


def fix_hashes(folder: Path, *new_files: str) -> None:
    """Lists ``new_files`` and re-hashes every listed file, bundle_id included: hashes pass again."""
    def edit(d):
        names = set(d["files"]) | set(new_files)
        entries = {n: file_entry(folder / n) for n in sorted(names)}
        d["files"] = {n: dataclasses.asdict(e) for n, e in entries.items()}
    edit_contract(folder, edit)


def edit_weights_header(folder: Path, edit) -> None:
    """Rewrites weights.safetensors' JSON header (data untouched), then fixes the hashes."""
    path = folder / WEIGHTS_FILE
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n:])
    fix_hashes(folder)


def memory_off(field: str, delta: int):
    def edit(d):
        d["memory"][field] += delta
        d["memory"]["total_bytes"] += delta  # keeps the schema's sum check quiet
    return lambda b: edit_contract(b, edit)


def grammar_number_in_file(b):
    g = Grammar.read(b / GRAMMAR_FILE)
    dataclasses.replace(g, max_tools=g.max_tools - 1).write(b / GRAMMAR_FILE)
    fix_hashes(b)


def fake_cubin(sm: int, abi: int = 8) -> bytes:
    """A 64-byte CUDA ELF header: class 64-bit, OS ABI 0x41, e_machine 190, SM number in e_flags."""
    head = bytearray(64)
    head[:9] = b"\x7fELF\x02\x01\x01\x41" + bytes([abi])
    struct.pack_into("<H", head, 18, 190)
    struct.pack_into("<I", head, 48, (sm << 8 | 0x6000004) if abi >= 8 else sm)
    return bytes(head)


def add_cubin(b, sm: int) -> None:
    (b / "kernels").mkdir()
    (b / "kernels" / "argmax.cubin").write_bytes(fake_cubin(sm))
    fix_hashes(b, "kernels/argmax.cubin")




def gpu_target(b):
    edit_contract(b, retarget_h200)


def flipped_weight_byte(b):
    data = bytearray((b / WEIGHTS_FILE).read_bytes())
    data[-3] ^= 0x10
    (b / WEIGHTS_FILE).write_bytes(bytes(data))


# name, breaker, error code, hashes still pass (then only a consistency check can catch it)
BROKEN = [
    # [intermediate, hidden] -> [hidden, intermediate]: same bytes
    ("transposed_tensor", lambda b: edit_weights_header(
        b, lambda h: h["model.layers.0.mlp.gate_proj.weight"]["shape"].reverse()), "bundle_invalid", True),
    ("retyped_tensor", lambda b: edit_weights_header(  # F16 has BF16's size
        b, lambda h: h["model.norm.weight"].update(dtype="F16")), "bundle_invalid", True),
    ("renamed_tensor", lambda b: edit_weights_header(
        b, lambda h: h.__setitem__("model.norm.weights", h.pop("model.norm.weight"))), "bundle_invalid", True),
    ("weights_bytes_off", memory_off("weights_bytes", 64), "bundle_invalid", True),
    ("kv_pool_bytes_off", memory_off("kv_pool_bytes", 4096), "bundle_invalid", True),
    ("grammar_number_in_contract", lambda b: edit_contract(
        b, lambda d: d["grammar"].update(edges=d["grammar"]["edges"] + 1)), "bundle_invalid", True),
    ("grammar_number_in_file", grammar_number_in_file, "bundle_invalid", True),
    ("canary_outside_vocab", lambda b: edit_contract(
        b, lambda d: d["canary"]["prompts"][0].update(prompt_token_ids=[d["model"]["vocab_size"] + 5])),
     "bundle_invalid", True),
    ("canary_off_grammar", lambda b: edit_contract(b, lambda d: d["canary"]["prompts"][1].update(
        expected_token_ids=d["canary"]["prompts"][1]["expected_token_ids"][::-1])), "bundle_invalid", True),
    ("canary_step_missing", lambda b: edit_contract(b, lambda d: d["canary"]["prompts"][0]["steps"].pop()),
     "bundle_invalid", True),
    ("canary_logit_nan", lambda b: edit_contract(b, lambda d: d["canary"]["prompts"][0]["steps"][0].update(
        logits=[float("nan")] * len(d["canary"]["prompts"][0]["steps"][0]["logits"])), rehash=False),
     "schema_invalid", False),
    ("tolerance_loosened", lambda b: edit_contract(b, lambda d: d["canary"].update(logit_tolerance=1e3)),
     "bundle_invalid", True),
    ("workspace_off", memory_off("workspace_bytes", 4096), "bundle_invalid", True),
    ("max_sequences_past_pages", lambda b: edit_contract(b, lambda d: d["limits"].update(
        max_sequences=d["limits"]["num_pages"] + 1, max_tokens_per_step=10**4)), "bundle_invalid", True),
    ("num_pages_x1000", lambda b: edit_contract(b, lambda d: d["limits"].update(
        num_pages=d["limits"]["num_pages"] * 1000)), "bundle_invalid", True),
    ("layer_dropped", lambda b: edit_contract(b, lambda d: d["model"].update(
        num_layers=d["model"]["num_layers"] - 1)), "bundle_invalid", True),
    ("steps_x1000", lambda b: edit_contract(b, lambda d: d["limits"].update(
        max_tokens_per_step=d["limits"]["max_tokens_per_step"] * 1000)), "bundle_invalid", True),
    ("precision_relabelled", lambda b: edit_contract(b, lambda d: d["precision"].update(weights="nvfp4")),
     "bundle_invalid", True),
    ("input_past_positions", lambda b: edit_contract(b, lambda d: d["limits"].update(
        max_input_tokens=d["model"]["max_position_embeddings"])), "bundle_invalid", True),
    ("contract_edited_unhashed", lambda b: edit_contract(b, lambda d: d["limits"].update(
        max_sequences=d["limits"]["max_sequences"] - 1), rehash=False), "hash_mismatch", False),
    ("kernels_on_cpu", lambda b: add_cubin(b, 90), "bundle_invalid", True),
    ("gpu_without_kernels", gpu_target, "bundle_invalid", True),
    ("gpu_with_wrong_arch", lambda b: (gpu_target(b), add_cubin(b, 80)), "bundle_invalid", True),
    ("unlisted_file", lambda b: (b / "notes.txt").write_text("not in the bundle"), "bundle_invalid", True),
    ("grammar_not_listed", lambda b: edit_contract(b, lambda d: d["files"].pop(GRAMMAR_FILE)), "bundle_invalid",
     False),
    ("tokenizer_not_listed", lambda b: edit_contract(b, lambda d: d["files"].pop("tokenizer.json")),
     "bundle_invalid", False),
    ("weights_not_listed", lambda b: edit_contract(b, lambda d: d["files"].pop(WEIGHTS_FILE)), "bundle_invalid",
     False),
    ("end_not_eos", lambda b: edit_contract(b, lambda d: d["model"].update(
        eos_token_ids=[d["model"]["eos_token_ids"][0] + 1])), "bundle_invalid", True),
    ("canary_too_long", lambda b: edit_contract(b, lambda d: d["canary"]["prompts"][0].update(
        prompt_token_ids=[1] * (d["limits"]["max_input_tokens"] + 1))), "bundle_invalid", True),
    ("no_contract", lambda b: (b / CONTRACT_FILE).unlink(), "missing_contract", False),
    ("flipped_weight_byte", flipped_weight_byte, "hash_mismatch", False),
    ("schema_violation", lambda b: edit_contract(b, lambda d: d["limits"].update(page_size="32"), rehash=False),
     "schema_invalid", False),
]


@pytest.mark.parametrize("name,breaker,code,hashes_pass", BROKEN, ids=[b[0] for b in BROKEN])
def test_verify_catches_each_inconsistency(bundle, name, breaker, code, hashes_pass):
    assert cli("verify", bundle).exit_code == 0
    breaker(bundle)
    if hashes_pass:
        check_files(bundle, read_contract(bundle))  # the runtime's checks see nothing wrong
    result = cli("verify", bundle, "--json")
    assert result.exit_code == EXIT_CODES[code], result.output
    err = json.loads(result.stdout)
    assert err["error"] == code and "Traceback" not in result.output
    if code == "bundle_invalid":
        assert err["details"]["file"] and "rebuild" in err["message"]
    plain = cli("verify", bundle)
    assert plain.exit_code == EXIT_CODES[code] and f"[{code}]" in plain.stderr and "ok" not in plain.stdout


def test_verify_passes_on_good_bundles(bundle):
    result = cli("verify", bundle, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["checks"] == list(CHECKS)
    plain = cli("verify", bundle)
    assert plain.exit_code == 0 and plain.stdout.startswith("ok: ")
    gpu_target(bundle)  # a GPU bundle whose (stand-in) cubin matches its sm_arch
    add_cubin(bundle, 90)
    assert cli("verify", bundle).exit_code == 0


@pytest.mark.parametrize("data,sm", [(fake_cubin(80), 80), (fake_cubin(90), 90), (fake_cubin(100), 100),
                                     (fake_cubin(120), 120), (fake_cubin(90, abi=7), 90),
                                     (b"\x7fELF" + bytes(60), None), (b"PK\x03\x04" + bytes(60), None), (b"", None)])
def test_cubin_sm_reads_the_elf_header(data, sm):
    assert sm_number(data) == sm


# -- inspect ---------------------------------------------------------------------------------------


def test_inspect_json_round_trips_the_contract(bundle):
    result = cli("inspect", bundle, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    original = json.loads((bundle / CONTRACT_FILE).read_text())
    rebuilt = {k: info[k] for k in SECTIONS}
    rebuilt["files"] = {f["name"]: {"bytes": f["bytes"], "sha256": f["sha256"]} for f in info["files"]}
    assert rebuilt == original
    assert parse_contract(rebuilt).to_dict() == original
    assert info["bundle_id"] == original["engine"]["bundle_id"]
    assert info["files_bytes"] == sum(f["bytes"] for f in original["files"].values())
    assert cli("inspect", bundle.parent, "--json").exit_code == EXIT_CODES["missing_contract"]


def test_inspect_table_shows_the_numbers(bundle):
    result = cli("inspect", bundle)
    assert result.exit_code == 0, result.output
    c = json.loads((bundle / CONTRACT_FILE).read_text())
    text = result.stdout
    assert c["engine"]["bundle_id"] in text and c["precision"]["weights"] in text and c["target"]["name"] in text
    for value in c["memory"].values():
        assert f"{value:,}" in text
    for name, entry in c["files"].items():
        assert f"{name}" in text and f"{entry['bytes']:,}" in text and entry["sha256"][:12] in text
    for key in ("max_sequences", "num_pages", "page_size", "max_input_tokens", "max_output_tokens"):
        assert str(c["limits"][key]) in text
    assert f"{c['grammar']['num_tools']} tools" in text and str(c["canary"]["prompts"][0]["expected_token_ids"]) in text


# -- plan ------------------------------------------------------------------------------------------


def test_plan_json_is_plan_tiers(tiny_checkpoint):
    result = cli("plan", tiny_checkpoint, "--gpu-memory", "1GiB", "--precision", "nvfp4", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    expected = plan_tiers(parse_config(Path(tiny_checkpoint)), "nvfp4", GIB, "h200", 32)
    assert [t["tier"] for t in out["tiers"]] == [t.name for t in expected]
    assert [t["limits"] for t in out["tiers"]] == [dataclasses.asdict(t.limits) for t in expected]
    assert [t["memory"] for t in out["tiers"]] == [dataclasses.asdict(t.memory) for t in expected]
    assert all(t["memory"]["total_bytes"] <= GIB for t in out["tiers"])
    assert (out["target"], out["precision"], out["gpu_memory_bytes"]) == ("h200", "nvfp4", GIB)


def test_plan_table_writes_nothing(tmp_path, tiny_checkpoint, monkeypatch):
    before = sorted(p.name for p in Path(tiny_checkpoint).iterdir())
    monkeypatch.chdir(tmp_path)
    result = cli("plan", tiny_checkpoint, "--gpu-memory", "1GiB", "--page-size", "16")
    assert result.exit_code == 0, result.output
    assert list(tmp_path.iterdir()) == []
    assert sorted(p.name for p in Path(tiny_checkpoint).iterdir()) == before
    lines = result.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("tier ")))
    assert lines[header].split() == list(TIER_COLUMNS)
    rows = tier_rows(plan_tiers(parse_config(Path(tiny_checkpoint)), "fp8_e4m3", GIB, "h200", 16))
    assert [line.split() for line in lines[header + 1:header + 1 + len(rows)]] == [[str(v) for v in r] for r in rows]


def test_plan_compile_args_build_that_tier(tmp_path, tiny_checkpoint):
    plan = json.loads(cli("plan", tiny_checkpoint, "--gpu-memory", "64MiB", "--target", "cpu", "--json").stdout)
    tier = plan["tiers"][0]
    catalog = Path(__file__).resolve().parents[1] / "builder" / "data" / "tools-64.json"
    result = cli("compile", tiny_checkpoint, "--catalog", catalog, "--out", tmp_path / "b", *tier["compile_args"],
                 "--json")
    assert result.exit_code == 0, result.output
    built = json.loads(result.stdout)
    pinned = json.loads((tmp_path / "b" / CONTRACT_FILE).read_text())["prompt"]["prefix_pages"]
    # the plan knows no template: the build adds the template's pinned prefix pages to the pool
    assert built["limits"] == {**tier["limits"], "num_pages": tier["limits"]["num_pages"] + pinned}
    assert built["memory"]["total_bytes"] <= tier["memory"]["total_bytes"]  # the plan bounds edges by vocab


PLAN_REFUSALS = [  # plan's arguments after the checkpoint ("nope": a missing checkpoint instead)
    (["nope", "--gpu-memory", "1GiB"], "checkpoint_invalid", "path"),
    (["--gpu-memory", "1MiB"], "budget_too_small", "needed_bytes"),
    (["--gpu-memory", "1GiB", "--page-size", "0"], "usage", "option"),
    (["--gpu-memory", "1GiB", "--target", "tpu9"], "usage", "known"),
    (["--gpu-memory", "lots"], "usage", "found"),
    (["--gpu-memory", "1GiB", "--max-input-tokens", "100000"], "usage", "limit"),
    (["--page-size", "16"], "usage", "option"),  # --gpu-memory missing for the default (GPU) target
    (["--gpu-memory", "1GiB", "--page-size", "2147483648"], "usage", "option"),  # bounded before any allocation
]


def test_plan_for_the_cpu_fills_the_hosts_memory(tiny_checkpoint):
    result = cli("plan", tiny_checkpoint, "--target", "cpu", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["target"] == "cpu" and 0 < out["gpu_memory_bytes"] and out["tiers"]


@pytest.mark.parametrize("option,value", [("--page-size", "2147483648"), ("--page-size", "9223372036854775808"),
                                          ("--page-size", "0"), ("--max-sequences", "-3"),
                                          ("--max-input-tokens", "99999999999"), ("--prefill-chunk", "0"),
                                          ("--max-tokens-per-step", "1e9"), ("--max-output-tokens", "0")])
def test_compile_bounds_every_count_before_any_work(tmp_path, tiny_checkpoint, option, value):
    result = cli("compile", tiny_checkpoint, "--catalog", "builder/data/tools-64.json", "--out", tmp_path / "b",
                 option, value, "--json")
    assert result.exit_code == EXIT_CODES["usage"], result.output
    err = json.loads(result.stdout)
    assert err["error"] == "usage" and option.lstrip("-").replace("-", "_") == err["details"]["option"]
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("args,code,detail", PLAN_REFUSALS, ids=[" ".join(a) for a, _, _ in PLAN_REFUSALS])
def test_plan_refusals(tmp_path, tiny_checkpoint, args, code, detail):
    checkpoint, args = (tmp_path / args[0], args[1:]) if args[0] == "nope" else (tiny_checkpoint, args)
    result = cli("plan", checkpoint, *args, "--json")
    assert result.exit_code == EXIT_CODES[code], result.output
    err = json.loads(result.stdout)
    assert err["error"] == code and detail in err["details"]


# -- the command group -------------------------------------------------------------------------------


@pytest.mark.parametrize("command,phrase", [("compile", "contract.json"), ("inspect", "promises"),
                                            ("verify", "sm_arch"), ("plan", str(DEFAULT_MAX_INPUT_TOKENS)),
                                            ("plan", str(DEFAULT_MAX_OUTPUT_TOKENS)), ("synth", "synthetic")])
def test_help_explains(command, phrase):
    result = cli(command, "--help")
    assert result.exit_code == 0 and phrase in result.stdout
    assert "exit" in cli("--help").stdout


def test_unexpected_exception_is_an_internal_error_not_a_traceback(bundle, monkeypatch):
    def boom(folder):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(toolcall.builder.inspect_bundle, "inspect_bundle", boom)
    result = cli("inspect", bundle, "--json")
    assert result.exit_code == EXIT_CODES["internal"]
    err = json.loads(result.stdout)
    assert err["error"] == "internal" and "disk on fire" in err["message"]
    plain = cli("inspect", bundle)
    assert plain.exit_code == EXIT_CODES["internal"] and "Traceback" not in plain.output


def test_inspect_names_the_gpu_kernel_families_a_bundle_holds():
    """`builder inspect`'s gpu_kernels: the families whose every cubin is in the bundle (what runtime --gpu-kernels
    may pick): both for a bundle of today's kernels, fma alone for one built before the tensor-core family."""
    from toolcall.builder.inspect_bundle import gpu_kernel_families
    from toolcall.kernels.cuda_source import kernel_sources
    every = {f"kernels/{p.stem}.cubin" for p in kernel_sources()}
    assert gpu_kernel_families(every) == ["fma", "mma"]
    before = {n for n in every if not n.startswith(("kernels/linear_mma", "kernels/attention_prefill_mma"))}
    assert gpu_kernel_families(before) == ["fma"]
    assert gpu_kernel_families(set()) == []  # a CPU bundle
