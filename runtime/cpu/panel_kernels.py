"""numba linear layers on output panels (runtime/cpu/panel_ir.py): y (T, out) = x (T, in) @ W.T with W
repacked at load into (out/P, in, P) in its stored format (``repack``).

Work items are (panel, group of up to ROWS activation rows), panel-major so a panel's bytes stay in
cache while the row groups pass; prange splits the items (threads never split a sum). The last
group of a step has T % ROWS rows and takes the tile of that many rows: the same operations per
(row, output) in every tile (panel_ir), so a row's bits do not depend on the step. A ragged last
panel (out % P) is zero-padded at load and computed into a scratch tile whose first outputs are
copied out.

Formats: fp8 int8 panels of E4M3 bytes, ``scale`` float32 [out padded] = stored scale * 256 (the
decoder gives e4m3 / 256); bf16 u16 bits; f32.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from . import linear_kernels as lk  # noqa: F401  (numba target and stale-cache setup before any compile)
from . import panel_ir as pir

PANEL = 32  # outputs per panel: 2 zmm of float32 accumulators per row
ROWS = 8  # rows per tile: 8 x 2 accumulators + 2 weight vectors + 8 broadcasts fit the 32 vector registers


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
    """An intrinsic tile(r, width, x, x_stride, w, n, out, out_stride, scale) (byte addresses and strides,
    scale read for fp8 or ``scaled``, else 0): the r x (width * panel) outputs of ``width`` consecutive panels, for the shapes in
    TILES (a switch over them; another shape computes nothing)."""
    @intrinsic
    def tile(typingctx, r, width, x, xs, w, n, out, os_, scale):
        sig = types.void(*([types.int64] * 9))

        def codegen(context, builder, signature, args):
            r, width, x, xs, w, n, out, os_, scale = args
            merge = builder.append_basic_block("tile.merge")
            key = builder.add(builder.mul(width, pir.ir.Constant(pir.ir.IntType(64), 16)), r)
            switch = builder.switch(key, merge)
            for rows, wide in TILES:
                case = builder.append_basic_block(f"tile.{rows}x{wide}")
                switch.add_case(pir.ir.Constant(pir.ir.IntType(64), 16 * wide + rows), case)
                builder.position_at_end(case)
                pir.emit_panel_tile(builder, fmt, rows, panel, n, x, xs, w, out, os_,
                                    scale if fmt == "fp8" or scaled else None, width=wide)
                builder.branch(merge)
            builder.position_at_end(merge)
            return context.get_dummy_value()
        return sig, codegen
    return tile


# (rows, panels side by side): ROWS x 1 and its shorter groups; a step of 1 or 2 rows (decode) takes WIDE
# panels at once: 4 weight streams and 8 or 16 accumulator chains in flight, like the row kernels' 1x4 tiles
WIDE = 4
TILES = [(r, 1) for r in range(1, ROWS + 1)] + [(1, WIDE), (2, WIDE)]
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
    """Work items as (units of panels) x (row groups): groups, rows per group, panels per wide unit, wide units."""
    wide = WIDE if t_rows <= 2 else 1
    return (t_rows + ROWS - 1) // ROWS, ROWS, wide, (out // PANEL) // wide


@njit(inline="always")
def _unit(item, groups, rows, wide, n_wide, t_rows):
    """Item -> (first panel, panels, first row, rows): n_wide units of ``wide`` panels, then single panels."""
    u, t = item // groups, (item % groups) * rows
    if u < n_wide:
        return u * wide, wide, t, min(rows, t_rows - t)
    return n_wide * wide + (u - n_wide), 1, t, min(rows, t_rows - t)


@njit(parallel=True, nogil=True, cache=True)
def linear_fp8_panels(x, w, scale, y):
    """x (T, in) f32, w (out/P, in, P) int8 E4M3 panels, scale (out/P * P,) f32 (stored * 256) -> y (T, out)."""
    out = y.shape[1]
    _check(x, w, y, out)
    assert scale.shape[0] == w.shape[0] * PANEL
    t_rows, n = x.shape
    groups, rows, wide, n_wide = _plan(t_rows, out)
    xs, ys, pb = np.int64(x.strides[0]), np.int64(y.strides[0]), np.int64(n * PANEL * w.itemsize)
    if groups > 1:  # each panel decoded to float32 once, then every row group (the same values and bits)
        for g in prange(w.shape[0]):
            f = np.empty((n, PANEL), np.float32)
            fp8_to_f32(_addr(w) + g * pb, np.int64(n * PANEL // 16), _addr(f))
            tmp = np.empty((ROWS, PANEL), np.float32)
            for t in range(0, t_rows, ROWS):
                r, xa, sa = min(ROWS, t_rows - t), _addr(x) + t * xs, _addr(scale) + 4 * g * PANEL
                if (g + 1) * PANEL <= out:
                    f32_scaled_tile(r, 1, xa, xs, _addr(f), n, _addr(y) + t * ys + 4 * g * PANEL, ys, sa)
                else:
                    f32_scaled_tile(r, 1, xa, xs, _addr(f), n, _addr(tmp), np.int64(4 * PANEL), sa)
                    y[t:t + r, g * PANEL:] = tmp[:r, :out - g * PANEL]
        return
    for item in prange((n_wide + w.shape[0] - n_wide * wide) * groups):
        g, width, t, r = _unit(item, groups, rows, wide, n_wide, t_rows)
        xa, wa, sa = _addr(x) + t * xs, _addr(w) + g * pb, _addr(scale) + 4 * g * PANEL
        if (g + width) * PANEL <= out:
            fp8_tile(r, width, xa, xs, wa, n, _addr(y) + t * ys + 4 * g * PANEL, ys, sa)
        else:  # the ragged last panel: its zero-padded outputs go to a scratch tile
            tmp = np.empty((ROWS, PANEL), np.float32)
            fp8_tile(r, 1, xa, xs, wa, n, _addr(tmp), np.int64(4 * PANEL), sa)
            y[t:t + r, g * PANEL:] = tmp[:r, :out - g * PANEL]


@njit(parallel=True, nogil=True, cache=True)
def linear_bf16_panels(x, w, y):
    """x (T, in) f32, w (out/P, in, P) u16 bf16-bit panels -> y (T, out) f32."""
    out = y.shape[1]
    _check(x, w, y, out)
    t_rows, n = x.shape
    groups, rows, wide, n_wide = _plan(t_rows, out)
    xs, ys, pb = np.int64(x.strides[0]), np.int64(y.strides[0]), np.int64(n * PANEL * w.itemsize)
    if groups > 1:  # each panel decoded to float32 once, then every row group (the same values and bits)
        for g in prange(w.shape[0]):
            f = np.empty((n, PANEL), np.float32)
            bf16_to_f32(_addr(w) + g * pb, np.int64(n * PANEL // 16), _addr(f))
            tmp = np.empty((ROWS, PANEL), np.float32)
            for t in range(0, t_rows, ROWS):
                r, xa = min(ROWS, t_rows - t), _addr(x) + t * xs
                if (g + 1) * PANEL <= out:
                    f32_tile(r, 1, xa, xs, _addr(f), n, _addr(y) + t * ys + 4 * g * PANEL, ys, 0)
                else:
                    f32_tile(r, 1, xa, xs, _addr(f), n, _addr(tmp), np.int64(4 * PANEL), 0)
                    y[t:t + r, g * PANEL:] = tmp[:r, :out - g * PANEL]
        return
    for item in prange((n_wide + w.shape[0] - n_wide * wide) * groups):
        g, width, t, r = _unit(item, groups, rows, wide, n_wide, t_rows)
        xa, wa = _addr(x) + t * xs, _addr(w) + g * pb
        if (g + width) * PANEL <= out:
            bf16_tile(r, width, xa, xs, wa, n, _addr(y) + t * ys + 4 * g * PANEL, ys, 0)
        else:
            tmp = np.empty((ROWS, PANEL), np.float32)
            bf16_tile(r, 1, xa, xs, wa, n, _addr(tmp), np.int64(4 * PANEL), 0)
            y[t:t + r, g * PANEL:] = tmp[:r, :out - g * PANEL]


@njit(parallel=True, nogil=True, cache=True)
def linear_f32_panels(x, w, y):
    """x (T, in) f32, w (out/P, in, P) f32 panels -> y (T, out) f32."""
    out = y.shape[1]
    _check(x, w, y, out)
    t_rows, n = x.shape
    groups, rows, wide, n_wide = _plan(t_rows, out)
    xs, ys, pb = np.int64(x.strides[0]), np.int64(y.strides[0]), np.int64(n * PANEL * w.itemsize)
    for item in prange((n_wide + w.shape[0] - n_wide * wide) * groups):
        g, width, t, r = _unit(item, groups, rows, wide, n_wide, t_rows)
        xa, wa = _addr(x) + t * xs, _addr(w) + g * pb
        if (g + width) * PANEL <= out:
            f32_tile(r, width, xa, xs, wa, n, _addr(y) + t * ys + 4 * g * PANEL, ys, 0)
        else:
            tmp = np.empty((ROWS, PANEL), np.float32)
            f32_tile(r, 1, xa, xs, wa, n, _addr(tmp), np.int64(4 * PANEL), 0)
            y[t:t + r, g * PANEL:] = tmp[:r, :out - g * PANEL]
