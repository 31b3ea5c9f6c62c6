"""NVFP4 weight quantization: E2M1 values, an E4M3 scale per 16 weights, one float32 global scale.

docs/bundle-format.md ("Weight formats", nvfp4), all in float32 and in this order (ModelOpt's order, so the
bytes equal its NVFP4 export of the same float32 tensor):
    global   = amax(|w|) / (6 * 448)
    bscale   = block_amax / (6 * global); 0 -> 1.0; clamp >= 2^-9; cast to E4M3 (nearest even)
    q        = w / (float(bscale) * global)
    code     = E2M1(q): nearest even, saturating at ±6; sign = (q < 0), so an exact -0.0 is code 0
    value    = (e2m1(code) * float(bscale)) * global   (runtime/cpu/dequant.py, the GPU kernels)
An all-zero tensor (amax / 2688 == 0) gets global 0, block scales 1.0 and codes 0.
E4M3 is also clamped to 448 (ModelOpt's cast would give NaN, which only a tensor with
amax < 2688 * 2^-126 can reach).

Outputs: ``weight`` U8 [out, in/2] (element 2k in the low nibble, 2k+1 in the high),
``weight_scale`` F8_E4M3 [out, in/16], ``weight_scale_2`` F32 shape ().
E2M1 codes: bit 3 sign, magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} -> 0..7.
"""
from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

from toolcall.common.errors import QuantizeError
from toolcall.common.minifloat import (
    CHUNK_ELEMENTS,
    E4M3_VALUES,
    E4M3Encoder,
    MinifloatEncoder,
    check_weight,
    e4m3_to_f32,
    encode_e4m3,
    raise_nonfinite,
    rows_as_f32,
)

BLOCK = 16
# code -> value, E2M1: bit 3 sign, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
# packed byte -> its two values as one uint64 (little-endian: low nibble's value first), so
# one gather per byte writes two float32s in element order.
_E2M1_BYTE_VALUES = np.stack([E2M1_VALUES[np.arange(256) & 15], E2M1_VALUES[np.arange(256) >> 4]],
                             axis=1).copy().view(np.uint64).reshape(256)
E2M1_MAX = 6.0
GLOBAL_DIVISOR = np.float32(6.0 * 448.0)  # 2688: E2M1 max times E4M3 max
MIN_BLOCK_SCALE = np.float32(2.0 ** -9)   # smallest E4M3 subnormal: a block scale never casts to 0
_F32_TINY = np.float32(2.0 ** -149)
_E4M3_ONE = 0x38
assert sys.byteorder == "little"  # E2M1Packer pairs codes through a uint64 view
# ModelOpt's rounding table: code = #bounds below |q|, +1 at the three ties that round up to even.
E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
E2M1_TIES_UP = np.array([0.75, 1.75, 3.5], np.float32)


def e2m1_codes_reference(q: np.ndarray) -> np.ndarray:
    """float32 -> E2M1 codes uint8 (0..15) by comparison with the rounding bounds (slow, plain)."""
    mag = np.abs(q)
    ordinal = np.searchsorted(E2M1_BOUNDS, mag, side="left").astype(np.uint8)  # bounds < |q|
    ordinal += np.isin(mag, E2M1_TIES_UP).astype(np.uint8)
    return ordinal | ((q < 0).astype(np.uint8) << 3)


