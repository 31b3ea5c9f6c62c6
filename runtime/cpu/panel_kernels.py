"""numba linear layers on output panels (runtime/cpu/panel_ir.py): y (T, out) = x (T, in) @ W.T with W
repacked at load into (out/P, in, P) in its stored format (``repack``).

Work items are (a unit of output vectors, group of up to ROWS activation rows), unit-major so a
panel's bytes stay in cache while the row groups pass; prange splits the items (threads never split
a sum). The last group of a step has T % ROWS rows and takes the tile of that many rows: the same
operations per (row, output) in every tile (panel_ir), so a row's bits do not depend on the step,
nor on the tile shapes this CPU's registers choose (``TILE_SHAPES``). A ragged last panel (out % P)
is zero-padded at load; its last vectors are computed into a scratch tile whose first outputs are
copied out (``_tile_into``).

One kernel, ``linear_panels``, compiled per panel dtype (the element format): int8 E4M3 bytes (fp8),
``scale`` float32 [out padded] = stored scale * 256 (the decoder gives e4m3 / 256); u16 bf16 bits; f32.
"""
from __future__ import annotations

import os

import numpy as np
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.numpy_support import as_dtype

from toolcall.runtime.cpu import panel_ir as pir
from toolcall.runtime.cpu.linear_kernels import _addr  # (also: numba target and stale-cache setup before any compile)

PANEL = 32  # outputs per panel (2 vectors of 16 float32 lanes)
LANES = 16  # outputs per vector (the IR's <16 x float>: one zmm, or two ymm)


# (ROWS, UNIT, SMALL) by vector registers: tiles of up to ROWS rows x UNIT vectors; 1- and 2-row steps
# take SMALL[rows] vectors (more weight streams and accumulator chains in flight). Chosen so the
# accumulators, the weight vectors and a broadcast fit the registers: 32 zmm (8 x 2 + 2 + 8), or 16 ymm
# where a vector is two (6 x 2 + 2 + 1, the AVX2 sgemm shape; zmm's shapes on ymm spill: 2.7x slower,
# bench/RESULTS.md, "CPU linear kernels"); a 1-row step is bound by reading the weights, and 8 streams beat 4 there even
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


TILES = [(r, UNIT) for r in range(1, ROWS + 1)] + [(1, SMALL1), (2, SMALL2)]


@intrinsic
def panel_tile(typingctx, w, f, r, vectors, x, xs, fa, n, out, os_, scale):
    """tile(w, f, r, vectors, x, x_stride, fa, n, out, out_stride, scale) (byte addresses and strides): the
    r x (16 * vectors) outputs of ``vectors`` consecutive 16-output vectors whose weights start at fa
    (panel_ir.emit_panel_tile), for the shapes in TILES (another shape computes nothing). The arrays are read
    for their types only: ``f``'s dtype is the element format at fa (w's own, or float32 where w's panel was
    decoded once: ``decode_panel``); w int8 (fp8 E4M3 bytes): the outputs are multiplied by the float32
    scales at ``scale`` (one per output), else ``scale`` is not read."""
    dtype, scaled = as_dtype(f.dtype), as_dtype(w.dtype) == np.int8
    if dtype not in pir.s.ELEMENT_DECODERS:
        return None

    def codegen(context, builder, signature, args):
        _, _, r, vectors, x, xs, fa, n, out, os_, scale = args
        key = builder.add(builder.mul(vectors, pir.s.const(pir.s.I64, 16)), r)
        pir.s.emit_switch(builder, key, [(16 * v + rows, (rows, v)) for rows, v in TILES],
                          lambda shape: pir.emit_panel_tile(builder, dtype, shape[0], PANEL, n, x, xs, fa, out, os_,
                                                            scale if scaled else None, vectors=shape[1]))
        return context.get_dummy_value()
    return types.void(w, f, *([types.int64] * 9)), codegen


