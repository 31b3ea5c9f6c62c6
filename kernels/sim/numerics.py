"""Bit-exact float and integer semantics of the PTX instructions the kernels use, on numpy arrays.

Exact where the hardware is exact (IEEE round-to-nearest-even add / mul / fma / div / sqrt, the rounding
conversions): ``fma_f32`` rounds once (the f64 product of two f32 is exact; its sum with c is taken
exactly as TwoSum's (s, e), rounded to odd at 53 bits and then to f32, which is the single rounding, as
53 >= 24 + 2: jit.fma_rn). Float results that are NaN are the canonical NaN the hardware writes (f32 0x7FFFFFFF,
f16 / bf16 0x7FFF). Where PTX specifies no bits (``ex2.approx``) the model is the exact value rounded once;
callers report such instructions (``APPROXIMATE``).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from toolcall.kernels.sim.jit import fma_rn

F32, F64, F16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
NAN32 = np.uint32(0x7FFFFFFF)
NAN16 = np.uint16(0x7FFF)
APPROXIMATE = frozenset({"ex2.approx.ftz.f32"})

# PTX type suffix -> numpy dtype of its bits as an operand value (f16 and bf16 values travel as bits)
TYPES = {"pred": np.dtype(bool), "b8": np.dtype(np.uint8), "u8": np.dtype(np.uint8), "s8": np.dtype(np.int8),
         "b16": np.dtype(np.uint16), "u16": np.dtype(np.uint16), "s16": np.dtype(np.int16),
         "f16": np.dtype(np.uint16), "bf16": np.dtype(np.uint16),
         "b32": np.dtype(np.uint32), "u32": np.dtype(np.uint32), "s32": np.dtype(np.int32), "f32": F32,
         "f16x2": np.dtype(np.uint32), "bf16x2": np.dtype(np.uint32),
         "b64": np.dtype(np.uint64), "u64": np.dtype(np.uint64), "s64": np.dtype(np.int64), "f64": F64}
UNSIGNED = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
SIGNED = {1: np.dtype(np.int8), 2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}


def canonical_f32(x: np.ndarray) -> np.ndarray:
    """``x`` (float32) with every NaN as 0x7FFFFFFF."""
    nan = np.isnan(x)
    if nan.any():
        x = np.where(nan, NAN32.view(F32), x)
    return x


def fma_f32(a, b, c, rounding: str = "rn") -> np.ndarray:
    """a * b + c in float32 with one rounding: ``rn`` (nearest even: jit.fma_rn, lane by lane) or ``rm``
    (toward -inf)."""
    if rounding == "rn":
        if all(type(x) is np.ndarray and x.ndim == 1 and x.dtype == F32 and x.flags.c_contiguous for x in (a, b, c)) \
                and len(a) == len(b) == len(c):  # three registers' lanes (the usual case): as they are
            return fma_rn(a, b, c)
        a, b, c = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32), np.asarray(c, F32))
        return fma_rn(*(np.ascontiguousarray(x).reshape(-1) for x in (a, b, c))).reshape(a.shape)
    with np.errstate(all="ignore"):
        p = np.asarray(a, F64) * np.asarray(b, F64)  # exact: 24 + 24 bits
        c64 = np.asarray(c, F64)
        s = p + c64
        bb = s - p
        e = np.where(np.isfinite(s), (p - (s - bb)) + (c64 - bb), 0.0)
        r = s.astype(F32)
        r64 = r.astype(F64)
        above = (r64 - s > e) & np.isfinite(r64)  # r exceeds the exact sum (r - s is exact: Sterbenz)
        r = np.where(above, np.nextafter(r, np.float32(-np.inf)), r)
        # s overflowed f32 to +inf although the exact value is finite: round-down gives the largest finite
        r = np.where(np.isinf(r) & (r > 0) & np.isfinite(s), np.finfo(F32).max, r)
        # an exact zero sum is -0 toward -inf unless both addends are +0 (IEEE 754 6.3)
        both_pos0 = (p == 0) & (c64 == 0) & ~np.signbit(p) & ~np.signbit(c64)
        r = np.where((s == 0) & (e == 0) & ~both_pos0, np.float32(-0.0), r)
    return canonical_f32(np.asarray(r, F32))


def ftz_f32(x: np.ndarray) -> np.ndarray:
    """Subnormal float32 values flushed to sign-preserving zero."""
    x = np.asarray(x, F32)
    tiny = (np.abs(x) < np.finfo(F32).tiny) & (x != 0)
    return np.where(tiny, np.copysign(np.float32(0), x), x) if tiny.any() else x


def ex2_approx_ftz(x) -> np.ndarray:
    """ex2.approx.ftz.f32 modelled as 2^x exactly rounded once (the hardware is within 2 ulp)."""
    with np.errstate(all="ignore"):
        r = np.exp2(ftz_f32(x).astype(F64)).astype(F32)
    return canonical_f32(ftz_f32(r))


def max_f32(a, b, take_max: bool = True) -> np.ndarray:
    """max.f32 / min.f32: a NaN operand gives the other operand, two NaNs the canonical NaN; -0 < +0."""
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    ka = a.view(np.int32).astype(np.int64)
    kb = b.view(np.int32).astype(np.int64)
    # a total order on non-NaN floats that puts -0 below +0: sign-magnitude bits to a monotone integer
    oa = np.where(ka < 0, -(ka & 0x7FFFFFFF) - 1, ka)
    ob = np.where(kb < 0, -(kb & 0x7FFFFFFF) - 1, kb)
    pick_a = (oa >= ob) if take_max else (oa <= ob)
    r = np.where(pick_a, a, b)
    r = np.where(np.isnan(a), b, np.where(np.isnan(b), a, r))
    return canonical_f32(r)


def to_bf16_bits(x) -> np.ndarray:
    """cvt.rn.bf16.f32: nearest even, NaN canonical."""
    x = np.asarray(x, F32)
    bits = x.astype(BF16).view(np.uint16)
    return np.where(np.isnan(x), NAN16, bits)


def to_f16_bits(x) -> np.ndarray:
    """cvt.rn.f16.f32: nearest even (overflow to inf), NaN canonical."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        bits = x.astype(F16).view(np.uint16)
    return np.where(np.isnan(x), NAN16, bits)