def pack_nibbles_reference(codes: np.ndarray) -> np.ndarray:
    """codes uint8 [.., 2n] -> uint8 [.., n]: element 2k in the low nibble, 2k+1 in the high."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


class E2M1Packer(MinifloatEncoder):
    """float32 -> packed E2M1 bytes, identical to pack_nibbles_reference(e2m1_codes_reference(q))."""

    def __init__(self, capacity: int):
        super().__init__(mantissa_bits=1, min_normal_exp=0, max_value=E2M1_MAX, capacity=capacity)
        self._pairs = np.empty(capacity // 2, np.uint64)

    def encode(self, q: np.ndarray, out: np.ndarray) -> None:
        """q float32 (1-D, even length, no NaN) -> out uint8 (half length). Overwrites an exact -0.0 in q."""
        n = q.size
        np.add(q, np.float32(0.0), out=q)                 # -0.0 + 0.0 = +0.0: sign below is then (q < 0)
        codes = self.magnitude_codes(q)                   # uint32 0..7
        sign = self._magic[:n]
        np.right_shift(q.view(np.uint32), np.uint32(28), out=sign)
        np.bitwise_and(sign, np.uint32(8), out=sign)
        np.bitwise_or(codes, sign, out=codes)             # uint32 0..15
        pairs = codes.view(np.uint64)                     # little-endian: c(2k) | c(2k+1) << 32
        high = self._pairs[: n // 2]
        np.right_shift(pairs, np.uint64(28), out=high)    # c(2k+1) << 4 in the low byte
        np.bitwise_or(pairs, high, out=out, casting="unsafe")  # low byte: c(2k) | c(2k+1) << 4


def pack_e2m1(q: np.ndarray, fast: bool = True) -> np.ndarray:
    """float32 [..., 2n] (no NaN) -> packed E2M1 bytes uint8 [..., n] (2k low nibble, 2k+1 high)."""
    if not fast:
        return pack_nibbles_reference(e2m1_codes_reference(q))
    flat = np.array(q, dtype=np.float32).reshape(-1)                  # a copy: encode overwrites -0.0
    assert flat.size % 2 == 0
    out = np.empty(flat.size // 2, np.uint8)
    packer = E2M1Packer(min(CHUNK_ELEMENTS, max(flat.size, 2)))
    for start in range(0, flat.size, CHUNK_ELEMENTS):
        stop = min(flat.size, start + CHUNK_ELEMENTS)
        packer.encode(flat[start:stop], out[start // 2: stop // 2])
    return out.reshape(*q.shape[:-1], q.shape[-1] // 2)


def _block_amax(absw: np.ndarray, scratch: np.ndarray, out: np.ndarray) -> None:
    """absw float32 (n,), n % 16 == 0 -> out (n/16,) max of each 16; pairwise on strided views.

    ``reshape(-1, 16).max(axis=1)`` is 4x slower: numpy loops per row of 16.
    """
    n = absw.size
    half = scratch[: n // 2]
    np.maximum(absw[0::2], absw[1::2], out=half)
    quarter = scratch[n // 2: n // 2 + n // 4]
    np.maximum(half[0::2], half[1::2], out=quarter)
    eighth = half[: n // 8]                               # half's data is consumed
    np.maximum(quarter[0::2], quarter[1::2], out=eighth)
    np.maximum(eighth[0::2], eighth[1::2], out=out)


def global_scale(amax: np.float32) -> np.float32:
    """Per-tensor scale: amax / (6 * 448), float32."""
    return np.float32(np.float32(amax) / GLOBAL_DIVISOR)


def to_block_scale(block_amax: np.ndarray, six_global: np.float32) -> None:
    """In place: block amax float32 -> block scale before its E4M3 cast (global > 0)."""
    np.divide(block_amax, six_global, out=block_amax)
    block_amax[block_amax == 0] = 1.0
    np.maximum(block_amax, MIN_BLOCK_SCALE, out=block_amax)


def block_divisors(scale_values: np.ndarray, global_: np.float32) -> np.ndarray:
    """float(block scale) * global, float32 (the divisor of q). With a subnormal global (amax <
    2688 * 2^-126) the product can underflow to 0: it becomes the smallest float32 instead, so
    w / it saturates (or stays 0) rather than giving NaN."""
    divisor = scale_values * global_
    divisor[divisor == 0] = _F32_TINY
    return divisor


def quantize_nvfp4(w: np.ndarray, name: str = "weight", fast: bool = True, error=None) \
        -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w [out, in], in % 16 == 0 (float32; float16/bfloat16 are widened exactly) -> (packed uint8
    [out, in/2], block scale float8_e4m3fn [out, in/16], global scale float32 shape ()).

    NaN/Inf is a QuantizeError naming ``name``. ``fast=False``: plain reference path, same bytes.
    ``error`` (fast path only), if given, gets ``error.add(w_rows_f32, runtime_dequantized_rows)``
    per row chunk.
    """
    assert fast or error is None
    w = check_weight(w, name)
    rows, cols = w.shape
    if cols % BLOCK:
        raise QuantizeError("quantize_invalid", f"{name}: NVFP4 needs the input dimension to be a multiple of "
                            f"{BLOCK} (one scale per {BLOCK} weights); found shape {[rows, cols]}; "
                            "build this model as fp8_e4m3 or bf16", tensor=name, shape=[rows, cols], block=BLOCK)
    if not fast:
        return _quantize_nvfp4_plain(w.astype(np.float32), name)
    chunk_rows = max(1, CHUNK_ELEMENTS // cols)
    n_max = min(rows, chunk_rows) * cols
    widened = np.empty(n_max, np.float32)                  # w chunk as float32 (non-float32 sources)
    work = np.empty(n_max, np.float32)                     # |w| chunk, then q chunk
    scratch = np.empty(n_max, np.float32)                  # block-max tree levels
    block_amax = np.empty((rows, cols // BLOCK), np.float32)
    # pass 1: block amax everywhere; the global amax is their max (NaN propagates)
    for r0 in range(0, rows, chunk_rows):
        r1 = min(rows, r0 + chunk_rows)
        x = rows_as_f32(w, r0, r1, widened).reshape(-1)
        np.abs(x, out=work[: x.size])
        _block_amax(work[: x.size], scratch, block_amax[r0:r1].reshape(-1))
    amax = block_amax.max()
    if not np.isfinite(amax):
        raise_nonfinite(name, int(np.flatnonzero(~np.isfinite(block_amax.max(axis=1)))[0]))
    global_ = global_scale(amax)
    packed = np.empty((rows, cols // 2), np.uint8)
    scale_codes = np.empty((rows, cols // BLOCK), np.uint8)
    if global_ == 0:                                       # all zero: codes 0, block scales 1.0
        packed[...] = 0
        scale_codes[...] = _E4M3_ONE
    # pass 2: block scales, q = w / (float(scale) * global), E2M1 codes packed two per byte
    if global_ != 0:
        to_block_scale(block_amax, np.float32(6.0) * global_)
    packer = E2M1Packer(n_max)
    scale_encoder = E4M3Encoder(n_max // BLOCK)
    for r0 in range(0, rows, chunk_rows) if global_ != 0 or error is not None else ():
        r1 = min(rows, r0 + chunk_rows)
        x = rows_as_f32(w, r0, r1, widened)
        if global_ != 0:
            codes = scale_codes[r0:r1].reshape(-1)
            scale_encoder.encode(block_amax[r0:r1].reshape(-1), codes)
            divisor = block_divisors(np.take(E4M3_VALUES, codes), global_)  # (n/16,) float32
            q = work[: x.size]
            np.divide(x.reshape(-1, BLOCK), divisor[:, None], out=q.reshape(-1, BLOCK))
            packer.encode(q, packed[r0:r1].reshape(-1))
        if error is not None:                              # work's q is consumed
            error.add(x, dequantize_nvfp4(packed[r0:r1], scale_codes[r0:r1], global_,
                                          out=work[: x.size].reshape(x.shape)))
    return packed, scale_codes.view(ml_dtypes.float8_e4m3fn), np.array(global_, np.float32)


def _quantize_nvfp4_plain(w: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, cols = w.shape
    amax = np.abs(w).max()
    if not np.isfinite(amax):
        raise_nonfinite(name, int(np.flatnonzero(~np.isfinite(w).all(axis=1))[0]))
    global_ = global_scale(amax)
    if global_ == 0:
        scale = np.full((rows, cols // BLOCK), 1.0, np.float32).astype(ml_dtypes.float8_e4m3fn)
        return np.zeros((rows, cols // 2), np.uint8), scale, np.array(global_, np.float32)
    block_amax = np.abs(w).reshape(rows, cols // BLOCK, BLOCK).max(axis=2)
    to_block_scale(block_amax, np.float32(6.0) * global_)
    scale = encode_e4m3(block_amax, fast=False)
    divisor = block_divisors(scale.astype(np.float32), global_)                # (out, in/16)
    q = (w.reshape(rows, cols // BLOCK, BLOCK) / divisor[..., None]).reshape(rows, cols)
    return pack_nibbles_reference(e2m1_codes_reference(q)), scale, np.array(global_, np.float32)


def dequantize_nvfp4(packed: np.ndarray, block_scale: np.ndarray, global_scale,
                     out: np.ndarray | None = None) -> np.ndarray:
    """packed uint8 [out, in/2], block_scale float8_e4m3fn [out, in/16], global float32 -> float32
    [out, in] (into ``out`` if given)."""
    rows, half = packed.shape
    cols = 2 * half
    assert block_scale.shape == (rows, cols // BLOCK)
    values = np.empty((rows, cols), np.float32) if out is None else out
    np.take(_E2M1_BYTE_VALUES, packed, out=values.view(np.uint64))      # (out, in): e2m1 values
    block = e4m3_to_f32(block_scale)                                    # (out, in/16)
    blocks = values.reshape(rows, cols // BLOCK, BLOCK)     # a view
    blocks *= block[..., None]                                          # exact
    values *= np.float32(global_scale)                                  # the one rounding
    return values
