"""numba linear layers of the fast CPU backend on the stored weight formats: y (T, out) = x (T, in) @ W.T.

Each output element is one dot product in the order runtime/cpu/simd_ir.py writes down (16-lane
blocks, four accumulators, explicit FMA, a fixed final tree), then the row's scalar tail
(in % 16 elements, in order), then the format's scale. Activation rows are taken in tiles of
6 or 4 rows against one weight row (the weight block decoded once per tile), the last rows in
2x2 and 1x4 tiles (one row against 4 weight rows). A row's operations are the same in any tile,
so a row's bits do not depend on what else shares the step. Threads split the output features
(prange, ITEM rows per item), never a sum.

NVFP4's decoders give a chunk's weights evens first (see simd_ir), so x is permuted to match
once per call (``_even_then_odd``; rows of a multiple of 32 elements take the two-block path).

Formats (DESIGN.md "Weight formats"):
- fp8: q int8 view of E4M3 bytes [out, in], scale f32 [out]: y = dot(x, e4m3 / 256) * (scale * 256).
- nvfp4: packed u8 [out, in/2], block scales E4M3 bytes [out, in/16], global f32:
  y = dot(x, e2m1 * block) * global (e2m1 * block is exact).
- bf16: u16 bits [out, in]; f32: float32 [out, in].
"""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from . import fast_kernels  # noqa: F401  (sets numba's compile target before the first compile)
from . import simd_ir as ir_


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
E4M3_VALUES = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
BLOCK_LUT = E4M3_VALUES / np.float32(2.0)  # decode_nvfp4's scale table (exact: power of two)


def _aligned(a: np.ndarray, align: int = 64) -> np.ndarray:
    buf = np.empty(a.nbytes + align, np.uint8)
    start = -buf.ctypes.data % align
    out = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


# decode_nvfp4_pairs' tables: [block scale code, e2m1 code] -> e2m1 * e4m3 (exact), one 64-byte line per code
PAIR_TABLES = _aligned(E4M3_VALUES[:, None] * E2M1_VALUES[None, :])


def _tile(fmt: str, rows: int, cols: int):
    """An intrinsic tile(x, x_stride, w, w_stride, blocks, blocks_stride, lut, nblocks, out, out_stride) (byte
    addresses and strides): the rows x cols dot products of ``rows`` activation rows with ``cols``
    consecutive weight rows of format ``fmt`` (w_stride apart; also the prefetch distance); out[r, p] at
    out + r * out_stride + 4 p."""
    @intrinsic
    def tile(typingctx, x, xs, w, ws, blocks, bs, lut, nblocks, out, os_):
        sig = types.void(*([types.int64] * 10))

        def codegen(context, builder, signature, args):
            x, xs, w, ws, blocks, bs, lut, nb, out, os_ = args

            def row(p):
                wp = builder.add(w, builder.mul(ws, ir_.const(ir_.I64, p)))
                bp = builder.add(blocks, builder.mul(bs, ir_.const(ir_.I64, p)))
                return {"f32": lambda: ir_.decode_f32(wp), "bf16": lambda: ir_.decode_bf16(wp),
                        "fp8": lambda: ir_.decode_fp8(wp), "nvfp4": lambda: ir_.decode_nvfp4(wp, bp, lut),
                        "nvfp4_pairs": lambda: ir_.decode_nvfp4_pairs(wp, bp, lut)}[fmt]()
            ahead = builder.mul(ws, ir_.const(ir_.I64, cols))  # the next tile's weight rows
            ir_.emit_tile(builder, rows, nb, x, xs, out, os_, [row(p) for p in range(cols)], ahead)
            return context.get_dummy_value()
        return sig, codegen
    return tile


# Tile shapes (activation rows x weight rows): 6x1 and 4x1 for prompt rows (one weight decode feeds
# 6 rows: 24 accumulators, the most that stay in the 32 vector registers), 2x2 and 1x4 for the last
# rows (a decode row reads 4 weight rows at once), 1x1 for ragged edges.
SHAPES = ((6, 1), (4, 1), (2, 2), (1, 4), (1, 1))
f32_6x1, f32_4x1, f32_2x2, f32_1x4, f32_1x1 = (_tile("f32", r, c) for r, c in SHAPES)
bf16_6x1, bf16_4x1, bf16_2x2, bf16_1x4, bf16_1x1 = (_tile("bf16", r, c) for r, c in SHAPES)
fp8_6x1, fp8_4x1, fp8_2x2, fp8_1x4, fp8_1x1 = (_tile("fp8", r, c) for r, c in SHAPES)
nvfp4_6x1, nvfp4_4x1, nvfp4_2x2, nvfp4_1x4, nvfp4_1x1 = (_tile("nvfp4", r, c) for r, c in SHAPES)  # in % 32 == 16
nvp_6x1, nvp_4x1, nvp_2x2, nvp_1x4, nvp_1x1 = (_tile("nvfp4_pairs", r, c) for r, c in SHAPES)  # in % 32 == 0
GROUP = 4  # weight rows of a 1x4 tile
ITEM = 64  # weight rows per parallel work item: their bytes stay in L2 while every activation row passes


@njit(inline="always")
def _addr(a):
    return np.int64(a.ctypes.data)


