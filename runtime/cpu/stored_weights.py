"""The weights the fast CPU backend holds, in their stored format: ``StoredLinear`` (one matrix), ``StoredWeights``
(all of a model's tensors), ``load_stored`` (a bundle's weights file, checked tensor by tensor), and per
weight format (common/formats.py) how a linear is held and which kernel runs it (``LAYOUTS``).

FP8 E4M3 + per-row scales, NVFP4 + block and global scales, bf16: NVFP4 and the embedding/head as zero-copy
views of the memory-mapped weights file; FP8/bf16/f32 linears repacked at load into output panels
(runtime/cpu/panel_kernels.py), one tensor at a time, the file's pages of each dropped once copied, and a
layer's q/k/v and gate/up panels joined side by side (one linear each; each output computed as before). The
process holds the contract's weight bytes, not a float32 copy.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from toolcall.common.formats import BF16, FP8_E4M3, FP32, NVFP4, WeightFormat, format_of_linear, per_format
from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.bundle.tensor_file import SafetensorsFile
from toolcall.runtime.cpu import fast_kernels as fk
from toolcall.runtime.cpu import linear_kernels as lk
from toolcall.runtime.cpu import panel_kernels as pk
from toolcall.runtime.cpu.dequant import _expect, _refuse
from toolcall.runtime.jit.one_layout import AnyLayout


@dataclass(frozen=True)
class StoredLinear:
    """One weight matrix as stored, in weight format ``fmt``: FP8_E4M3 (weight int8 [out, in] E4M3 bytes,
    scale f32 [out]), NVFP4 (weight u8 [out, in/2], block u8 [out, in/16] E4M3 bytes, global_scale f32 []),
    BF16 (weight u16 bits [out, in]) or FP32 (weight f32 [out, in]). ``panel`` P > 0: weight repacked as
    [ceil(out/P), in, P] (the same element format), fp8 scale as [ceil(out/P) * P] of stored scale * 256."""

    fmt: WeightFormat
    weight: np.ndarray
    scale: np.ndarray | None = None
    block: np.ndarray | None = None
    global_scale: np.ndarray | None = None
    bias: np.ndarray | None = None  # f32 [out]
    panel: int = 0


def _high(a: np.ndarray) -> np.ndarray:
    """A high-precision tensor as the kernels read it: bf16 as its u16 bits (no copy), f16 widened."""
    if a.dtype.name == "bfloat16":
        return a.view(np.uint16)
    if a.dtype == np.float32:
        return a
    return a.astype(np.float32)


def _as_f32(a: np.ndarray) -> np.ndarray:
    """Small vectors (norms, biases) as float32 copies, exactly."""
    return np.ascontiguousarray(a).astype(np.float32)


class StoredWeights:
    """The model's tensors as stored: ``linear[name]`` StoredLinear, ``vectors[name]`` f32, ``table[name]``
    bf16 bits or f32 (embedding, untied head). ``nbytes``: bytes of the weight arrays held."""

    def __init__(self, cfg: ModelConfig, linear: dict, vectors: dict, table: dict, keep_alive=None):
        self.cfg, self.linear, self.vectors, self.table = cfg, linear, vectors, table
        self._keep_alive = keep_alive  # the open tensor file whose map the views point into

    @classmethod
    def from_arrays(cls, cfg: ModelConfig, arrays: dict[str, np.ndarray]) -> "StoredWeights":
        """From in-memory arrays under Hugging Face names (bf16/f32 checkpoints, or quantized
        tensors with their ``_scale``/``_scale_2`` beside them, dtypes as in a bundle)."""
        return cls._build(cfg, lambda n: n in arrays, lambda n, _dtype, _shape: arrays[n])

    @classmethod
    def from_file(cls, cfg: ModelConfig, st: SafetensorsFile) -> "StoredWeights":
        """From a bundle's weights file, checked tensor by tensor (Refusal ``bundle_invalid``): views of its map,
        fp8/bf16/f32 linears repacked into panels."""
        def get(name, dtype, shape):
            return _expect(st, name, dtype, shape)
        return cls._build(cfg, lambda n: n in st.tensors, get, st)

    @classmethod
    def _build(cls, cfg, has, get, st=None) -> "StoredWeights":
        linear, vectors, table = {}, {}, {}
        shapes = cfg.tensor_shapes()
        for name, shape in shapes.items():
            if len(shape) == 1:
                vectors[name] = _as_f32(_get_high(st, has, get, name, shape))
            elif name in ("model.embed_tokens.weight", "lm_head.weight"):
                table[name] = _high(_get_high(st, has, get, name, shape))
            else:
                linear[name[: -len(".weight")]] = _linear_from(st, has, get, name, shape)
        for name in list(linear):  # biases are listed after their weight: attach them now
            b = vectors.get(name + ".bias")
            if b is not None:
                linear[name] = StoredLinear(**{**linear[name].__dict__, "bias": b})
        for layer in range(cfg.num_layers):
            p = f"model.layers.{layer}."
            for joined, parts in JOINS:
                lin = join_panels([linear[p + n] for n in parts], [shapes[p + n + ".weight"][0] for n in parts])
                if lin is not None:
                    linear[p + joined] = lin
                    for n in parts:
                        del linear[p + n]
        return cls(cfg, linear, vectors, table, st)

    @property
    def nbytes(self) -> int:
        arrays = [a for a in self.table.values()] + list(self.vectors.values())
        for lin in self.linear.values():
            arrays += [a for a in (lin.weight, lin.scale, lin.block, lin.global_scale) if a is not None]
        return sum(a.nbytes for a in arrays)


def _get_high(st, has, get, name, shape):
    if not has(name):
        if st is not None:
            _refuse(st, name, f"missing; expected BF16{list(shape)}")
        raise KeyError(f"{name}: missing; expected BF16{list(shape)}")
    if st is not None:
        dtype = st.tensors[name].dtype
        if dtype not in ("BF16", "F32", "F16"):
            _refuse(st, name, f"{dtype} without scale tensors; expected BF16, F16 or F32", found=dtype)
        return get(name, dtype, shape)
    return get(name, None, shape)


def _linear_from(st, has, get, name, shape) -> StoredLinear:
    fmt = format_of_linear(has, name)
    if fmt is None:  # unquantized: as the tensor is stored (f16 widened to f32)
        w = _high(_get_high(st, has, get, name, shape))
        fmt, tensors = (BF16 if w.dtype == np.uint16 else FP32), [w]
    else:
        if shape[1] % fmt.stored_multiple:
            raise AssertionError(f"{name}: {fmt.name} input dimension {shape[1]} is not a multiple of "
                                 f"{fmt.stored_multiple}")
        tensors = [get(n, dtype, s) for n, dtype, s in fmt.stored(name, shape)]
    lin = LAYOUTS[fmt].load(st, name, *tensors)
    if st is not None and lin.panel:  # the panels are a copy: the file's pages of this tensor are no longer read
        st.release(name)
    return lin


def _no_nan_codes(st, name, e4m3) -> None:
    """E4M3 NaN codes are never written by the builder (it clamps to 448); one means a damaged or
    forged bundle, which the kernels would read as +-480 rather than NaN: refuse it by name."""
    n = fk.e4m3_nan_codes(np.ascontiguousarray(e4m3).view(np.uint8))
    if n:
        if st is None:
            raise ValueError(f"{name}: {n} E4M3 NaN codes")
        _refuse(st, name, f"holds {n} E4M3 NaN codes (the builder writes none): the weights are damaged")


def load_stored(weights_path: str | os.PathLike, cfg: ModelConfig) -> StoredWeights:
    """A bundle's weights file as StoredWeights (memory-mapped; the map lives as long as the views)."""
    return StoredWeights.from_file(cfg, SafetensorsFile(weights_path))


