"""numba linear layers on the high-precision formats (bf16 bits, float32) over weight rows: the head, dense
(``linear_rows``) and sparse (``candidate_logits``).

The same tiles and order as runtime/cpu/linear_kernels.py (see there and runtime/cpu/simd_ir.py):
a row's bits do not depend on the step's other rows, and the sparse head's logits are bit-equal
to the dense head's (the same 1x1 dot product of one hidden row and one head row). Each kernel
compiles once per weight dtype (uint16 bf16 bits, float32).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from toolcall.runtime.cpu.linear_kernels import ITEM, LANES, _addr, group, tile_1x1, to_f32


@njit(parallel=True, nogil=True, cache=True)
def linear_rows(x, w, y):
    """x (T, in) f32, w (out, in) u16 (bf16 bits) or f32 -> y (T, out) f32."""
    t_rows, n = x.shape
    out = w.shape[0]
    assert w.shape[1] == n and x.strides[1] == 4 and y.strides[1] == 4 and w.strides[1] == w.itemsize
    nb, xs, ys, ws = n // LANES, np.int64(x.strides[0]), np.int64(y.strides[0]), np.int64(w.strides[0])
    xa, ya, wa = _addr(x), _addr(y), _addr(w)
    for g in prange((out + ITEM - 1) // ITEM):
        o = g * ITEM
        cols = min(ITEM, out - o)
        group(w, False, xa, xs, wa + o * ws, ws, 0, 0, 0, nb, ya, ys, t_rows, o, cols)
        if nb * LANES < n:
            for p in range(cols):
                for t in range(t_rows):
                    acc = y[t, o + p]
                    for i in range(nb * LANES, n):
                        acc = acc + x[t, i] * to_f32(w[o + p, i])
                    y[t, o + p] = acc


# The sparse head runs serially on the calling thread (the engine thread, between steps): its work is
# rows x candidates x hidden (26 x 26 x 192 multiply-adds a lane step of the tool model: 8-9 us), less
# than a parallel launch costs once other threads hold the cores (the launch waits for its slowest
# chunk's thread: with two busy processes beside it, 77 us a call parallel against 8 us serial).
@njit(nogil=True, cache=True)
def candidate_logits(hidden, w, cand, out):
    """out[t, k] = row cand[t, k] of linear_rows(hidden, w) (the sparse head), bit-equal to it."""
    t_rows, n = hidden.shape
    assert w.shape[1] == n and hidden.strides[1] == 4 and out.strides[1] == 4 and w.strides[1] == w.itemsize
    assert cand.size == 0 or (cand.min() >= 0 and cand.max() < w.shape[0])  # rows are read by address
    nb, ha, oa, wa0 = n // LANES, _addr(hidden), _addr(out), _addr(w)
    for t in range(t_rows):
        for k in range(cand.shape[1]):
            row = cand[t, k]
            dst = oa + t * np.int64(out.strides[0]) + 4 * k
            src = wa0 + row * np.int64(w.strides[0])
            tile_1x1(w, False, ha + t * np.int64(hidden.strides[0]), 0, src, 0, 0, 0, 0, nb, dst, 0)
            acc = out[t, k]
            for i in range(nb * LANES, n):
                acc = acc + hidden[t, i] * to_f32(w[row, i])
            out[t, k] = acc
