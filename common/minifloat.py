"""Float32 to and from the small floats of the weight formats: E4M3 "fn" (FP8 weights, NVFP4 block
scales) exactly, and the encoder E2M1 (NVFP4 values) shares; plus the checks every quantizer makes of
its source tensor.

Two encoders give the same bytes (tests compare them on every float32 pattern's upper 16 bits and on
adversarial values): ``fast=False`` is ml_dtypes' cast (~7 ns/element on the 2-core build machine), the
default lets float32 addition do the rounding and integer ops the rest (~1.3 ns/element), on row chunks
that stay in cache.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from toolcall.common.errors import QuantizeError

E4M3_MAX = 448.0
E4M3_MANTISSA_BITS = 3
E4M3_MIN_NORMAL_EXP = -6  # smallest normal 2^-6; subnormal step 2^-9
CHUNK_ELEMENTS = 1 << 17  # per row chunk: 512 KiB of float32 per scratch buffer, stays in L2/L3

_F32_ABS_MASK = np.uint32(0x7FFF_FFFF)
_F32_EXP_MASK = np.uint32(0x7F80_0000)


# code -> value, all 256 E4M3 "fn" bytes (0x7F and 0xFF are NaN).
E4M3_VALUES = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)

class MinifloatEncoder:
    """Exact float32 -> minifloat codes (round-to-nearest-even, saturating), on reusable scratch.

    For |x| in the binade [2^e, 2^(e+1)) with e >= e_min, the target's step is 2^(e-m) (m
    mantissa bits). M = 2^(e+23-m) is a float32 whose ULP is exactly that step, so the float32
    sum |x| + M is |x| rounded to the step with ties to even, and k = bits(sum) - bits(M) counts
    steps (2^m .. 2^(m+1)); the code is ((e - e_min) << m) + k. Below 2^e_min (the target's
    subnormals) the step stays 2^(e_min - m): e is raised to e_min, then the code is k itself.
    Saturation is a clamp of |x| to the largest finite value first. Inputs must not be NaN.
    """

    def __init__(self, mantissa_bits: int, min_normal_exp: int, max_value: float, capacity: int):
        self.shift = 23 - mantissa_bits
        self.capacity = capacity
        self._min_normal_bits = np.uint32((min_normal_exp + 127) << 23)
        # np.minimum/np.maximum are SIMD only with array operands here (scalar: 3x slower).
        self._max_bits = np.full(capacity, np.float32(max_value).view(np.uint32), np.uint32)
        self._min_exp = np.full(capacity, self._min_normal_bits, np.uint32)
        self._abs = np.empty(capacity, np.uint32)
        self._magic = np.empty(capacity, np.uint32)
        self._sum = np.empty(capacity, np.float32)

    def magnitude_codes(self, x: np.ndarray) -> np.ndarray:
        """x float32 (1-D, contiguous, no NaN) -> uint32 magnitude codes, a view of scratch."""
        n = x.size
        assert n <= self.capacity and x.dtype == np.float32
        a, magic, total = self._abs[:n], self._magic[:n], self._sum[:n]
        np.bitwise_and(x.view(np.uint32), _F32_ABS_MASK, out=a)           # |x| bits
        np.minimum(a, self._max_bits[:n], out=a)                           # saturate
        np.bitwise_and(a, _F32_EXP_MASK, out=magic)                        # 2^e
        np.maximum(magic, self._min_exp[:n], out=magic)                    # e >= e_min
        np.add(magic, np.uint32(self.shift << 23), out=magic)              # M = 2^(e + 23 - m)
        np.add(a.view(np.float32), magic.view(np.float32), out=total)      # RNE at step 2^(e-m)
        k = total.view(np.uint32)
        np.subtract(k, magic, out=k)                                       # steps, 0 .. 2^(m+1)
        np.subtract(magic, self._min_normal_bits + np.uint32(self.shift << 23), out=magic)
        np.right_shift(magic, np.uint32(self.shift), out=magic)            # (e - e_min) << m
        np.add(k, magic, out=k)
        return k


class E4M3Encoder(MinifloatEncoder):
    """float32 -> E4M3 "fn" bytes, identical to ``clip(x, ±448).astype(float8_e4m3fn)``."""

    def __init__(self, capacity: int):
        super().__init__(E4M3_MANTISSA_BITS, E4M3_MIN_NORMAL_EXP, E4M3_MAX, capacity)

    def encode(self, x: np.ndarray, out: np.ndarray) -> None:
        """x float32 (1-D, contiguous, no NaN) -> out uint8 (same length): sign bit 7, then |code|."""
        codes = self.magnitude_codes(x)
        sign = self._magic[: x.size]  # free again once magnitude_codes returned
        np.right_shift(x.view(np.uint32), np.uint32(24), out=sign)
        np.bitwise_and(sign, np.uint32(0x80), out=sign)                    # float32 sign -> bit 7, -0.0 too
        np.bitwise_or(codes, sign, out=out, casting="unsafe")              # codes < 0x80: fits a byte


def encode_e4m3(x: np.ndarray, fast: bool = True) -> np.ndarray:
    """Any-shape float32 (no NaN) -> float8_e4m3fn array, clamped to ±448, round-to-nearest-even."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if not fast:
        return np.clip(flat, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).reshape(x.shape)
    out = np.empty(flat.size, np.uint8)
    encoder = E4M3Encoder(min(CHUNK_ELEMENTS, max(flat.size, 1)))
    for start in range(0, flat.size, CHUNK_ELEMENTS):
        stop = min(flat.size, start + CHUNK_ELEMENTS)
        encoder.encode(flat[start:stop], out[start:stop])
    return out.view(ml_dtypes.float8_e4m3fn).reshape(x.shape)


SOURCE_FLOATS = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def check_weight(w: np.ndarray, name: str) -> np.ndarray:
    """The weight as a contiguous 2-D float32/float16/bfloat16 array, or a QuantizeError naming it.

    float16 and bfloat16 are widened to float32 chunk by chunk (exactly), so a checkpoint's
    memory-mapped tensor is quantized without a float32 copy of the whole tensor.
    """
    if not isinstance(w, np.ndarray) or w.dtype not in SOURCE_FLOATS or w.ndim != 2 or w.size == 0:
        found = f"{w.dtype}{list(w.shape)}" if isinstance(w, np.ndarray) else type(w).__name__
        raise QuantizeError("quantize_invalid", f"{name}: expected a non-empty 2-D float32, float16 or bfloat16 "
                            f"weight [out, in], found {found}; only linear weights are quantized",
                            tensor=name, found=found)
    return np.ascontiguousarray(w)


def rows_as_f32(w: np.ndarray, r0: int, r1: int, buffer: np.ndarray) -> np.ndarray:
    """w[r0:r1] as float32 [r1 - r0, in]: a view if w is float32, else widened into ``buffer``."""
    if w.dtype == np.float32:
        return w[r0:r1]
    x = buffer[: (r1 - r0) * w.shape[1]].reshape(r1 - r0, w.shape[1])
    np.copyto(x, w[r0:r1])
    return x


def raise_nonfinite(name: str, row: int) -> None:
    raise QuantizeError("quantize_invalid", f"{name}: row {row} holds NaN or Inf; a checkpoint tensor must be "
                        "finite: re-export the checkpoint from a healthy training step", tensor=name, row=row)


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
