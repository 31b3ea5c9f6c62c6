"""float32 bit casts and the float32 exp every numba kernel and the sampling draw use.

``exp32`` is built from IEEE float32 multiplies, adds, a floor and exponent bits only (no libm call, no
fused multiply-add: numba compiles without FMA contraction), so it gives the same bits on every CPU and
vectorizes in loops; a GPU kernel doing the same correctly rounded operations (no contraction) gets them too.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from toolcall.common import numba_target  # noqa: F401  (before any compile: the target every kernel is built for)


@intrinsic
def bits_to_f32(typingctx, bits):
    """int32 -> the float32 with those bits (a register bitcast)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def f32_to_bits(typingctx, value):
    """float32 -> the uint32 of its bits (a register bitcast)."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


LOG2E = np.float32(1.4426950408889634)
LN2_HI, LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln 2 = hi + lo, hi exact in 9 bits
EXP_LOW, EXP_HIGH = np.float32(-87.3), np.float32(88.3)  # the clamp: 2^n stays a normal float32


@njit(inline="always", cache=True)
def exp32(x):
    """exp(x) in float32 within 5 ulp on [-87.3, 88.3] (clamped to it outside), by mul/add and bits only, so
    LLVM vectorizes the loops calling it (math.exp is a scalar libm call per element: 9x slower in silu).
    x = n ln2 + r, |r| <= ln2/2; exp(r) by its degree-6 Taylor polynomial (error < 2e-7); 2^n by exponent bits."""
    x = EXP_LOW if x < EXP_LOW else x  # compare-selects and np.floor vectorize (min/max
    x = EXP_HIGH if x > EXP_HIGH else x  # and math.floor did not: silu 2x slower, the same bits)
    n = np.floor(x * LOG2E + np.float32(0.5))
    r = (x - n * LN2_HI) - n * LN2_LO
    p = np.float32(1.0 / 720)
    p = p * r + np.float32(1.0 / 120)
    p = p * r + np.float32(1.0 / 24)
    p = p * r + np.float32(1.0 / 6)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p * bits_to_f32((np.int32(n) + np.int32(127)) << 23)
