"""`runtime load`: each refusal, in load order (docs/bundle-format.md, "Load order"), on a real bundle made wrong in exactly one way."""
from __future__ import annotations

import gc
import json
import shutil
import tracemalloc

import pytest
from click.testing import CliRunner
from contract_edits import retarget_h200

from toolcall.common.errors import EXIT_CODES, Refusal
from toolcall.runtime.bundle.contract import CONTRACT_FILE, compute_bundle_id
from toolcall.runtime.bundle.files import WEIGHTS_FILE
from toolcall.runtime.bundle.machine import MachineFacts
from toolcall.runtime.cli import main as runtime_cli
from toolcall.runtime.engine import Engine

ROOMY_CPU = MachineFacts(free_bytes=1 << 40)


@pytest.fixture
def bundle(tmp_path, tiny_bundle):
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, folder)
    return folder


def edit_contract(folder, edit, rehash=True):
    """Edits contract.json as a forger would, bundle_id recomputed (unless the edit leaves the schema)."""
    path = folder / CONTRACT_FILE
    d = json.loads(path.read_text())
    edit(d)
    if rehash:
        d["engine"]["bundle_id"] = compute_bundle_id(d)
    path.write_text(json.dumps(d))


def no_contract(b):
    (b / CONTRACT_FILE).unlink()


def schema_violation(b):
    edit_contract(b, lambda d: d["limits"].update(page_size="32"), rehash=False)


def future_format(b):
    edit_contract(b, lambda d: d["format"].update(version=99), rehash=False)


def missing_file(b):
    (b / "grammar.msgpack").unlink()


def flipped_weight_byte(b):
    data = bytearray((b / WEIGHTS_FILE).read_bytes())
    data[len(data) // 2] ^= 0x01
    (b / WEIGHTS_FILE).write_bytes(bytes(data))


def gpu_target(b):
    edit_contract(b, retarget_h200)


def huge_memory(b):
    def edit(d):
        # the context reserve is an option, not derivable from the files: only the machine check sees it
        d["memory"]["context_reserve_bytes"] += 1 << 50
        d["engine"]["build_options"]["context_reserve_bytes"] += 1 << 50
        d["memory"]["total_bytes"] += 1 << 50
    edit_contract(b, edit)


def tampered_canary(b):
    """A recorded logit moved by 1.0 (20x the tolerance): consistent in every other respect."""
    def edit(d):
        step = d["canary"]["prompts"][0]["steps"][0]
        step["logits"] = [step["logits"][0] + 1.0] + step["logits"][1:]
    edit_contract(b, edit)


# breaker, refusal code, a detail the refusal must carry
BROKEN = [
    (no_contract, "missing_contract", "path"),
    (schema_violation, "schema_invalid", "path"),
    (future_format, "format_unsupported", "supported"),
    (missing_file, "file_missing", "file"),
    (flipped_weight_byte, "hash_mismatch", "expected"),
    (gpu_target, "no_gpu", "target"),
    (huge_memory, "insufficient_memory", "needed"),
    (tampered_canary, "canary_failed", "found"),
]


@pytest.mark.parametrize("breaker,code,detail", BROKEN, ids=[b[1] for b in BROKEN])
def test_each_refusal(bundle, breaker, code, detail):
    breaker(bundle)
    facts = None if breaker is gpu_target or breaker is huge_memory else ROOMY_CPU
    with pytest.raises(Refusal) as info:
        Engine.load(bundle, facts=facts)
    assert info.value.code == code
    assert detail in info.value.details
    result = CliRunner().invoke(runtime_cli, ["load", str(bundle), "--json"])
    assert result.exit_code == EXIT_CODES[code], result.output
    assert json.loads(result.output)["error"] == code


def test_refusal_exit_codes_are_distinct():
    codes = [c for _, c, _ in BROKEN]
    assert len({EXIT_CODES[c] for c in codes}) == len(codes)


@pytest.mark.parametrize("facts,code", [
    (MachineFacts(1 << 40, "NVIDIA H100 80GB HBM3", "9.0", 13000), "target_mismatch"),
    (MachineFacts(1 << 40, "NVIDIA H200", "9.0", 12080), "driver_too_old"),
    (MachineFacts(1 << 20, "NVIDIA H200", "9.0", 13000), "insufficient_memory"),
    (MachineFacts(1 << 40), "no_gpu"),
])
def test_gpu_target_checks_against_device_facts(bundle, facts, code):
    gpu_target(bundle)
    with pytest.raises(Refusal) as info:
        Engine.load(bundle, facts=facts)
    assert info.value.code == code


def test_check_command_runs_checks_without_loading(bundle):
    ok = CliRunner().invoke(runtime_cli, ["check", str(bundle), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.output)["ok"] is True
    tampered_canary(bundle)  # only loading can find this one
    assert CliRunner().invoke(runtime_cli, ["check", str(bundle)]).exit_code == 0


def test_failed_loads_do_not_leak(bundle):
    tampered_canary(bundle)

    def fail_once():
        with pytest.raises(Refusal):
            Engine.load(bundle, facts=ROOMY_CPU)
        gc.collect()

    tracemalloc.start()
    fail_once()
    baseline = tracemalloc.get_traced_memory()[0]
    for _ in range(15):
        fail_once()
    grown = tracemalloc.get_traced_memory()[0] - baseline
    tracemalloc.stop()
    assert grown < 256 * 1024, f"{grown} bytes kept after 15 failed loads"


def test_good_bundle_loads_and_answers(bundle):
    engine = Engine.load(bundle, facts=ROOMY_CPU)
    (result,) = engine.run(["Book a flight to Paris"])
    assert result.finish == "done" and 1 <= len(result.tools) <= engine.grammar.max_tools
    out = CliRunner().invoke(runtime_cli, ["run", str(bundle), "Book a flight to Paris", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["results"][0]["tools"] == result.tools
