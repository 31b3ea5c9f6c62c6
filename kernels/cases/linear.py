"""The linear-layer kernels of both families (kernels/geometry.py KERNEL_FAMILIES: FMAs, mma.sync) over the batch
sizes a serving step takes, against kernels/reference.py, and the rule the serving step's bit gates rest on: a row's
output bits are the same alone and beside 1, 7, 63 or 255 other rows (for the mma family 63 and 255 cross into its
wide tiling), for every layer kind (plain, rmsnorm prologue, SwiGLU prologue) and every weight format."""
from __future__ import annotations

import numpy as np

from toolcall.common.formats import FP8_E4M3
from toolcall.kernels import reference as ref
from toolcall.kernels.cases import KernelCase
from toolcall.kernels.cases.inputs import EPS, WEIGHTS, bf16
from toolcall.kernels.geometry import KERNEL_FAMILIES, MATVEC_FORMATS, PLAIN, RMSNORM, SWIGLU, matvec_kernel
from toolcall.kernels.runner import KernelRunner, Out
from toolcall.kernels.weight_args import weight_args

ROWS = (1, 2, 15, 16, 17, 128, 512, 2048)  # the batch sizes of the linear-layer issue's reference table
BESIDE = (1, 7, 63, 255)  # other rows sharing the launch with the row under test
N_IN, N_OUT = 1024, 96


def inputs(rng, fmt, pro, T):
    x = rng.standard_normal((T, N_IN)).astype(np.float32)
    up = rng.standard_normal((T, N_IN)).astype(np.float32)
    norm_w = bf16(rng, N_IN)
    w, *scales = WEIGHTS[fmt](rng, N_OUT, N_IN)
    head = {PLAIN: dict(x=x), RMSNORM: dict(x=x, norm_w=norm_w, eps=EPS), SWIGLU: dict(gate=x, up=up)}[pro]
    ref_head = {PLAIN: (x,), RMSNORM: (x, norm_w, EPS), SWIGLU: (x, up)}[pro]
    return head, ref_head, dict(zip((a.param for a in weight_args(fmt)), (w, *scales))), (w, *scales)


def launch(d: KernelRunner, fn: str, head: dict, weights: dict, T: int) -> np.ndarray:
    return d.run(fn, **head, x_stride=N_IN, **weights, bias=None, y=Out(np.zeros((T, N_OUT), np.float32)), T=T,
                 n_in=N_IN, n_out=N_OUT, accumulate=0)["y"]


def case_rows(d: KernelRunner, rng, family, fmt, pro, T):
    """T rows against the reference (3e-5 of the products' magnitudes)."""
    head, ref_head, weights, stored = inputs(rng, fmt, pro, T)
    fn = matvec_kernel(fmt, pro, family)
    got = launch(d, fn, head, weights, T)
    want = ref.MATVEC_REFERENCES[fn](*ref_head, *stored, bias=None, y=np.zeros((T, N_OUT), np.float32),
                                     accumulate=False)
    xp = {PLAIN: lambda x: x, RMSNORM: ref.rmsnorm, SWIGLU: ref.swiglu}[pro](*ref_head)  # the matvec's input
    d.close(got, want, atol=3e-5 * (np.abs(xp) @ np.abs(ref.dequant(fmt, *stored)).T) + 1e-6,
            label=f"{fn} T={T}")


def case_beside(d: KernelRunner, rng, family, fmt, pro, others):
    """Row 0 alone, then first in a launch of 1 + ``others`` rows: the same bits."""
    head, _, weights, _ = inputs(rng, fmt, pro, 1 + others)
    fn = matvec_kernel(fmt, pro, family)
    alone = launch(d, fn, {k: (a[:1] if isinstance(a, np.ndarray) and a.ndim == 2 else a) for k, a in head.items()},
                   weights, 1)
    together = launch(d, fn, head, weights, 1 + others)
    d.same(together[:1], alone, f"{fn}: a row alone vs beside {others} others")




FAMILIES = tuple(KERNEL_FAMILIES.values())
PROLOGUES = (PLAIN, RMSNORM, SWIGLU)
CI_ROWS = {1, 2, 16, 17, 64}  # the plain fp8 layer of each family at the T; every format's at T = 16
CASES = ([KernelCase(f"{fam.name}-{f.name}{p}-T{T}", case_rows, (fam, f, p, T),
                     ci=(p == PLAIN and f is FP8_E4M3 and T in CI_ROWS) or (T == 16 and p in (PLAIN, SWIGLU)))
          for fam in FAMILIES for f in MATVEC_FORMATS for p in PROLOGUES
          for T in (ROWS + (64,) if p == PLAIN else (1, 16, 17, 512))]
         # beside 1 in CI: every linear entry point, with the alone-vs-beside bit rule
         + [KernelCase(f"{fam.name}-{f.name}{p}-beside{k}", case_beside, (fam, f, p, k), ci=k == 1)
            for fam in FAMILIES for f in MATVEC_FORMATS for p in PROLOGUES for k in BESIDE])
