"""numba linear layers on output panels (runtime/cpu/panel_ir.py): y (T, out) = x (T, in) @ W.T with W
repacked at load into (out/P, in, P) in its stored format (``repack``).

Work items are (a unit of output vectors, group of up to ROWS activation rows), unit-major so a
panel's bytes stay in cache while the row groups pass; prange splits the items (threads never split
a sum). The last group of a step has T % ROWS rows and takes the tile of that many rows: the same
operations per (row, output) in every tile (panel_ir), so a row's bits do not depend on the step,
nor on the tile shapes this CPU's registers choose (``TILE_SHAPES``). A ragged last panel (out % P)
is zero-padded at load; its last vectors are computed into a scratch tile whose first outputs are
copied out.

Formats: fp8 int8 panels of E4M3 bytes, ``scale`` float32 [out padded] = stored scale * 256 (the
decoder gives e4m3 / 256); bf16 u16 bits; f32.
"""
from __future__ import annotations

import os

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from . import linear_kernels as lk  # noqa: F401  (numba target and stale-cache setup before any compile)
from . import panel_ir as pir

PANEL = 32  # outputs per panel (2 vectors of 16 float32 lanes)
LANES = 16  # outputs per vector (the IR's <16 x float>: one zmm, or two ymm)


# (ROWS, UNIT, SMALL) by vector registers: tiles of up to ROWS rows x UNIT vectors; 1- and 2-row steps
# take SMALL[rows] vectors (more weight streams and accumulator chains in flight). Chosen so the
# accumulators, the weight vectors and a broadcast fit the registers: 32 zmm (8 x 2 + 2 + 8), or 16 ymm
# where a vector is two (6 x 2 + 2 + 1, the AVX2 sgemm shape; zmm's shapes on ymm spill: 2.7x slower,
# bench/RESULTS.md); a 1-row step is bound by reading the weights, and 8 streams beat 4 there even
# spilling (0.6B bf16: 0.071 against 0.087 ns a weight), a 2-row step not (0.130 against 0.097).
# Speed only: every output's operations are the same in any tile.
TILE_SHAPES = {"zmm": (8, 2, {1: 8, 2: 8}), "ymm": (6, 1, {1: 8, 2: 2})}
# TOOLCALL_PANEL_TILES=zmm|ymm overrides the choice (tests run both shapes on one CPU)
TILE_REGISTERS = os.environ.get("TOOLCALL_PANEL_TILES") or ("zmm" if pir.s._x86_has("avx512f") else "ymm")
ROWS, UNIT, SMALL = TILE_SHAPES[TILE_REGISTERS]
SMALL1, SMALL2 = SMALL[1], SMALL[2]


