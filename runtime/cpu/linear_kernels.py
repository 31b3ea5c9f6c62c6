"""numba linear layers of the fast CPU backend on weight rows: y (T, out) = x (T, in) @ W.T for NVFP4
weights (``linear_nvfp4``), and the row tiles the other row kernels share (runtime/cpu/linear_high.py: the
head; runtime/cpu/attention_kernels.py: q.k). FP8, bf16 and f32 layer weights run on output panels
(runtime/cpu/panel_kernels.py).

Each output element is one dot product in the order runtime/cpu/simd_ir.py writes down (16-lane
blocks, four accumulators, explicit FMA, a fixed final tree), then the row's scalar tail
(in % 16 elements, in order), then the format's scale. Activation rows are taken in tiles of
6 or 4 rows against one weight row (the weight block decoded once per tile), the last rows in
2x2 and 1x4 tiles (one row against 4 weight rows). A row's operations are the same in any tile,
so a row's bits do not depend on what else shares the step. Threads split the output features
(prange, ITEM rows per item), never a sum.

A tile's element format is its weight array's dtype, chosen when numba types the call (``_tile``):
- uint8: NVFP4, packed codes [out, in/2], block scales E4M3 bytes [out, in/16], global f32:
  y = dot(x, e2m1 * block) * global (e2m1 * block is exact). Its decoders give a chunk's weights evens
  first (see simd_ir), so x is permuted to match once per call (``_even_then_odd``; rows of a multiple
  of 32 elements take the two-block path);
- uint16: bf16 bits [out, in]; float32 [out, in] (int8 E4M3 bytes decode too: simd_ir.ELEMENT_DECODERS).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic, overload
from numba.np.numpy_support import as_dtype

from toolcall.common.minifloat import E4M3_VALUES
from toolcall.common.nvfp4 import E2M1_VALUES
from toolcall.runtime.cpu import fast_kernels as fk  # first: it sets numba's compile target (common/numba_target.py)
from toolcall.runtime.cpu import simd_ir as ir_


def _drop_stale_cache() -> None:
    """Delete cached kernels of the modules built from the IR emitters (simd_ir, panel_ir, attention_ir) when
    one of those files is newer than them (numba's cache only watches each jitted function's own file).
    Speed only; errors ignored."""
    from numba.core import config
    here = Path(__file__).resolve().parent
    newest = max((here / name).stat().st_mtime for name in ("simd_ir.py", "panel_ir.py", "attention_ir.py"))
    dirs = [here / "__pycache__"] + ([Path(config.CACHE_DIR)] if config.CACHE_DIR else [])
    for d in dirs:
        for name in ("linear_kernels", "linear_high", "attention_kernels", "panel_kernels"):
            for f in d.rglob(f"{name}*.nb[ic]") if d.is_dir() else ():
                try:
                    if f.stat().st_mtime < newest:
                        f.unlink()
                except OSError:
                    pass


_drop_stale_cache()

LANES = ir_.LANES
BLOCK_LUT = E4M3_VALUES / np.float32(2.0)  # decode_nvfp4's scale table (exact: power of two)


def _aligned(a: np.ndarray, align: int = 64) -> np.ndarray:
    buf = np.empty(a.nbytes + align, np.uint8)
    start = -buf.ctypes.data % align
    out = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


# decode_nvfp4_pairs' tables: [block scale code, e2m1 code] -> e2m1 * e4m3 (exact), one 64-byte line per code
PAIR_TABLES = _aligned(E4M3_VALUES[:, None] * E2M1_VALUES[None, :])


NVFP4_CODES = np.dtype(np.uint8)  # a weight array of this dtype holds NVFP4 codes (packed two a byte)


def _tile(rows: int, cols: int):
    """An intrinsic tile(w, pairs, x, x_stride, wa, w_stride, blocks, blocks_stride, lut, nblocks, out, out_stride)
    (byte addresses and strides): the rows x cols dot products of ``rows`` activation rows with ``cols``
    consecutive weight rows at wa (w_stride apart; also the prefetch distance) in the element format of
    ``w``'s dtype (the array is read for its type only; see the module docstring); out[r, p] at
    out + r * out_stride + 4 p. NVFP4 only: ``blocks``, ``lut`` (BLOCK_LUT, or PAIR_TABLES where ``pairs``:
    the two-block decoder, for rows of a multiple of 32 elements)."""
    @intrinsic
    def tile(typingctx, w, pairs, x, xs, wa, ws, blocks, bs, lut, nblocks, out, os_):
        dtype = as_dtype(w.dtype)
        if dtype != NVFP4_CODES and dtype not in ir_.ELEMENT_DECODERS:
            return None
        sig = types.void(w, types.boolean, *([types.int64] * 10))

        def codegen(context, builder, signature, args):
            _, pairs, x, xs, wa, ws, blocks, bs, lut, nb, out, os_ = args
            ahead = builder.mul(ws, ir_.const(ir_.I64, cols))  # the next tile's weight rows

            def emit(decoder):
                """The tile, ``decoder(weight row address, its block scales' address)`` per weight row."""
                weights = [decoder(builder.add(wa, builder.mul(ws, ir_.const(ir_.I64, p))),
                                   builder.add(blocks, builder.mul(bs, ir_.const(ir_.I64, p)))) for p in range(cols)]
                ir_.emit_tile(builder, rows, nb, x, xs, out, os_, weights, ahead)
            if dtype == NVFP4_CODES:
                with builder.if_else(pairs) as (two_blocks, one_block):
                    with two_blocks:
                        emit(lambda wp, bp: ir_.decode_nvfp4_pairs(wp, bp, lut))
                    with one_block:
                        emit(lambda wp, bp: ir_.decode_nvfp4(wp, bp, lut))
            else:
                emit(lambda wp, bp: ir_.ELEMENT_DECODERS[dtype](wp))
            return context.get_dummy_value()
        return sig, codegen
    return tile


# Tile shapes (activation rows x weight rows): 6x1 and 4x1 for prompt rows (one weight decode feeds
# 6 rows: 24 accumulators, the most that stay in the 32 vector registers), 2x2 and 1x4 for the last
# rows (a decode row reads 4 weight rows at once), 1x1 for ragged edges.
tile_6x1, tile_4x1, tile_2x2, tile_1x4, tile_1x1 = (_tile(r, c) for r, c in ((6, 1), (4, 1), (2, 2), (1, 4), (1, 1)))
GROUP = 4  # weight rows of a 1x4 tile
ITEM = 64  # weight rows per parallel work item: their bytes stay in L2 while every activation row passes


@njit(inline="always")
def _addr(a):
    return np.int64(a.ctypes.data)


def to_f32(v):
    """One weight or K/V element as float32: bf16 bits (uint16) widened, E4M3 codes (int8) as e4m3 / 256 (as
    simd_ir.decode_fp8), float32 as is (the scalar tails)."""
    raise NotImplementedError  # numba only, see the overload below


@overload(to_f32, inline="always")
def _to_f32_numba(v):
    if isinstance(v, types.Integer) and v.bitwidth == 8:
        return lambda v: fk.e4m3_over_256(v)
    if isinstance(v, types.Integer):
        return lambda v: fk._bf16(v)
    return lambda v: np.float32(v)


@njit(inline="always")
def group(w, pairs, xa, xs, wa, ws, ba, bs, la, nb, ya, ys, t_rows, o, cols):
    """Weight rows [o, o + cols) of ``w``'s format (at wa; NVFP4's block scales at ba; see ``_tile``), cols <= ITEM,
    for all t_rows rows (x at xa, y at ya): 6x1 tiles while 6 rows are left, one 4x1, then 2x2 or 1x4 per 4
    weight rows (1x1 for the ragged rest). Weight rows outer, activation rows inner would stream all of x
    through the cache once per weight row (prefill: T * in * out bytes)."""
    t = 0
    while t + 6 <= t_rows:
        for p in range(cols):
            tile_6x1(w, pairs, xa + t * xs, xs, wa + p * ws, ws, ba + p * bs, 0, la, nb, ya + t * ys + 4 * (o + p), ys)
        t += 6
    if t + 4 <= t_rows:
        for p in range(cols):
            tile_4x1(w, pairs, xa + t * xs, xs, wa + p * ws, ws, ba + p * bs, 0, la, nb, ya + t * ys + 4 * (o + p), ys)
        t += 4
    while t < t_rows:  # the last rows: 2x2 or 1x4 tiles per 4 weight rows, 1x1 for the ragged rest
        step = 2 if t + 2 <= t_rows else 1
        for h in range(0, cols - cols % GROUP, GROUP):
            if step == 2:
                for k in range(h, h + GROUP, 2):
                    tile_2x2(w, pairs, xa + t * xs, xs, wa + k * ws, ws, ba + k * bs, bs, la, nb,
                             ya + t * ys + 4 * (o + k), ys)
            else:
                tile_1x4(w, pairs, xa + t * xs, xs, wa + h * ws, ws, ba + h * bs, bs, la, nb,
                         ya + t * ys + 4 * (o + h), ys)
        for r in range(step):
            for p in range(cols - cols % GROUP, cols):
                tile_1x1(w, pairs, xa + (t + r) * xs, xs, wa + p * ws, ws, ba + p * bs, 0, la, nb,
                         ya + (t + r) * ys + 4 * (o + p), ys)
        t += step


@njit(parallel=True, nogil=True, cache=True)
def _even_then_odd(x, unit):
    """x (T, n) f32, n % unit == 0 -> a copy with each ``unit``-chunk as its even elements, then its odd
    ones (the order in which the NVFP4 decoders give a chunk's weights: unit 32 for decode_nvfp4_pairs,
    16 for decode_nvfp4)."""
    t_rows, n = x.shape
    half = unit // 2
    xp = np.empty((t_rows, n), np.float32)
    for t in prange(t_rows):
        for b in range(n // unit):
            for j in range(half):
                xp[t, b * unit + j] = x[t, b * unit + 2 * j]
                xp[t, b * unit + half + j] = x[t, b * unit + 2 * j + 1]
    return xp


def linear_nvfp4(x, packed, block, global_scale, y):
    """x (T, in) f32, packed (out, in/2) u8, block (out, in/16) u8 (E4M3 bytes), global f32 -> y (T, out);
    in % 16 == 0."""
    _linear_nvfp4(x, packed, block, np.float32(global_scale), PAIR_TABLES, y)


@njit(parallel=True, nogil=True, cache=True)
def _linear_nvfp4(x, packed, block, global_scale, tables, y):
    """linear_nvfp4; ``tables``: PAIR_TABLES, passed (not a frozen global) so that it keeps its 64-byte alignment."""
    t_rows, n = x.shape
    out = packed.shape[0]
    assert packed.shape[1] * 2 == n and n % LANES == 0 and x.strides[1] == 4 and y.strides[1] == 4
    assert packed.strides[1] == 1 and block.strides[1] == 1
    nb, xs, ys = n // LANES, np.int64(n * 4), np.int64(y.strides[0])
    ws, bs = np.int64(packed.strides[0]), np.int64(block.strides[0])
    pairs = n % 32 == 0
    xp = _even_then_odd(x, 32 if pairs else 16)
    ya, pa, ba = _addr(y), _addr(packed), _addr(block)
    la = _addr(tables) if pairs else _addr(BLOCK_LUT)
    for g in prange((out + ITEM - 1) // ITEM):
        o = g * ITEM
        cols = min(ITEM, out - o)
        xa = _addr(xp)  # taken here: xp must stay referenced (alive) inside the loop
        group(packed, pairs, xa, xs, pa + o * ws, ws, ba + o * bs, bs, la, nb, ya, ys, t_rows, o, cols)
        for p in range(cols):
            for t in range(t_rows):
                y[t, o + p] = y[t, o + p] * global_scale


