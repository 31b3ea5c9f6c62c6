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
from numba.extending import intrinsic, overload

from . import attention_ir as air, simd_ir as ir_
from .fast_kernels import _bf16, _exp
from .linear_kernels import LANES, _addr, bf16_1x1, bf16_1x4, f32_1x1, f32_1x4


def _axpy(fmt: str):
    """An intrinsic axpy(p, v_addr, o_addr, nblocks): o[:16 nblocks] += p * v (v bf16 bits or f32 by ``fmt``)."""
    @intrinsic
    def axpy(typingctx, p, v, o, nblocks):
        def codegen(context, builder, signature, args):
            p, v, o, nb = args
            decode = ir_.decode_bf16(v) if fmt == "bf16" else ir_.decode_f32(v)
            ir_.emit_axpy(builder, nb, p, o, decode)
            return context.get_dummy_value()
        return types.void(types.float32, types.int64, types.int64, types.int64), codegen
    return axpy


axpy_bf16, axpy_f32 = _axpy("bf16"), _axpy("f32")


def _run(kind: str, fmt: str, nblocks: int):
    """An intrinsic f(a, rows, stride, n, b) over a run of n <= 16 positions (rows ``stride`` bytes apart):
    scores: a = q, b = s (air.emit_scores); pv: a = p, b = o (air.emit_pv)."""
    decode = air.decode_row_bf16 if fmt == "bf16" else air.decode_row_f32
    emit = air.emit_scores if kind == "scores" else air.emit_pv

    @intrinsic
    def run(typingctx, a, rows, stride, n, b):
        def codegen(context, builder, signature, args):
            emit(builder, nblocks, args[0], args[1], args[2], args[3], args[4], decode)
            return context.get_dummy_value()
        return types.void(types.int64, types.int64, types.int64, types.int64, types.int64), codegen
    return run


RUN_BLOCKS = (4, 8)  # head_dim 64 and 128 take the runs' path
scores_bf16_4, scores_bf16_8 = _run("scores", "bf16", 4), _run("scores", "bf16", 8)
scores_f32_4, scores_f32_8 = _run("scores", "f32", 4), _run("scores", "f32", 8)
pv_bf16_4, pv_bf16_8 = _run("pv", "bf16", 4), _run("pv", "bf16", 8)
pv_f32_4, pv_f32_8 = _run("pv", "f32", 4), _run("pv", "f32", 8)


@njit(inline="always")
def _scores_run(bf16, nb, qa, ka, stride, n, sa):
    if bf16:
        if nb == 4:
            scores_bf16_4(qa, ka, stride, n, sa)
        else:
            scores_bf16_8(qa, ka, stride, n, sa)
    elif nb == 4:
        scores_f32_4(qa, ka, stride, n, sa)
    else:
        scores_f32_8(qa, ka, stride, n, sa)


@njit(inline="always")
def _pv_run(bf16, nb, pa, va, stride, n, oa):
    if bf16:
        if nb == 4:
            pv_bf16_4(pa, va, stride, n, oa)
        else:
            pv_bf16_8(pa, va, stride, n, oa)
    elif nb == 4:
        pv_f32_4(pa, va, stride, n, oa)
    else:
        pv_f32_8(pa, va, stride, n, oa)


def _to_f32(v):
    """A K/V pool element as float32: bf16 pools are passed as their u16 bits, fp32 pools as is."""
    raise NotImplementedError  # numba only, see the overload below


@overload(_to_f32, inline="always")
def _to_f32_numba(v):
    if isinstance(v, types.Integer):
        return lambda v: _bf16(v)
    return lambda v: np.float32(v)


@njit(inline="always")
def _qk(bf16, qa, ka, kstride, nb, dst, four):
    """1 or 4 (``four``) dot products of q (f32 at qa) with K rows at ka, ka + kstride, ... into dst."""
    if bf16:
        if four:
            bf16_1x4(qa, 0, ka, kstride, 0, 0, 0, nb, dst, 0)
        else:
            bf16_1x1(qa, 0, ka, kstride, 0, 0, 0, nb, dst, 0)
    elif four:
        f32_1x4(qa, 0, ka, kstride, 0, 0, 0, nb, dst, 0)
    else:
        f32_1x1(qa, 0, ka, kstride, 0, 0, 0, nb, dst, 0)


@njit(parallel=True, nogil=True, cache=True)
def attention(q, kpool, vpool, block_table, slots, positions, scale, scores, out, runs=True):
    """q (T, heads, head_dim) f32; kpool/vpool (pages, page_size, kv_heads, head_dim) u16 (bf16 bits) or
    f32; block_table (max_seqs, pages_per_seq); scores (T, heads, max_ctx) f32 scratch;
    out (T, heads * head_dim) f32. ``runs=False`` forces the tiles' path (the tests compare the two)."""
    t_rows, heads, hd = q.shape
    kv_heads = kpool.shape[2]
    page_size = kpool.shape[1]
    group = heads // kv_heads
    assert q.strides[2] == 4 and scores.strides[2] == 4 and out.strides[1] == 4
    assert kpool.strides[3] == kpool.itemsize and vpool.strides[3] == vpool.itemsize and kpool.dtype == vpool.dtype
    bf16 = kpool.itemsize == 2
    nb = hd // LANES
    runs = runs and hd % LANES == 0 and (nb == 4 or nb == 8)  # RUN_BLOCKS
    row_bytes = np.int64(kpool.strides[1])  # one position to the next within a page
    for th in prange(t_rows * heads):
        t = th // heads
        h = th % heads
        kvh = h // group
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
            _scores_run(bf16, nb, qa, ka, row_bytes, n, sa + 4 * j)
            j += n
        while j < length:
            page = block_table[slot, j // page_size]
            off = j % page_size
            ka = ka0 + page * np.int64(kpool.strides[0]) + off * row_bytes + kvh * np.int64(kpool.strides[2])
            four = off % 4 == 0 and off + 4 <= page_size and j + 4 <= length
            _qk(bf16, qa, ka, row_bytes, nb, sa + 4 * j, four)
            for r in range(4 if four else 1):
                acc = s[j + r]
                for d in range(nb * LANES, hd):  # head_dim % 16: the tail in order
                    acc = acc + qv[d] * _to_f32(kpool[page, off + r, kvh, d])
                s[j + r] = acc
            j += 4 if four else 1
        m = np.float32(-np.inf)
        for j in range(length):
            sj = s[j] * scale
            s[j] = sj
            if sj > m:
                m = sj
        for j in range(length):  # vectorized
            s[j] = _exp(s[j] - m)
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
            _pv_run(bf16, nb, sa + 4 * j, va, np.int64(vpool.strides[1]), n, oa)
            j += n
        done = j
        for j in range(done, length):
            page = block_table[slot, j // page_size]
            off = j % page_size
            va = (va0 + page * np.int64(vpool.strides[0]) + off * np.int64(vpool.strides[1])
                  + kvh * np.int64(vpool.strides[2]))
            p = s[j]
            if bf16:
                axpy_bf16(p, va, oa, nb)
            else:
                axpy_f32(p, va, oa, nb)
            for d in range(nb * LANES, hd):
                o[d] += p * _to_f32(vpool[page, off, kvh, d])
        for d in range(hd):
            o[d] = o[d] / total
