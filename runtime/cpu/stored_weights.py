"""The weights the fast CPU backend holds, in their stored format: ``StoredLinear`` (one matrix), ``StoredWeights``
(all of a model's tensors), ``load_stored`` (a bundle's weights file, checked tensor by tensor).

FP8 E4M3 + per-row scales, NVFP4 + block and global scales, bf16: NVFP4 and the embedding/head as zero-copy
views of the memory-mapped weights file; FP8/bf16/f32 linears repacked at load into output panels
(runtime/cpu/panel_kernels.py), one tensor at a time, the file's pages of each dropped once copied, and a
layer's q/k/v and gate/up panels joined side by side (one linear each; each output computed as before). The
process holds the contract's weight bytes, not a float32 copy.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from . import fast_kernels as fk, panel_kernels as pk
from .dequant import NVFP4_BLOCK, _expect, _refuse
from ..model_config import ModelConfig
from ..tensor_file import SafetensorsFile


@dataclass(frozen=True)
class StoredLinear:
    """One weight matrix as stored. kind: fp8 (weight int8 [out, in] E4M3 bytes, scale f32 [out]),
    nvfp4 (weight u8 [out, in/2], block u8 [out, in/16] E4M3 bytes, global_scale), bf16
    (weight u16 bits [out, in]) or f32 (weight f32 [out, in]). ``panel`` P > 0: weight repacked as
    [ceil(out/P), in, P] (the same element format), fp8 scale as [ceil(out/P) * P] of stored scale * 256."""

    kind: str
    weight: np.ndarray
    scale: np.ndarray | None = None
    block: np.ndarray | None = None
    global_scale: float = 1.0
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
            arrays += [a for a in (lin.weight, lin.scale, lin.block) if a is not None]
        return sum(a.nbytes for a in arrays) + 4 * sum(lin.kind == "nvfp4" for lin in self.linear.values())  # + f32 globals


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
    rows, cols = shape
    if has(name + "_scale_2"):
        if cols % NVFP4_BLOCK:
            raise AssertionError(f"{name}: NVFP4 input dimension {cols} is not a multiple of {NVFP4_BLOCK}")
        packed = get(name, "U8", (rows, cols // 2))
        block = get(name + "_scale", "F8_E4M3", (rows, cols // NVFP4_BLOCK))
        _no_nan_codes(st, name + "_scale", block)
        global_ = get(name + "_scale_2", "F32", ())
        return StoredLinear("nvfp4", packed.view(np.uint8), block=block.view(np.uint8),
                            global_scale=float(np.float32(global_[()])))
    if has(name + "_scale"):
        q = get(name, "F8_E4M3", shape)
        _no_nan_codes(st, name, q)
        scale = get(name + "_scale", "F32", (rows,))
        lin = StoredLinear("fp8", pk.repack(q.view(np.int8)), scale=pk.padded_scale(scale), panel=pk.PANEL)
    else:
        w = _high(_get_high(st, has, get, name, shape))
        lin = StoredLinear("bf16" if w.dtype == np.uint16 else "f32", pk.repack(w), panel=pk.PANEL)
    if st is not None:  # the panels are a copy: the file's pages of this tensor are no longer read
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
    kinds = {lin.kind for lin in parts}
    if (len(kinds) != 1 or any(lin.panel != pk.PANEL for lin in parts) or any(o % pk.PANEL for o in outs)
            or len({lin.bias is None for lin in parts}) != 1):
        return None
    scale = np.concatenate([lin.scale for lin in parts]) if parts[0].scale is not None else None
    bias = np.concatenate([lin.bias for lin in parts]) if parts[0].bias is not None else None
    return StoredLinear(parts[0].kind, np.concatenate([lin.weight for lin in parts]), scale=scale, bias=bias,
                        panel=pk.PANEL)
