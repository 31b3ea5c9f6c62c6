"""Paged grouped-query attention of the fast CPU backend (numba), each row over its own sequence.

Per (row, head): s_j = (q . k_j) * scale for j <= pos, each q . k_j in the order of the linear
layers' 1x1 tile (runtime/cpu/simd_ir.py), softmax with its max subtracted and a sequential sum,
o = sum_j p_j v_j in order (one fma per element and position), then / sum. Positions go in runs of
up to 16 within a page: with head_dim 64 or 128 a run's 16 dot products reduce their lanes together
and o stays in registers over the run (runtime/cpu/attention_ir.py); other head dims take 1x4/1x1
tiles and one axpy per position. Both give the same bits (tests/test_cpu_attention.py).
Rows only read the pool: a row's result does not depend on the step's other rows.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic
from numba.np.numpy_support import as_dtype

from toolcall.runtime.cpu import attention_ir as air
from toolcall.runtime.cpu import simd_ir as ir_
from toolcall.runtime.cpu.linear_kernels import LANES, _addr, tile_1x1, tile_1x4, to_f32
from toolcall.runtime.jit.exp32 import exp32


@intrinsic
def axpy(typingctx, pool, p, v, o, nblocks):
    """o[:16 nblocks] += p * v (f32 at o; v at address v in the element format of ``pool``'s dtype, read for its
    type only: u16 bf16 bits or f32)."""
    decoder = ir_.ELEMENT_DECODERS.get(as_dtype(pool.dtype))
    if decoder is None:
        return None

    def codegen(context, builder, signature, args):
        _, p, v, o, nb = args
        ir_.emit_axpy(builder, nb, p, o, decoder(v))
        return context.get_dummy_value()
    return types.void(pool, types.float32, types.int64, types.int64, types.int64), codegen


RUN_BLOCKS = (4, 8)  # head_dim 64 and 128 take the runs' path


def _run(emit):
    """An intrinsic f(pool, nblocks, a, rows, stride, n, b) over a run of n <= 16 positions (rows ``stride`` bytes
    apart, in the element format of ``pool``'s dtype, read for its type only), for nblocks in RUN_BLOCKS (a
    switch; another computes nothing): air.emit_scores (a = q, b = s) or air.emit_pv (a = p, b = o)."""
    @intrinsic
    def run(typingctx, pool, nblocks, a, rows, stride, n, b):
        decoder = ir_.ELEMENT_DECODERS.get(as_dtype(pool.dtype))
        if decoder is None:
            return None

        def codegen(context, builder, signature, args):
            _, nb, a, rows, stride, n, b = args
            ir_.emit_switch(builder, nb, [(blocks, blocks) for blocks in RUN_BLOCKS],
                            lambda blocks: emit(builder, blocks, a, rows, stride, n, b, air.row_blocks(decoder)))
            return context.get_dummy_value()
        return types.void(pool, *([types.int64] * 6)), codegen
    return run


scores_run, pv_run = _run(air.emit_scores), _run(air.emit_pv)


@njit(parallel=True, nogil=True, cache=True)
def attention(q, kpool, vpool, block_table, slots, positions, scale, scores, out, k_mult, v_mult, runs=True):
    """q (T, heads, head_dim) f32; kpool/vpool (pages, page_size, kv_heads, head_dim) u16 (bf16 bits), int8
    (E4M3 codes, decoded as e4m3 / 256) or f32; block_table (max_seqs, pages_per_seq); scores (T, heads,
    max_ctx) f32 scratch; out (T, heads * head_dim) f32. k_mult, v_mult (kv_heads,) f32: what a decoded K
    and V element is multiplied by (1 for bf16 and f32, 256 * scale for E4M3), applied to each score and
    to each output row once. ``runs=False`` forces the tiles' path (the tests compare the two)."""
    t_rows, heads, hd = q.shape
    kv_heads = kpool.shape[2]
    page_size = kpool.shape[1]
    group = heads // kv_heads
    assert q.strides[2] == 4 and scores.strides[2] == 4 and out.strides[1] == 4
    assert kpool.strides[3] == kpool.itemsize and vpool.strides[3] == vpool.itemsize and kpool.dtype == vpool.dtype
    nb = hd // LANES
    runs = runs and hd % LANES == 0 and (nb == 4 or nb == 8)  # RUN_BLOCKS
    row_bytes = np.int64(kpool.strides[1])  # one position to the next within a page
    for th in prange(t_rows * heads):
        t = th // heads
        h = th % heads
        kvh = h // group
        score_scale = scale * k_mult[kvh]
        slot = slots[t]
        length = positions[t] + 1
        qv = q[t, h]
        s = scores[t, h]
        qa, sa, ka0 = _addr(q) + t * np.int64(q.strides[0]) + h * np.int64(q.strides[1]), _addr(s), _addr(kpool)
        j = 0
        while runs and j < length:
            page = block_table[slot, j // page_size]
            off = j % page_size
            n = min(air.RUN, page_size - off, length - j)
            ka = ka0 + page * np.int64(kpool.strides[0]) + off * row_bytes + kvh * np.int64(kpool.strides[2])
            scores_run(kpool, nb, qa, ka, row_bytes, n, sa + 4 * j)
            j += n
        while j < length:
            page = block_table[slot, j // page_size]
            off = j % page_size
            ka = ka0 + page * np.int64(kpool.strides[0]) + off * row_bytes + kvh * np.int64(kpool.strides[2])
            four = off % 4 == 0 and off + 4 <= page_size and j + 4 <= length
            if four:  # 4 dot products of q with K rows ka, ka + row_bytes, ...
                tile_1x4(kpool, False, qa, 0, ka, row_bytes, 0, 0, 0, nb, sa + 4 * j, 0)
            else:
                tile_1x1(kpool, False, qa, 0, ka, row_bytes, 0, 0, 0, nb, sa + 4 * j, 0)
            for r in range(4 if four else 1):
                acc = s[j + r]
                for d in range(nb * LANES, hd):  # head_dim % 16: the tail in order
                    acc = acc + qv[d] * to_f32(kpool[page, off + r, kvh, d])
                s[j + r] = acc
            j += 4 if four else 1
        m = np.float32(-np.inf)
        for j in range(length):
            sj = s[j] * score_scale
            s[j] = sj
            if sj > m:
                m = sj
        for j in range(length):  # vectorized
            s[j] = exp32(s[j] - m)
        total = np.float32(0.0)
        for j in range(length):  # the sum in order
            total += s[j]
        o = out[t, h * hd:(h + 1) * hd]
        for d in range(hd):
            o[d] = np.float32(0.0)
        oa, va0 = _addr(o), _addr(vpool)
        j = 0
        while runs and j < length:
            page = block_table[slot, j // page_size]
            off = j % page_size
            n = min(air.RUN, page_size - off, length - j)
            va = (va0 + page * np.int64(vpool.strides[0]) + off * np.int64(vpool.strides[1])
                  + kvh * np.int64(vpool.strides[2]))
            pv_run(vpool, nb, sa + 4 * j, va, np.int64(vpool.strides[1]), n, oa)
            j += n
        done = j
        for j in range(done, length):
            page = block_table[slot, j // page_size]
            off = j % page_size
            va = (va0 + page * np.int64(vpool.strides[0]) + off * np.int64(vpool.strides[1])
                  + kvh * np.int64(vpool.strides[2]))
            p = s[j]
            axpy(vpool, p, va, oa, nb)
            for d in range(nb * LANES, hd):
                o[d] += p * to_f32(vpool[page, off, kvh, d])
        for d in range(hd):
            o[d] = (o[d] * v_mult[kvh]) / total