def repack(w: np.ndarray, panel: int = PANEL) -> np.ndarray:
    """(out, in) -> (ceil(out / panel), in, panel), the same dtype and values, outputs past ``out`` zero."""
    out, n = w.shape
    groups = -(-out // panel)
    packed = np.zeros((groups, n, panel), w.dtype)
    for g in range(groups):
        rows = w[g * panel:(g + 1) * panel]
        packed[g, :, :rows.shape[0]] = rows.T
    return packed


def padded_scale(scale: np.ndarray, panel: int = PANEL) -> np.ndarray:
    """fp8 row scales (out,) -> float32 (ceil(out / panel) * panel,) of scale * 256 (exact), 0 past ``out``."""
    out = np.zeros(-(-scale.shape[0] // panel) * panel, np.float32)
    out[:scale.shape[0]] = np.asarray(scale, np.float32) * np.float32(256.0)
    return out


def _tile(fmt: str, panel: int = PANEL, scaled: bool = False):
    """An intrinsic tile(r, vectors, x, x_stride, w, n, out, out_stride, scale) (byte addresses and strides,
    scale read for fp8 or ``scaled``, else 0): the r x (16 * vectors) outputs of ``vectors`` consecutive
    16-output vectors whose weights start at w (panel_ir.emit_panel_tile), for the shapes in TILES (a
    switch over them; another shape computes nothing)."""
    @intrinsic
    def tile(typingctx, r, width, x, xs, w, n, out, os_, scale):
        sig = types.void(*([types.int64] * 9))

        def codegen(context, builder, signature, args):
            r, width, x, xs, w, n, out, os_, scale = args
            merge = builder.append_basic_block("tile.merge")
            key = builder.add(builder.mul(width, pir.ir.Constant(pir.ir.IntType(64), 16)), r)
            switch = builder.switch(key, merge)
            for rows, vectors in TILES:
                case = builder.append_basic_block(f"tile.{rows}x{vectors}")
                switch.add_case(pir.ir.Constant(pir.ir.IntType(64), 16 * vectors + rows), case)
                builder.position_at_end(case)
                pir.emit_panel_tile(builder, fmt, rows, panel, n, x, xs, w, out, os_,
                                    scale if fmt == "fp8" or scaled else None, vectors=vectors)
                builder.branch(merge)
            builder.position_at_end(merge)
            return context.get_dummy_value()
        return sig, codegen
    return tile


TILES = [(r, UNIT) for r in range(1, ROWS + 1)] + [(1, SMALL1), (2, SMALL2)]
fp8_tile, bf16_tile, f32_tile = _tile("fp8"), _tile("bf16"), _tile("f32")
f32_scaled_tile = _tile("f32", scaled=True)  # an fp8 panel decoded to float32 once (``fp8_to_f32``), many row groups


def _to_f32(fmt: str):
    """An intrinsic decode(w, nblocks, dst): float32 at dst [16 * nblocks] = the ``fmt`` elements at w as
    the ``fmt`` tile decodes them (fp8: e4m3 / 256)."""
    @intrinsic
    def decode(typingctx, w, nblocks, dst):
        def codegen(context, builder, signature, args):
            pir.emit_decode(builder, fmt, args[1], args[0], args[2])
            return context.get_dummy_value()
        return types.void(types.int64, types.int64, types.int64), codegen
    return decode


fp8_to_f32, bf16_to_f32 = _to_f32("fp8"), _to_f32("bf16")


@njit(inline="always")
def _addr(a):
    return np.int64(a.ctypes.data)


@njit(inline="always")
def _check(x, w, y, out):
    t_rows, n = x.shape
    assert w.ndim == 3 and w.shape[1] == n and w.shape[2] == PANEL and n > 0
    assert w.shape[0] * PANEL >= out and (w.shape[0] - 1) * PANEL < out
    assert y.shape[0] == t_rows and y.shape[1] == out and x.strides[1] == 4 and y.strides[1] == 4
    assert w.flags.c_contiguous


@njit(inline="always")
def _plan(t_rows, out):
    """Work items as (units of output vectors) x (row groups): groups, rows per group, vectors per wide
    unit, wide units, units in all (wide ones, then UNIT-vector ones up to the last vector holding an output)."""
    wide = SMALL1 if t_rows == 1 else SMALL2 if t_rows == 2 else UNIT
    used = (out + LANES - 1) // LANES
    n_wide = used // wide
    return (t_rows + ROWS - 1) // ROWS, ROWS, wide, n_wide, n_wide + (used - n_wide * wide + UNIT - 1) // UNIT


@njit(inline="always")
def _unit(item, groups, rows, wide, n_wide, t_rows):
    """Item -> (first vector, vectors, first row, rows): n_wide units of ``wide`` vectors, then UNIT-vector ones."""
    u, t = item // groups, (item % groups) * rows
    if u < n_wide:
        return u * wide, wide, t, min(rows, t_rows - t)
    return n_wide * wide + (u - n_wide) * UNIT, UNIT, t, min(rows, t_rows - t)


@njit(inline="always")
def _vector_addr(w, v, pb):
    """Byte address of output vector v's weights at feature 0: panel v // vpp, lanes 16 (v % vpp) on."""
    vpp = PANEL // LANES
    return _addr(w) + (v // vpp) * pb + (v % vpp) * LANES * w.itemsize


@njit(parallel=True, nogil=True, cache=True)
def linear_fp8_panels(x, w, scale, y):
    """x (T, in) f32, w (out/P, in, P) int8 E4M3 panels, scale (out/P * P,) f32 (stored * 256) -> y (T, out)."""
    out = y.shape[1]
    _check(x, w, y, out)
    assert scale.shape[0] == w.shape[0] * PANEL
    t_rows, n = x.shape
    groups, rows, wide, n_wide, n_units = _plan(t_rows, out)
    xs, ys, pb = np.int64(x.strides[0]), np.int64(y.strides[0]), np.int64(n * PANEL * w.itemsize)
    if groups > 1:  # each panel decoded to float32 once, then every row group (the same values and bits)
        for g in prange(w.shape[0]):
            f = np.empty((n, PANEL), np.float32)
            fp8_to_f32(_addr(w) + g * pb, np.int64(n * PANEL // 16), _addr(f))
            tmp = np.empty((ROWS, PANEL), np.float32)
            for t in range(0, t_rows, ROWS):
                r, xa = min(ROWS, t_rows - t), _addr(x) + t * xs
                for h in range(0, PANEL // LANES, UNIT):
                    v = g * (PANEL // LANES) + h
                    if v * LANES >= out:
                        break
                    fa, sa = _addr(f) + 4 * LANES * h, _addr(scale) + 4 * LANES * v
                    if (v + UNIT) * LANES <= out:
                        f32_scaled_tile(r, UNIT, xa, xs, fa, n, _addr(y) + t * ys + 4 * LANES * v, ys, sa)
                    else:  # the ragged last vectors: their zero-padded outputs go to a scratch tile
                        f32_scaled_tile(r, UNIT, xa, xs, fa, n, _addr(tmp), np.int64(4 * PANEL), sa)
                        y[t:t + r, v * LANES:] = tmp[:r, :out - v * LANES]
        return
    for item in prange(n_units * groups):
        v, vectors, t, r = _unit(item, groups, rows, wide, n_wide, t_rows)
        xa, wa, sa = _addr(x) + t * xs, _vector_addr(w, v, pb), _addr(scale) + 4 * LANES * v
        if (v + vectors) * LANES <= out:
            fp8_tile(r, vectors, xa, xs, wa, n, _addr(y) + t * ys + 4 * LANES * v, ys, sa)
        else:  # the ragged last vectors: their zero-padded outputs go to a scratch tile
            tmp = np.empty((ROWS, LANES * vectors), np.float32)
            fp8_tile(r, vectors, xa, xs, wa, n, _addr(tmp), np.int64(4 * LANES * vectors), sa)
            y[t:t + r, v * LANES:] = tmp[:r, :out - v * LANES]


@njit(parallel=True, nogil=True, cache=True)
def linear_bf16_panels(x, w, y):
    """x (T, in) f32, w (out/P, in, P) u16 bf16-bit panels -> y (T, out) f32."""
    out = y.shape[1]
    _check(x, w, y, out)
    t_rows, n = x.shape
    groups, rows, wide, n_wide, n_units = _plan(t_rows, out)
    xs, ys, pb = np.int64(x.strides[0]), np.int64(y.strides[0]), np.int64(n * PANEL * w.itemsize)
    if groups > 1:  # each panel decoded to float32 once, then every row group (the same values and bits)
        for g in prange(w.shape[0]):
            f = np.empty((n, PANEL), np.float32)
            bf16_to_f32(_addr(w) + g * pb, np.int64(n * PANEL // 16), _addr(f))
            tmp = np.empty((ROWS, PANEL), np.float32)
            for t in range(0, t_rows, ROWS):
                r, xa = min(ROWS, t_rows - t), _addr(x) + t * xs
                for h in range(0, PANEL // LANES, UNIT):
                    v = g * (PANEL // LANES) + h
                    if v * LANES >= out:
                        break
                    fa = _addr(f) + 4 * LANES * h
                    if (v + UNIT) * LANES <= out:
                        f32_tile(r, UNIT, xa, xs, fa, n, _addr(y) + t * ys + 4 * LANES * v, ys, 0)
                    else:
                        f32_tile(r, UNIT, xa, xs, fa, n, _addr(tmp), np.int64(4 * PANEL), 0)
                        y[t:t + r, v * LANES:] = tmp[:r, :out - v * LANES]
        return
    for item in prange(n_units * groups):
        v, vectors, t, r = _unit(item, groups, rows, wide, n_wide, t_rows)
        xa, wa = _addr(x) + t * xs, _vector_addr(w, v, pb)
        if (v + vectors) * LANES <= out:
            bf16_tile(r, vectors, xa, xs, wa, n, _addr(y) + t * ys + 4 * LANES * v, ys, 0)
        else:
            tmp = np.empty((ROWS, LANES * vectors), np.float32)
            bf16_tile(r, vectors, xa, xs, wa, n, _addr(tmp), np.int64(4 * LANES * vectors), 0)
            y[t:t + r, v * LANES:] = tmp[:r, :out - v * LANES]


@njit(parallel=True, nogil=True, cache=True)
def linear_f32_panels(x, w, y):
    """x (T, in) f32, w (out/P, in, P) f32 panels -> y (T, out) f32."""
    out = y.shape[1]
    _check(x, w, y, out)
    t_rows, n = x.shape
    groups, rows, wide, n_wide, n_units = _plan(t_rows, out)
    xs, ys, pb = np.int64(x.strides[0]), np.int64(y.strides[0]), np.int64(n * PANEL * w.itemsize)
    for item in prange(n_units * groups):
        v, vectors, t, r = _unit(item, groups, rows, wide, n_wide, t_rows)
        xa, wa = _addr(x) + t * xs, _vector_addr(w, v, pb)
        if (v + vectors) * LANES <= out:
            f32_tile(r, vectors, xa, xs, wa, n, _addr(y) + t * ys + 4 * LANES * v, ys, 0)
        else:
            tmp = np.empty((ROWS, LANES * vectors), np.float32)
            f32_tile(r, vectors, xa, xs, wa, n, _addr(tmp), np.int64(4 * LANES * vectors), 0)
            y[t:t + r, v * LANES:] = tmp[:r, :out - v * LANES]
