"""numba linear layers on the high-precision formats (bf16 bits, float32) and the sparse head.

The same tiles and order as runtime/cpu/linear_kernels.py (see there and runtime/cpu/simd_ir.py):
a row's bits do not depend on the step's other rows, and the sparse head's logits are bit-equal
to the dense head's (the same 1x1 dot product of one hidden row and one head row).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .linear_kernels import (GROUP, ITEM, LANES, _addr, _bf16, bf16_1x1, bf16_1x4, bf16_2x2, bf16_4x1, bf16_6x1,
                             f32_1x1, f32_1x4, f32_2x2, f32_4x1, f32_6x1)


@njit(inline="always")
def _bf16_group(xa, xs, wa, ws, nb, ya, ys, t_rows, o, cols):
    t = 0
    while t + 6 <= t_rows:
        for p in range(cols):
            bf16_6x1(xa + t * xs, xs, wa + p * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + p), ys)
        t += 6
    if t + 4 <= t_rows:
        for p in range(cols):
            bf16_4x1(xa + t * xs, xs, wa + p * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + p), ys)
        t += 4
    while t < t_rows:  # the last rows: 2x2 or 1x4 tiles per 4 weight rows, 1x1 for the ragged rest
        step = 2 if t + 2 <= t_rows else 1
        for h in range(0, cols - cols % GROUP, GROUP):
            if step == 2:
                bf16_2x2(xa + t * xs, xs, wa + h * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + h), ys)
                bf16_2x2(xa + t * xs, xs, wa + (h + 2) * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + h + 2), ys)
            else:
                bf16_1x4(xa + t * xs, xs, wa + h * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + h), ys)
        for r in range(step):
            for p in range(cols - cols % GROUP, cols):
                bf16_1x1(xa + (t + r) * xs, xs, wa + p * ws, ws, 0, 0, 0, nb, ya + (t + r) * ys + 4 * (o + p), ys)
        t += step


@njit(parallel=True, nogil=True, cache=True)
def linear_bf16(x, wbits, y):
    """x (T, in) f32, wbits (out, in) u16 (bf16 bits) -> y (T, out) f32."""
    t_rows, n = x.shape
    out = wbits.shape[0]
    assert wbits.shape[1] == n and x.strides[1] == 4 and y.strides[1] == 4 and wbits.strides[1] == 2
    nb, xs, ys, ws = n // LANES, np.int64(x.strides[0]), np.int64(y.strides[0]), np.int64(wbits.strides[0])
    xa, ya, wa = _addr(x), _addr(y), _addr(wbits)
    for g in prange((out + ITEM - 1) // ITEM):
        o = g * ITEM
        cols = min(ITEM, out - o)
        _bf16_group(xa, xs, wa + o * ws, ws, nb, ya, ys, t_rows, o, cols)
        if nb * LANES < n:
            for p in range(cols):
                for t in range(t_rows):
                    acc = y[t, o + p]
                    for i in range(nb * LANES, n):
                        acc = acc + x[t, i] * _bf16(wbits[o + p, i])
                    y[t, o + p] = acc


@njit(inline="always")
def _f32_group(xa, xs, wa, ws, nb, ya, ys, t_rows, o, cols):
    t = 0
    while t + 6 <= t_rows:
        for p in range(cols):
            f32_6x1(xa + t * xs, xs, wa + p * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + p), ys)
        t += 6
    if t + 4 <= t_rows:
        for p in range(cols):
            f32_4x1(xa + t * xs, xs, wa + p * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + p), ys)
        t += 4
    while t < t_rows:  # the last rows: 2x2 or 1x4 tiles per 4 weight rows, 1x1 for the ragged rest
        step = 2 if t + 2 <= t_rows else 1
        for h in range(0, cols - cols % GROUP, GROUP):
            if step == 2:
                f32_2x2(xa + t * xs, xs, wa + h * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + h), ys)
                f32_2x2(xa + t * xs, xs, wa + (h + 2) * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + h + 2), ys)
            else:
                f32_1x4(xa + t * xs, xs, wa + h * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + h), ys)
        for r in range(step):
            for p in range(cols - cols % GROUP, cols):
                f32_1x1(xa + (t + r) * xs, xs, wa + p * ws, ws, 0, 0, 0, nb, ya + (t + r) * ys + 4 * (o + p), ys)
        t += step


@njit(parallel=True, nogil=True, cache=True)
def linear_f32(x, w, y):
    """x (T, in) f32, w (out, in) f32 -> y (T, out) f32."""
    t_rows, n = x.shape
    out = w.shape[0]
    assert w.shape[1] == n and x.strides[1] == 4 and y.strides[1] == 4 and w.strides[1] == 4
    nb, xs, ys, ws = n // LANES, np.int64(x.strides[0]), np.int64(y.strides[0]), np.int64(w.strides[0])
    xa, ya, wa = _addr(x), _addr(y), _addr(w)
    for g in prange((out + ITEM - 1) // ITEM):
        o = g * ITEM
        cols = min(ITEM, out - o)
        _f32_group(xa, xs, wa + o * ws, ws, nb, ya, ys, t_rows, o, cols)
        if nb * LANES < n:
            for p in range(cols):
                for t in range(t_rows):
                    acc = y[t, o + p]
                    for i in range(nb * LANES, n):
                        acc = acc + x[t, i] * w[o + p, i]
                    y[t, o + p] = acc


# The sparse head runs serially on the calling thread (the engine thread, between steps): its work is
# rows x candidates x hidden (26 x 26 x 192 multiply-adds a lane step of the tool model: 8-9 us), less
# than a parallel launch costs once other threads hold the cores (the launch waits for its slowest
# chunk's thread: with two busy processes beside it, 77 us a call parallel against 8 us serial).
@njit(nogil=True, cache=True)
def candidate_logits_bf16(hidden, wbits, cand, out):
    """out[t, k] = row cand[t, k] of linear_bf16(hidden, wbits) (the sparse head), bit-equal to it."""
    t_rows, n = hidden.shape
    assert wbits.shape[1] == n and hidden.strides[1] == 4 and out.strides[1] == 4 and wbits.strides[1] == 2
    assert cand.size == 0 or (cand.min() >= 0 and cand.max() < wbits.shape[0])  # rows are read by address
    nb, ha, oa, wa0 = n // LANES, _addr(hidden), _addr(out), _addr(wbits)
    for t in range(t_rows):
        for k in range(cand.shape[1]):
            row = cand[t, k]
            dst = oa + t * np.int64(out.strides[0]) + 4 * k
            src = wa0 + row * np.int64(wbits.strides[0])
            bf16_1x1(ha + t * np.int64(hidden.strides[0]), 0, src, 0, 0, 0, 0, nb, dst, 0)
            acc = out[t, k]
            for i in range(nb * LANES, n):
                acc = acc + hidden[t, i] * _bf16(wbits[row, i])
            out[t, k] = acc


@njit(nogil=True, cache=True)
def candidate_logits_f32(hidden, w, cand, out):
    t_rows, n = hidden.shape
    assert w.shape[1] == n and hidden.strides[1] == 4 and out.strides[1] == 4 and w.strides[1] == 4
    assert cand.size == 0 or (cand.min() >= 0 and cand.max() < w.shape[0])
    nb, ha, oa, wa0 = n // LANES, _addr(hidden), _addr(out), _addr(w)
    for t in range(t_rows):
        for k in range(cand.shape[1]):
            row = cand[t, k]
            dst = oa + t * np.int64(out.strides[0]) + 4 * k
            src = wa0 + row * np.int64(w.strides[0])
            f32_1x1(ha + t * np.int64(hidden.strides[0]), 0, src, 0, 0, 0, 0, nb, dst, 0)
            acc = out[t, k]
            for i in range(nb * LANES, n):
                acc = acc + hidden[t, i] * w[row, i]
            out[t, k] = acc
