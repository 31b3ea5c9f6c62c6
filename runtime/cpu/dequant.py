"""Quantized bundle weights back to float32: FP8 E4M3 per channel, NVFP4, or high precision.

The formats are DESIGN.md's "Weight formats"; the builder (builder/fp8.py, builder/nvfp4.py)
writes them and its tests check that these functions invert it exactly:
    fp8_e4m3: value[r, c] = e4m3(q[r, c]) * scale[r]
    nvfp4:    value[r, c] = (e2m1(code[r, c]) * e4m3(block_scale[r, c // 16])) * global_scale
all in float32. The NVFP4 product is DESIGN.md's "e2m1 · block scale · global" read left to right,
as the GPU kernel computes it: e2m1 * block is exact (2 + 4 significant bits), so the value is
rounded once, by the global multiply.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from common.errors import Refusal
from ..tensor_file import SafetensorsFile

NVFP4_BLOCK = 16
# code -> value, all 256 E4M3 "fn" bytes (0x7F and 0xFF are NaN).
E4M3_VALUES = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
# code -> value, E2M1: bit 3 sign, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
# packed byte -> its two values as one uint64 (little-endian: low nibble's value first), so
# one gather per byte writes two float32s in element order.
_E2M1_BYTE_VALUES = np.stack([E2M1_VALUES[np.arange(256) & 15], E2M1_VALUES[np.arange(256) >> 4]],
                             axis=1).copy().view(np.uint64).reshape(256)
_HIGH_PRECISION = ("BF16", "F16", "F32")


def subnormals_flushed() -> bool:
    """True if float32 subnormals read as 0 in this process (DAZ/FTZ, set by some -ffast-math library)."""
    return bool(np.float32(2.0 ** -149) * np.float32(2.0 ** 120) == 0)


def e4m3_to_f32(q: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float8_e4m3fn (or its bytes), any shape -> float32 (into ``out`` if given), equal to
    E4M3_VALUES[q], NaN codes included.

    Bit arithmetic, 3x faster than the table gather: the sign-extended byte shifted left by 20
    puts the sign at bit 31 and exponent+mantissa at bits 20..26 of a float32 whose value is
    the E4M3 value * 2^-120 (E4M3 bias 7 vs float32 bias 127; code exponent 0 lands in float32
    subnormals, which scale the same way), so one exact multiply by 2^120 finishes it.
    """
    codes = q.view(np.uint8)
    values = np.empty(codes.shape, np.float32) if out is None else out
    if subnormals_flushed():                                           # the trick would zero codes 1..7
        return np.take(E4M3_VALUES, codes, out=values)
    bits = values.view(np.int32)
    np.copyto(bits, codes.view(np.int8))                               # sign bit copied to bits 8..31
    np.left_shift(bits, 20, out=bits)
    np.bitwise_and(bits, np.int32(0x87F0_0000 - (1 << 32)), out=bits)  # keep bit 31 and bits 20..26
    values *= np.float32(2.0 ** 120)
    # the NaN codes 0x7F/0xFF decode to ±480 here, and no finite E4M3 exceeds 448
    if values.size and (values.max() > 448.0 or values.min() < -448.0):
        nan = np.bitwise_and(codes, 0x7F) == 0x7F
        values[nan] = E4M3_VALUES[codes[nan]]
    return values


def dequantize_fp8(q: np.ndarray, scale: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """q float8_e4m3fn (or its bytes) [out, in], scale float32 [out] -> float32 [out, in] (into ``out``)."""
    assert q.ndim == 2 and scale.shape == (q.shape[0],)
    values = e4m3_to_f32(q, out)
    values *= scale.astype(np.float32, copy=False)[:, None]
    return values


def dequantize_nvfp4(packed: np.ndarray, block_scale: np.ndarray, global_scale,
                     out: np.ndarray | None = None) -> np.ndarray:
    """packed uint8 [out, in/2], block_scale float8_e4m3fn [out, in/16], global float32 -> float32
    [out, in] (into ``out`` if given)."""
    rows, half = packed.shape
    cols = 2 * half
    assert block_scale.shape == (rows, cols // NVFP4_BLOCK)
    values = np.empty((rows, cols), np.float32) if out is None else out
    np.take(_E2M1_BYTE_VALUES, packed, out=values.view(np.uint64))      # (out, in): e2m1 values
    block = e4m3_to_f32(block_scale)                                    # (out, in/16)
    blocks = values.reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)     # a view
    blocks *= block[..., None]                                          # exact
    values *= np.float32(global_scale)                                  # the one rounding
    return values


def _refuse(st: SafetensorsFile, name: str, problem: str, **details) -> None:
    raise Refusal("bundle_invalid", f"{st.path}: {name}: {problem}; the weights file is not a bundle this "
                  "runtime reads: rebuild the bundle", file=str(st.path), tensor=name, **details)


def _expect(st: SafetensorsFile, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    info = st.tensors.get(name)
    if info is None:
        _refuse(st, name, f"missing; expected {dtype}{list(shape)}")
    if info.dtype != dtype or info.shape != shape:
        _refuse(st, name, f"expected {dtype}{list(shape)}, found {info.dtype}{list(info.shape)}",
                expected=[dtype, list(shape)], found=[info.dtype, list(info.shape)])
    return st.get(name)


def load_dequantized(st: SafetensorsFile, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Bundle tensor file -> {name: float32}, for each base name (default: all but the scales).

    ``<m>.weight`` with ``<m>.weight_scale_2`` beside it is NVFP4, with only ``<m>.weight_scale``
    FP8 E4M3; anything else must be BF16/F16/F32. Inconsistent dtypes or shapes are a Refusal
    (``bundle_invalid``) naming the tensor.
    """
    if names is None:
        names = [n for n in st.names() if not n.endswith(("_scale", "_scale_2"))]
    out: dict[str, np.ndarray] = {}
    for name in names:
        info = st.tensors.get(name)
        if info is None:
            _refuse(st, name, "missing")
        if name + "_scale_2" in st.tensors:
            if len(info.shape) != 2:
                _refuse(st, name, f"an NVFP4 weight is U8 [out, in/2], found {info.dtype}{list(info.shape)}")
            rows, half = info.shape
            if (2 * half) % NVFP4_BLOCK:
                _refuse(st, name, f"NVFP4 input dimension {2 * half} is not a multiple of {NVFP4_BLOCK}")
            packed = _expect(st, name, "U8", (rows, half))
            block = _expect(st, name + "_scale", "F8_E4M3", (rows, 2 * half // NVFP4_BLOCK))
            global_ = _expect(st, name + "_scale_2", "F32", ())
            out[name] = dequantize_nvfp4(packed, block, global_[()])
        elif name + "_scale" in st.tensors:
            if len(info.shape) != 2:
                _refuse(st, name, f"an FP8 weight is F8_E4M3 [out, in], found {info.dtype}{list(info.shape)}")
            q = _expect(st, name, "F8_E4M3", info.shape)
            scale = _expect(st, name + "_scale", "F32", (info.shape[0],))
            out[name] = dequantize_fp8(q, scale)
        elif info.dtype in _HIGH_PRECISION:
            out[name] = st.get(name).astype(np.float32)
        else:
            _refuse(st, name, f"{info.dtype} without scale tensors; expected one of {', '.join(_HIGH_PRECISION)}",
                    found=info.dtype)
    return out