# A layer's linears over the same input, joined into one (FastCpuModel reads the joined name when present).
JOINS = (("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
         ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")))


def join_panels(parts: list[StoredLinear], outs: list[int]) -> StoredLinear | None:
    """One linear whose outputs are the parts' side by side, or None where they cannot be joined (not all in
    panels of one format, an output count ``outs`` not a multiple of the panel width, biases on some only).
    Panels hold whole output columns, so each output is computed exactly as in its part: the same bits."""
    formats = {lin.fmt for lin in parts}
    if (len(formats) != 1 or any(lin.panel != pk.PANEL for lin in parts) or any(o % pk.PANEL for o in outs)
            or len({lin.bias is None for lin in parts}) != 1):
        return None
    scale = np.concatenate([lin.scale for lin in parts]) if parts[0].scale is not None else None
    bias = np.concatenate([lin.bias for lin in parts]) if parts[0].bias is not None else None
    return StoredLinear(parts[0].fmt, np.concatenate([lin.weight for lin in parts]), scale=scale, bias=bias,
                        panel=pk.PANEL)


@dataclass(frozen=True)
class Layout:
    """How the fast backend holds one weight format's linears and runs them. ``load(st or None, name, *tensors)``:
    the StoredLinear from the format's stored tensors in file order (the weight, then its companions; an
    unquantized weight as the kernels read it: bf16 as u16 bits, f32); ``run(lin, x, y)``: y (T, out) =
    x (T, in) @ W.T, f32."""

    load: Callable[..., StoredLinear]
    run: Callable[[StoredLinear, np.ndarray, np.ndarray], None]


NO_SCALE = np.empty(0, np.float32)  # linear_panels' scale of unscaled panels


def _fp8_panels(st, name, q, scale) -> StoredLinear:
    _no_nan_codes(st, name, q)
    return StoredLinear(FP8_E4M3, pk.repack(q.view(np.int8)), scale=pk.padded_scale(scale), panel=pk.PANEL)


def _nvfp4_rows(st, name, packed, block, global_) -> StoredLinear:
    _no_nan_codes(st, name + "_scale", block)
    return StoredLinear(NVFP4, packed.view(np.uint8), block=block.view(np.uint8),
                        global_scale=np.array(global_, np.float32))


def _panels(fmt: WeightFormat):
    return lambda st, name, w: StoredLinear(fmt, pk.repack(w), panel=pk.PANEL)


# x is read by its row stride: the gate half of gate|up (strided) and a full buffer (C-contiguous) share one compile
_linear_panels = AnyLayout(pk.linear_panels, positions=(0,))


def _run_panels(lin: StoredLinear, x: np.ndarray, y: np.ndarray) -> None:
    _linear_panels(x, lin.weight, NO_SCALE if lin.scale is None else lin.scale, y)


def _run_nvfp4(lin: StoredLinear, x: np.ndarray, y: np.ndarray) -> None:
    lk.linear_nvfp4(x, lin.weight, lin.block, lin.global_scale[()], y)


LAYOUTS = per_format({FP8_E4M3: Layout(_fp8_panels, _run_panels), NVFP4: Layout(_nvfp4_rows, _run_nvfp4),
                      BF16: Layout(_panels(BF16), _run_panels), FP32: Layout(_panels(FP32), _run_panels)},
                     "the fast CPU backend's weight layouts")