@intrinsic
def _bits_to_f32(typingctx, bits):
    """uint32 -> the float32 with those bits."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir_.F32)
    return types.float32(types.uint32), codegen


@njit(cache=True)
def _bf16(bits):
    return _bits_to_f32(np.uint32(bits) << np.uint32(16))


# The drivers below are written out per format (numba cannot pass an intrinsic as a value). Each
# covers weight rows [o, o + cols), cols <= ITEM, for all T rows: 6x1 tiles while 6 rows are left,
# one 4x1, then 2x2 or 1x4 per 4 weight rows (1x1 for the ragged rest). Weight rows outer, activation
# rows inner would stream all of x through the cache once per weight row (prefill: T * in * out bytes).

@njit(inline="always")
def _fp8_group(xa, xs, wa, ws, nb, ya, ys, t_rows, o, cols):
    t = 0
    while t + 6 <= t_rows:
        for p in range(cols):
            fp8_6x1(xa + t * xs, xs, wa + p * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + p), ys)
        t += 6
    if t + 4 <= t_rows:
        for p in range(cols):
            fp8_4x1(xa + t * xs, xs, wa + p * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + p), ys)
        t += 4
    while t < t_rows:  # the last rows: 2x2 or 1x4 tiles per 4 weight rows, 1x1 for the ragged rest
        step = 2 if t + 2 <= t_rows else 1
        for h in range(0, cols - cols % GROUP, GROUP):
            if step == 2:
                fp8_2x2(xa + t * xs, xs, wa + h * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + h), ys)
                fp8_2x2(xa + t * xs, xs, wa + (h + 2) * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + h + 2), ys)
            else:
                fp8_1x4(xa + t * xs, xs, wa + h * ws, ws, 0, 0, 0, nb, ya + t * ys + 4 * (o + h), ys)
        for r in range(step):
            for p in range(cols - cols % GROUP, cols):
                fp8_1x1(xa + (t + r) * xs, xs, wa + p * ws, ws, 0, 0, 0, nb, ya + (t + r) * ys + 4 * (o + p), ys)
        t += step


@njit(parallel=True, nogil=True, cache=True)
def linear_fp8(x, q, scale, y):
    """x (T, in) f32, q (out, in) int8 (E4M3 bytes), scale (out,) f32 -> y (T, out) f32."""
    t_rows, n = x.shape
    out = q.shape[0]
    assert q.shape[1] == n and x.strides[1] == 4 and y.strides[1] == 4 and q.strides[1] == 1
    nb, xs, ys, ws = n // LANES, np.int64(x.strides[0]), np.int64(y.strides[0]), np.int64(q.strides[0])
    xa, ya, qa = _addr(x), _addr(y), _addr(q)
    for g in prange((out + ITEM - 1) // ITEM):
        o = g * ITEM
        cols = min(ITEM, out - o)
        _fp8_group(xa, xs, qa + o * ws, ws, nb, ya, ys, t_rows, o, cols)
        for p in range(cols):
            s = scale[o + p] * np.float32(256.0)
            for t in range(t_rows):
                acc = y[t, o + p]
                for i in range(nb * LANES, n):
                    acc = acc + x[t, i] * (E4M3_VALUES[np.uint8(q[o + p, i])] / np.float32(256.0))
                y[t, o + p] = acc * s


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


@njit(inline="always")
def _nvfp4_group(pairs, xa, xs, wa, ws, ba, bs, la, nb, ya, ys, t_rows, o, cols):
    t = 0
    while t + 6 <= t_rows:
        for p in range(cols):
            at = (xa + t * xs, xs, wa + p * ws, ws, ba + p * bs, 0, la, nb, ya + t * ys + 4 * (o + p), ys)
            if pairs:
                nvp_6x1(*at)
            else:
                nvfp4_6x1(*at)
        t += 6
    if t + 4 <= t_rows:
        for p in range(cols):
            at = (xa + t * xs, xs, wa + p * ws, ws, ba + p * bs, 0, la, nb, ya + t * ys + 4 * (o + p), ys)
            if pairs:
                nvp_4x1(*at)
            else:
                nvfp4_4x1(*at)
        t += 4
    while t < t_rows:  # the last rows: 2x2 or 1x4 tiles per 4 weight rows, 1x1 for the ragged rest
        step = 2 if t + 2 <= t_rows else 1
        for h in range(0, cols - cols % GROUP, GROUP):
            if step == 2:
                for k in range(h, h + GROUP, 2):
                    at = (xa + t * xs, xs, wa + k * ws, ws, ba + k * bs, bs, la, nb, ya + t * ys + 4 * (o + k), ys)
                    if pairs:
                        nvp_2x2(*at)
                    else:
                        nvfp4_2x2(*at)
            else:
                at = (xa + t * xs, xs, wa + h * ws, ws, ba + h * bs, bs, la, nb, ya + t * ys + 4 * (o + h), ys)
                if pairs:
                    nvp_1x4(*at)
                else:
                    nvfp4_1x4(*at)
        for r in range(step):
            for p in range(cols - cols % GROUP, cols):
                dst = ya + (t + r) * ys + 4 * (o + p)
                at = (xa + (t + r) * xs, xs, wa + p * ws, ws, ba + p * bs, 0, la, nb, dst, ys)
                if pairs:
                    nvp_1x1(*at)
                else:
                    nvfp4_1x1(*at)
        t += step


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
        _nvfp4_group(pairs, xa, xs, pa + o * ws, ws, ba + o * bs, bs, la, nb, ya, ys, t_rows, o, cols)
        for p in range(cols):
            for t in range(t_rows):
                y[t, o + p] = y[t, o + p] * global_scale


