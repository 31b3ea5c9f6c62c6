"""mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 on a warp's fragments.

Fragment layouts (PTX ISA "Matrix Fragments for mma.m16n8k16 with floating point type"; the same as
CuTe's SM80_16x8x16_F32BF16BF16F32_TN traits, tests/test_sim_mma_layout.py checks both), per lane with
g = lane >> 2, t = lane % 4, element j = 2 * register + half (half 0 = the register's low 16 bits):
A (16 x 16, M x K) a0..a3: row g (+8 in a1, a3), column 2t + half (+8 in a2, a3);
B (16 x 8, K x N) b0..b1: k 2t + half (+8 in b1), column g; C / D (16 x 8) c0..c3: row g (+8 in c2, c3),
column 2t + (j & 1).
The tensor core's summation order is not specified by PTX: the model is exact products (bf16 x bf16 is exact
in f64) summed in f64 with c, rounded once to f32; tests against a card use a tolerance.
"""
from __future__ import annotations

import numpy as np

from toolcall.kernels.sim.errors import SimUnsupported
from toolcall.kernels.sim.numerics import F32, F64, bf16_bits_to_f32, canonical_f32

_LANE = np.arange(32)
_G, _T = _LANE >> 2, _LANE & 3  # groupID, threadID_in_group
_J8, _J4 = np.arange(8), np.arange(4)
A_MAP = np.stack(np.broadcast_arrays(_G[:, None] + 8 * ((_J8 >> 1) & 1),
                                     2 * _T[:, None] + (_J8 & 1) + 8 * (_J8 >> 2)), axis=-1)  # (32, 8, 2)
B_MAP = np.stack(np.broadcast_arrays(2 * _T[:, None] + (_J4 & 1) + 8 * (_J4 >> 1),
                                     np.broadcast_to(_G[:, None], (32, 4))), axis=-1)  # (32, 4, 2)
C_MAP = np.stack(np.broadcast_arrays(_G[:, None] + 8 * (_J4 >> 1), 2 * _T[:, None] + (_J4 & 1)), axis=-1)
U32 = np.dtype(np.uint32)
MMA_OP = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"


def _halves(regs: list[np.ndarray]) -> np.ndarray:
    """[W, 32, 2 * len(regs)] float64 values of bf16 pairs, element j = 2 * register + half."""
    bits = np.stack(regs, axis=-1).astype(U32)  # [W, 32, R]
    lo, hi = bits & 0xFFFF, bits >> 16
    pairs = np.stack([lo, hi], axis=-1).reshape(*bits.shape[:2], -1)
    return bf16_bits_to_f32(pairs.astype(np.uint16)).astype(F64)


def warp_mma(a_regs, b_regs, c_regs) -> list[np.ndarray]:
    """D = A B + C for W warps at once: a_regs 4 x [W, 32] uint32, b_regs 2 x [W, 32], c_regs 4 x [W, 32] float32;
    returns d0..d3, each [W, 32] float32."""
    W = a_regs[0].shape[0]
    A = np.zeros((W, 16, 16), F64)
    B = np.zeros((W, 16, 8), F64)
    C = np.zeros((W, 16, 8), F64)
    A[:, A_MAP[..., 0], A_MAP[..., 1]] = _halves(a_regs)
    B[:, B_MAP[..., 0], B_MAP[..., 1]] = _halves(b_regs)
    C[:, C_MAP[..., 0], C_MAP[..., 1]] = np.stack(c_regs, axis=-1).astype(F32).astype(F64)
    with np.errstate(all="ignore"):
        D = canonical_f32((A @ B + C).astype(F32))
    out = D[:, C_MAP[..., 0], C_MAP[..., 1]]  # [W, 32, 4]
    return [out[..., j] for j in range(4)]


def build_mma(ins, P):
    if ins.op != MMA_OP:
        raise SimUnsupported(f"{ins.op} is not in the executor's instruction table (only {MMA_OP})")
    d, a, b, c = ins.operands
    gets_a = [P.reader(r, U32) for r in a[1]]
    gets_b = [P.reader(r, U32) for r in b[1]]
    gets_c = [P.reader(r, F32) for r in c[1]]
    puts = [P.writer(r, F32) for r in d[1]]

    def mma(S, ix):
        lanes = S.warp_lanes(ix, "mma.sync")  # [W, 32] lane indices of whole warps, in lane order
        flat = lanes.reshape(-1)
        A = [g(S, flat).reshape(lanes.shape) for g in gets_a]
        B = [g(S, flat).reshape(lanes.shape) for g in gets_b]
        C = [np.broadcast_to(g(S, flat), flat.shape).reshape(lanes.shape) for g in gets_c]
        for put, value in zip(puts, warp_mma(A, B, C)):
            put(S, flat, value.reshape(-1))
    return mma
