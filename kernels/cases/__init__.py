"""The kernels' parity cases, one module per family, shared by the GPU tests (tests/test_kernels_gpu*.py) and the
executor's CLI (``python -m toolcall.kernels.sim test``). A case runs a kernel's launches through a KernelRunner
(a real GPU, the PTX executor, or a dry run) and asserts against the numpy references in kernels/reference*.py.

Families: rows (matvec, fusions, rows, rope_kv), attention, linear (both kernel families over batch sizes),
grammar_loop (grammar_candidates -> head_gather -> grammar_advance, host-stepped), draw (sample_draw). ``ci``
marks the subset the executor's CI runs: every ``extern "C" __global__`` entry point, at small shapes."""
from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KernelCase:
    id: str  # the pytest id, e.g. "attention-(16, 8, 128)"
    run: Callable  # run(runner: KernelRunner, rng: np.random.Generator, *spec) -> None; AssertionError on a mismatch
    spec: tuple  # the case's parameters; its rng is case_rng(spec)
    ci: bool = False  # in the executor's CI table

    def __repr__(self) -> str:  # what pytest and the CLI print
        return self.id


def case_rng(spec: tuple) -> np.random.Generator:
    """A case's random inputs, seeded by its spec (so a case's inputs do not depend on the table around it)."""
    return np.random.default_rng(zlib.crc32(repr(spec).encode()))


def all_cases() -> list[KernelCase]:
    """Every family's table: rows, attention, linear, grammar_loop, draw (ids unique)."""
    from toolcall.kernels.cases import attention, draw, grammar_loop, linear, rows  # they import KernelCase
    cases = [*rows.CASES, *attention.CASES, *linear.CASES, *grammar_loop.CASES, *draw.CASES]
    assert len({c.id for c in cases}) == len(cases), "case ids collide"
    return cases


def run_case(runner, case: KernelCase) -> None:
    """``case`` on ``runner`` (a KernelRunner), its rng seeded by its spec."""
    case.run(runner, case_rng(case.spec), *case.spec)
