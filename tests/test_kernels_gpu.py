"""Per-kernel GPU parity with kernels/reference.py, table-driven, plus the bit-exactness the
runtime relies on: batch-independence, fused == unfused, dense head == sparse head, and sample_draw's
picks bit for bit. The cases live in the package (toolcall.kernels.cases: rows, draw here; attention:
tests/test_kernels_gpu_attention.py; the linear layers over batch sizes: tests/test_kernels_gpu_linear.py;
the grammar loop: tests/test_kernels_gpu_loop.py), so the PTX executor's CLI runs the same ones.

Without a GPU the parity tests skip with the reason; ``test_cases_pack_their_arguments``
still runs every case on a dry-run device, so argument names and kinds are checked on CPU.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from toolcall.common.formats import FP8_E4M3
from toolcall.kernels.cases import KernelCase, draw, rows, run_case
from toolcall.kernels.declarations import Launch
from toolcall.kernels.geometry import matvec_kernel
from toolcall.kernels.runner import DryRunGpu, KernelRunner

CASES = rows.CASES + draw.CASES


def params(cases: list[KernelCase]) -> list:
    """pytest parameters of a case table, by the cases' ids."""
    return [pytest.param(c, id=c.id) for c in cases]


def pack_case(case: KernelCase) -> None:
    """A table case on a dry-run device: every launch names its kernel's parameters (each once) with the right
    kinds (the CPU's check of a GPU case)."""
    dry = KernelRunner(DryRunGpu())
    case.run(dry, np.random.default_rng(0), *case.spec)
    assert dry.gpu.launches


@pytest.mark.gpu
@pytest.mark.parametrize("case", params(CASES))
def test_kernel_parity(dev, case):
    run_case(dev, case)


@pytest.mark.parametrize("case", params(CASES))
def test_cases_pack_their_arguments(case):
    pack_case(case)


GOOD = dict(x=None, x_stride=4, w=None, w_scale=None, bias=None, y=None, T=1, n_in=16, n_out=16, accumulate=0)


@pytest.mark.parametrize("change,message", [
    (dict(w_scale=...), "fp8_e4m3_matvec: missing argument(s) 'w_scale'"),
    (dict(global_scale=None), "fp8_e4m3_matvec: no parameter(s) named 'global_scale'"),
    (dict(x_stride=1.5), "'x_stride' is an integer"),
    (dict(accumulate=2**31), "accumulate = 2147483648 does not fit in int32"),
    (dict(w=3.0), "'w' is a device pointer"),
])
def test_launcher_refuses_bad_arguments_by_name(change, message):
    """A missing or unknown name, or a value of the wrong kind, fails on the host naming kernel and parameter,
    at the Launch (names) or at packing (kinds)."""
    dry = KernelRunner(DryRunGpu())
    args = {k: v for k, v in {**GOOD, **change}.items() if v is not ...}
    with pytest.raises(TypeError, match=re.escape(message)):
        dry.launch(Launch(matvec_kernel(FP8_E4M3), args))
