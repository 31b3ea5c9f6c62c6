"""FP8 E4M3 per-output-channel weight quantization, and the exact fast minifloat rounding it uses.

Format (docs/bundle-format.md, "Weight formats", fp8_e4m3), for w float32 [out, in]:
    scale[r] = max(|w[r, :]|) / 448                      float32 [out]; 0 becomes 1.0
    q[r, c]  = e4m3fn(clamp(w[r, c] / scale[r], ±448))    round-to-nearest-even
E4M3 "fn" has no infinity: a cast of |x| >= 464 gives NaN, hence the clamp. A zero scale
(an all-zero row, or a row so tiny that amax/448 underflows) becomes 1.0.
Dequantized (the runtime's reading, in float32): value[r, c] = e4m3(q[r, c]) * scale[r].
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from toolcall.common.minifloat import (
    CHUNK_ELEMENTS,
    E4M3_MAX,
    E4M3Encoder,
    check_weight,
    e4m3_to_f32,
    raise_nonfinite,
    rows_as_f32,
)


def quantize_fp8(w: np.ndarray, name: str = "weight", fast: bool = True, error=None) \
        -> tuple[np.ndarray, np.ndarray]:
    """w [out, in] (float32; float16/bfloat16 are widened exactly) -> (q float8_e4m3fn [out, in],
    scale float32 [out]); value = q * scale.

    NaN/Inf in ``w`` is a QuantizeError naming ``name``. ``fast=False`` casts with ml_dtypes
    (the reference the fast encoder is tested against, byte for byte). ``error`` (fast path
    only), if given, gets ``error.add(w_rows_f32, runtime_dequantized_rows)`` per row chunk,
    while the rows are still in cache.
    """
    assert fast or error is None
    w = check_weight(w, name)
    rows, cols = w.shape
    codes = np.empty((rows, cols), np.uint8)
    scale = np.empty(rows, np.float32)
    chunk_rows = max(1, CHUNK_ELEMENTS // cols)
    widened = np.empty(min(rows, chunk_rows) * cols, np.float32)          # (chunk_rows * in,) w as float32
    scaled = np.empty(min(rows, chunk_rows) * cols, np.float32)           # (chunk_rows * in,) w / scale
    encoder = E4M3Encoder(scaled.size) if fast else None
    for r0 in range(0, rows, chunk_rows):
        r1 = min(rows, r0 + chunk_rows)
        x = rows_as_f32(w, r0, r1, widened)
        amax = np.maximum(x.max(axis=1), -x.min(axis=1))                   # (r,) float32; NaN propagates
        if not np.isfinite(amax).all():
            raise_nonfinite(name, r0 + int(np.flatnonzero(~np.isfinite(amax))[0]))
        s = amax / np.float32(E4M3_MAX)
        s[s == 0] = 1.0
        scale[r0:r1] = s
        y = scaled[: (r1 - r0) * cols].reshape(r1 - r0, cols)
        np.divide(x, s[:, None], out=y)
        if fast:
            encoder.encode(y.reshape(-1), codes[r0:r1].reshape(-1))
            if error is not None:                                          # y's buffer is free again
                error.add(x, dequantize_fp8(codes[r0:r1], s, out=y))
        else:
            codes[r0:r1] = np.clip(y, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return codes.view(ml_dtypes.float8_e4m3fn), scale


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """float32 -> E4M3 codes (uint8, same shape): round-to-nearest-even, saturated at +-448 (NaN stays NaN)."""
    return np.clip(x, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def dequantize_fp8(q: np.ndarray, scale: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """q float8_e4m3fn (or its bytes) [out, in], scale float32 [out] -> float32 [out, in] (into ``out``)."""
    assert q.ndim == 2 and scale.shape == (q.shape[0],)
    values = e4m3_to_f32(q, out)
    values *= scale.astype(np.float32, copy=False)[:, None]
    return values
