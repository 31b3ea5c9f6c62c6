"""The twelve bit-identity gates (bench/bit_gates.py) on the CPU backend, which keeps a row's bits whatever
shares its step: all pass; and an engine whose logits depend on the batch fails the batch gates (the gates can
fail)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bit_gates  # noqa: E402

from toolcall.runtime.engine import Engine  # noqa: E402


@pytest.fixture
def engine(shipped_bundle):
    e = Engine.load(shipped_bundle)
    yield e
    e.close()


def test_every_gate_holds_on_the_cpu(engine):
    gates = bit_gates.Gates(engine).run()
    assert tuple(gates) == bit_gates.GATES and len(gates) == 12
    assert {name: g for name, g in gates.items() if not g["passed"]} == {}
    lim = engine.contract.limits
    assert engine.generator.kv.free_slots == lim.max_sequences  # every gate gave its pages back


def test_a_batch_dependent_engine_fails_the_batch_gates(engine, monkeypatch):
    """Logits nudged by the step's row count (as a kernel whose reduction depends on the batch would): the row's
    bits alone differ from its bits in company."""
    model = engine.generator.model
    sparse = model.sparse_logits
    monkeypatch.setattr(model, "sparse_logits", lambda hidden, cand: sparse(hidden, cand) + 1e-6 * (len(hidden) - 1))
    gates = bit_gates.Gates(engine).run()
    for name in ("batch_2", "batch_8", "batch_64", "batch_256", "shuffled_a", "neighbours_cancelled"):
        assert not gates[name]["passed"] and "logit bits differ" in gates[name]["why"], (name, gates[name])