def f16_bits_to_f32(bits) -> np.ndarray:
    return np.asarray(bits, np.uint16).view(F16).astype(F32)


def bf16_bits_to_f32(bits) -> np.ndarray:
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(F32)


def float_to_int(x, dtype: np.dtype, mode: str) -> np.ndarray:
    """cvt.{rni,rzi,rmi,rpi}.{s,u}NN.f32: round to an integer, saturate to the type's range, NaN -> 0."""
    x = np.asarray(x, F64)
    with np.errstate(all="ignore"):
        r = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[mode](x)
        info = np.iinfo(dtype)
        r = np.clip(np.where(np.isnan(r), 0, r), info.min, info.max)
    return r.astype(dtype)


def e4m3_pair_to_f16x2(bits16) -> np.ndarray:
    """cvt.rn.f16x2.e4m3x2: two E4M3 codes (low byte -> low half) to two exact f16 (NaN canonical)."""
    b = np.asarray(bits16, np.uint16)
    lo, hi = (b & 0xFF).astype(np.uint8), (b >> 8).astype(np.uint8)
    return (_E4M3_F16[hi].astype(np.uint32) << 16) | _E4M3_F16[lo]


def e2m1_pair_to_f16x2(bits8) -> np.ndarray:
    """cvt.rn.f16x2.e2m1x2: two E2M1 codes (low nibble -> low half) to two exact f16."""
    b = np.asarray(bits8).astype(np.uint32) & 0xFF
    return (_E2M1_F16[b >> 4].astype(np.uint32) << 16) | _E2M1_F16[b & 0xF]


def _e4m3_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(F32)
    return to_f16_bits(values).astype(np.uint32)


def _e2m1_table() -> np.ndarray:
    magnitudes = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], F32)
    values = np.concatenate([magnitudes, -magnitudes])
    return to_f16_bits(values).astype(np.uint32)


_E4M3_F16 = _e4m3_table()
_E2M1_F16 = _e2m1_table()
