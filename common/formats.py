"""The number formats, one registry each: weights (``WEIGHT_FORMATS``) and KV-cache elements (``KV_FORMATS``).

A format is one entry holding its one name (the same in the CLI, the contract and the kernels' entry
points; older spellings still read), its stored layout, quantize and dequantize, and the sizes the
planners and kernels need. Every stage asks the registry; no code outside this module compares a
format's name (tests/test_formats.py checks the tree). A backend that needs one routine per format
builds a ``per_format`` table, which refuses, at import, to miss a registered format.

Weight formats (the bundle layout: docs/bundle-format.md, "Weight formats"), for a decoder-layer
linear ``<m>.weight`` [out, in]:
  bf16      <m>.weight BF16 [out, in] (nothing is quantized: every tensor BF16)
  fp8_e4m3  <m>.weight F8_E4M3 [out, in], <m>.weight_scale F32 [out] (per output channel)
  nvfp4     <m>.weight U8 [out, in/2], <m>.weight_scale F8_E4M3 [out, in/16], <m>.weight_scale_2 F32 []
  fp32      float32 in memory only: unquantized checkpoints the CPU backend runs in tests; never in a bundle

KV-cache formats (docs/bundle-format.md, "KV cache pages"), one cached K or V element:
  bf16      bfloat16, rounded to nearest even
  fp8_e4m3  E4M3 code (int8 byte) of value * inv_scale, one scale per (layer, kv head) for K and for V
  fp32      float32 in memory only (the parity tests' exact pools); never in a bundle
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import ml_dtypes
import numpy as np

from toolcall.common import fp8, nvfp4

# (tensor name, safetensors dtype, shape) of one stored tensor
Spec = tuple[str, str, tuple[int, ...]]
# a tensor of the weights file by name (None where absent)
Getter = Callable[[str], "np.ndarray | None"]


@dataclass(frozen=True, eq=False)
class WeightFormat:
    """One weight format. A linear's input dimension must be a multiple of ``stored_multiple`` to be stored
    (NVFP4's 16-element blocks), and of ``kernel_multiple`` for the GPU kernels (one 16-byte vector a
    lane step: 16 FP8 codes, 32 NVFP4 codes, 8 bf16). ``bits_per_weight``: storage
    of one linear weight, scales included. ``companions``: the scale tensors' suffixes after the weight's
    own name, in file order (empty: no scale). ``in_bundles``: a build precision (fp32 is not).

    ``stored(name, shape)``: the weights file's (name, dtype, shape) for linear ``name`` [out, in], the
    weight then its companions. ``quantize(w, name, error)``: a linear weight (float32, float16 or
    bfloat16) -> its stored tensors by name in file order (``error``: a DequantError accumulating the
    dequantized values' error). ``dequantize(get, name)``: float32 [out, in] from the stored tensors
    (``get`` by name)."""

    name: str
    aliases: tuple[str, ...]
    quantized: bool
    bits_per_weight: float
    stored_multiple: int
    kernel_multiple: int
    companions: tuple[str, ...]
    stored: Callable[[str, tuple[int, int]], list[Spec]]
    quantize: Callable[..., dict[str, np.ndarray]]
    dequantize: Callable[[Getter, str], np.ndarray]
    in_bundles: bool = True

    def __repr__(self) -> str:
        return f"WeightFormat({self.name})"

    @property
    def kernel_prefix(self) -> str:
        """The GPU matvec entry points of this format: ``<name>_matvec``, ``<name>_matvec_rmsnorm``, ..."""
        return self.name


def _unquantized(dtype: str):
    def stored(name: str, shape: tuple[int, int]) -> list[Spec]:
        return [(name, dtype, tuple(shape))]

    def quantize(w: np.ndarray, name: str, error=None) -> dict[str, np.ndarray]:
        raise AssertionError(f"{name}: {dtype} weights are stored as they are, not quantized")

    def dequantize(get: Getter, name: str) -> np.ndarray:
        return get(name).astype(np.float32)
    return dict(stored=stored, quantize=quantize, dequantize=dequantize)


def _fp8_stored(name: str, shape: tuple[int, int]) -> list[Spec]:
    rows, cols = shape
    return [(name, "F8_E4M3", (rows, cols)), (name + "_scale", "F32", (rows,))]


def _fp8_quantize(w: np.ndarray, name: str, error=None) -> dict[str, np.ndarray]:
    q, scale = fp8.quantize_fp8(w, name, error=error)
    return {name: q, name + "_scale": scale}


def _nvfp4_stored(name: str, shape: tuple[int, int]) -> list[Spec]:
    rows, cols = shape
    return [(name, "U8", (rows, cols // 2)), (name + "_scale", "F8_E4M3", (rows, cols // nvfp4.BLOCK)),
            (name + "_scale_2", "F32", ())]


def _nvfp4_quantize(w: np.ndarray, name: str, error=None) -> dict[str, np.ndarray]:
    packed, block, global_ = nvfp4.quantize_nvfp4(w, name, error=error)
    return {name: packed, name + "_scale": block, name + "_scale_2": global_}


BF16 = WeightFormat("bf16", (), quantized=False, bits_per_weight=16, stored_multiple=1, kernel_multiple=8,
                    companions=(), **_unquantized("BF16"))
FP8_E4M3 = WeightFormat("fp8_e4m3", ("fp8",), quantized=True, bits_per_weight=8, stored_multiple=1,
                        kernel_multiple=16,
                        companions=("_scale",), stored=_fp8_stored, quantize=_fp8_quantize,
                        dequantize=lambda get, n: fp8.dequantize_fp8(get(n), get(n + "_scale")))
NVFP4 = WeightFormat("nvfp4", (), quantized=True, bits_per_weight=4 + 8 / nvfp4.BLOCK,
                     stored_multiple=nvfp4.BLOCK, kernel_multiple=32,
                     companions=("_scale", "_scale_2"), stored=_nvfp4_stored, quantize=_nvfp4_quantize,
                     dequantize=lambda get, n: nvfp4.dequantize_nvfp4(get(n), get(n + "_scale"),
                                                                      get(n + "_scale_2")[()]))
FP32 = WeightFormat("fp32", ("f32",), quantized=False, bits_per_weight=32, stored_multiple=1, kernel_multiple=4,
                    companions=(), in_bundles=False, **_unquantized("F32"))


@dataclass(frozen=True, eq=False)
class KvFormat:
    """One KV-cache element format: its numpy dtype (the host pools) and bytes per element.

    ``scaled``: elements are codes of value * inv_scale with one float32 scale per (layer, kv head) for K and
    one for V (calibrated by the builder, stored in the bundle's kv-scales.safetensors; inv_scale =
    float32(1 / scale)). ``encode(values, inv_scale)``: float32 (..., kv_heads, head_dim) -> stored elements;
    ``decode(stored, scale)``: -> float32, scale (kv_heads,) (unscaled formats ignore both)."""

    name: str
    aliases: tuple[str, ...]
    dtype: np.dtype
    encode: Callable[[np.ndarray, np.ndarray | None], np.ndarray]
    decode: Callable[[np.ndarray, np.ndarray | None], np.ndarray]
    scaled: bool = False
    in_bundles: bool = True

    def __repr__(self) -> str:
        return f"KvFormat({self.name})"

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


def _kv_cast(dtype):
    return dict(encode=lambda x, inv_scale=None: x.astype(dtype), decode=lambda q, scale=None: q.astype(np.float32))


def _kv_fp8_encode(x: np.ndarray, inv_scale: np.ndarray) -> np.ndarray:
    """E4M3 codes (int8 bytes) of x * inv_scale[:, None], saturated at +-448, round-to-nearest-even."""
    return fp8.encode_e4m3(x.astype(np.float32) * inv_scale.astype(np.float32)[:, None]).view(np.int8)


def _kv_fp8_decode(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return q.view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale.astype(np.float32)[:, None]


KV_BF16 = KvFormat("bf16", (), np.dtype(ml_dtypes.bfloat16), **_kv_cast(ml_dtypes.bfloat16))
KV_FP8_E4M3 = KvFormat("fp8_e4m3", ("fp8",), np.dtype(np.int8), encode=_kv_fp8_encode, decode=_kv_fp8_decode,
                       scaled=True)
KV_FP32 = KvFormat("fp32", ("f32",), np.dtype(np.float32), in_bundles=False,  # the parity tests' exact pools
                   **_kv_cast(np.float32))

F = TypeVar("F")


class Registry(Generic[F]):
    """Entries by name; ``get`` also reads the old spellings (aliases)."""

    def __init__(self, kind: str, entries: tuple[F, ...]):
        self.kind, self.entries = kind, entries
        self._by_name = {n: e for e in entries for n in (e.name, *e.aliases)}

    def get(self, name: str) -> F | None:
        return self._by_name.get(name)

    def __iter__(self):
        return iter(self.entries)

    @property
    def bundle_names(self) -> tuple[str, ...]:
        """The names a bundle may record (the build's choices), registry order."""
        return tuple(e.name for e in self.entries if e.in_bundles)

    def is_alias(self, name: str) -> bool:
        """An older spelling of an entry's name."""
        entry = self.get(name)
        return entry is not None and entry.name != name


WEIGHT_FORMATS: Registry[WeightFormat] = Registry("weight format", (FP8_E4M3, NVFP4, BF16, FP32))
KV_FORMATS: Registry[KvFormat] = Registry("KV-cache format", (KV_BF16, KV_FP8_E4M3, KV_FP32))

V = TypeVar("V")


def per_format(table: Mapping[WeightFormat, V], what: str, bundles_only: bool = False) -> dict[WeightFormat, V]:
    """``table`` (one value per weight format: a kernel, a layout), checked to cover every registered format
    (or every bundle format, ``bundles_only``): a new format fails here, naming ``what`` lacks it."""
    wanted = [f for f in WEIGHT_FORMATS if f.in_bundles or not bundles_only]
    missing = [f.name for f in wanted if f not in table]
    if missing:
        raise NotImplementedError(f"{what}: no entry for weight format(s) {', '.join(missing)}")
    return dict(table)


def format_of_linear(has: Callable[[str], bool], name: str) -> WeightFormat | None:
    """The quantized format whose companion tensors stand beside ``name`` in a weights file (the most
    companions first: NVFP4's ``_scale_2`` and ``_scale`` before FP8's ``_scale``); None: none does."""
    for f in sorted((f for f in WEIGHT_FORMATS if f.companions), key=lambda f: -len(f.companions)):
        if all(has(name + suffix) for suffix in f.companions):
            return f
    return None