@intrinsic
def decode_panel(typingctx, w, wa, nblocks, dst):
    """float32 at dst [16 * nblocks] = the elements of ``w``'s dtype at wa as the tile decodes them (fp8:
    e4m3 / 256)."""
    def codegen(context, builder, signature, args):
        pir.emit_decode(builder, as_dtype(w.dtype), args[2], args[1], args[3])
        return context.get_dummy_value()
    return types.void(w, types.int64, types.int64, types.int64), codegen


SCRATCH = (ROWS, LANES * max(UNIT, SMALL1, SMALL2))  # float32: the outputs of the largest tile


@intrinsic
def _stack_scratch(typingctx):
    """A float32 SCRATCH-sized buffer on the calling function's stack (allocated once, in its entry block)."""
    def codegen(context, builder, signature, args):
        return cgutils.alloca_once(builder, pir.ir.FloatType(), size=SCRATCH[0] * SCRATCH[1])
    return types.CPointer(types.float32)(), codegen


@njit(inline="always")
def _tile_into(w, f, r, vectors, xa, xs, fa, n, y, t, v, sa):
    """panel_tile's r x (16 * vectors) outputs into y's rows t.., outputs 16 v..; where they pass y's last
    output (the zero-padded last vectors), through a scratch tile on the stack whose outputs inside y are
    copied there. One tile call site: each compiles every tile shape."""
    out, ys = y.shape[1], np.int64(y.strides[0])
    ragged = (v + vectors) * LANES > out
    tmp = carray(_stack_scratch(), SCRATCH)
    if ragged:
        dst, stride = _addr(tmp), np.int64(4 * SCRATCH[1])
    else:
        dst, stride = _addr(y) + t * ys + 4 * LANES * v, ys
    panel_tile(w, f, r, vectors, xa, xs, fa, n, dst, stride, sa)
    if ragged:
        y[t:t + r, v * LANES:] = tmp[:r, :out - v * LANES]


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
def linear_panels(x, w, scale, y):
    """x (T, in) f32, w (out/P, in, P) panels of int8 E4M3 bytes (fp8), u16 bf16 bits or f32; scale: fp8's
    (out/P * P,) f32 (stored scale * 256), not read for the others (an empty array) -> y (T, out) f32."""
    out = y.shape[1]
    _check(x, w, y, out)
    assert w.itemsize != 1 or scale.shape[0] == w.shape[0] * PANEL  # int8 (fp8): a scale per output
    t_rows, n = x.shape
    groups, rows, wide, n_wide, n_units = _plan(t_rows, out)
    xs, pb = np.int64(x.strides[0]), np.int64(n * PANEL * w.itemsize)
    # many row groups over panels to decode (not float32; itemsize is a constant of the compiled type): each
    # panel decoded to float32 once, then every row group over the copy (the same values and bits)
    if groups > 1 and w.itemsize != 4:
        for g in prange(w.shape[0]):
            f = np.empty((n, PANEL), np.float32)
            decode_panel(w, _addr(w) + g * pb, np.int64(n * PANEL // 16), _addr(f))
            for t in range(0, t_rows, ROWS):
                r, xa = min(ROWS, t_rows - t), _addr(x) + t * xs
                for h in range(0, PANEL // LANES, UNIT):
                    v = g * (PANEL // LANES) + h
                    if v * LANES >= out:
                        break
                    fa, sa = _addr(f) + 4 * LANES * h, _addr(scale) + 4 * LANES * v
                    _tile_into(w, f, r, UNIT, xa, xs, fa, n, y, t, v, sa)
        return
    for item in prange(n_units * groups):
        v, vectors, t, r = _unit(item, groups, rows, wide, n_wide, t_rows)
        _tile_into(w, w, r, vectors, _addr(x) + t * xs, xs, _vector_addr(w, v, pb), n, y, t, v,
                   _addr(scale) + 4 * LANES * v)
