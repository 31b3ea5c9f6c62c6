"""The fast CPU backend: the forward pass on the bundle's stored weights (kernels: runtime/cpu/panel_kernels.py,
linear_kernels.py, linear_high.py, attention_kernels.py, fast_kernels.py).

Weights stay in their stored format (FP8 E4M3 + per-row scales, NVFP4 + block and global scales, bf16):
NVFP4 and the embedding/head as zero-copy views of the memory-mapped weights file, FP8/bf16/f32 linears
repacked at load into output panels (runtime/cpu/panel_kernels.py), one tensor at a time, the file's
pages of each dropped once copied: the process holds the contract's weight bytes, not a float32 copy.
Activations are float32 in buffers allocated once for ``max_rows`` rows (the contract's workspace), KV
in the shared paged pool. Every kernel
computes a row independently of the step's other rows in a fixed reduction order, so a
sequence's logits have the same bits alone, in any batch and in any prefill chunking.
``CpuModel`` (runtime/cpu/model.py, numpy float32) stays the reference its tokens must equal.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numba
import numpy as np

from . import attention_kernels as ak, fast_kernels as fk
from . import linear_high as lh, linear_kernels as lk, panel_kernels as pk
from .dequant import NVFP4_BLOCK, _expect, _refuse
from .kv_pool import PagedKVPool
from ..model_config import ModelConfig
from ..rope import cos_sin, inv_freq
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


NO_NORM = np.empty(0, np.float32)  # qk_norm_rope_kv's "no q/k norm" (families without qk_norm)


def set_threads(threads: int | None) -> int:
    """numba's worker threads for the kernels (None: leave as is; the default is the machine's cores)."""
    if threads is not None:
        numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
    return numba.get_num_threads()


class FastCpuModel:
    """CpuModel's interface (forward over rows, dense and sparse heads) on stored weights, numba kernels."""

    def __init__(self, cfg: ModelConfig, weights: StoredWeights, max_rows: int = 0, max_context: int = 0,
                 threads: int | None = None):
        # numba's thread count is per calling thread: kept here, applied by forward on whichever thread runs it
        # (the server loads on one thread and steps on its engine thread)
        self.threads = set_threads(threads)
        self.cfg, self.weights = cfg, weights
        self.embed = weights.table["model.embed_tokens.weight"]  # (vocab, hidden) u16 bf16 bits or f32
        self.head = self.embed if cfg.tie_word_embeddings else weights.table["lm_head.weight"]
        self.eps = np.float32(cfg.rms_norm_eps)
        self.freqs = inv_freq(cfg)
        self.scale = np.float32(1.0 / np.sqrt(cfg.head_dim))
        self.layers = []
        v, lin = weights.vectors, weights.linear
        for layer in range(cfg.num_layers):
            p = f"model.layers.{layer}."
            self.layers.append(dict(
                in_norm=v[p + "input_layernorm.weight"], post_norm=v[p + "post_attention_layernorm.weight"],
                q_norm=v.get(p + "self_attn.q_norm.weight"), k_norm=v.get(p + "self_attn.k_norm.weight"),
                q=lin[p + "self_attn.q_proj"], k=lin[p + "self_attn.k_proj"], v=lin[p + "self_attn.v_proj"],
                o=lin[p + "self_attn.o_proj"], gate=lin[p + "mlp.gate_proj"], up=lin[p + "mlp.up_proj"],
                down=lin[p + "mlp.down_proj"]))
        self.final_norm = v["model.norm.weight"]
        self._rows = 0
        self._context = 0
        self._reserve(max_rows, max_context)

    def _reserve(self, rows: int, context: int) -> None:
        """Step buffers for ``rows`` rows and contexts of ``context`` positions (the contract's workspace)."""
        rows, context = max(rows, self._rows), max(context, self._context)
        if rows == self._rows and context == self._context:
            return
        cfg = self.cfg
        h, i = cfg.hidden_size, cfg.intermediate_size
        f = np.float32
        self.ws = dict(hidden=np.zeros((rows, h), f), normed=np.zeros((rows, h), f),
                       q=np.zeros((rows, cfg.q_dim), f), k=np.zeros((rows, cfg.kv_dim), f),
                       v=np.zeros((rows, cfg.kv_dim), f), attn_out=np.zeros((rows, cfg.q_dim), f),
                       gate=np.zeros((rows, i), f), up=np.zeros((rows, i), f),
                       attn_scores=np.zeros((rows, cfg.num_heads, context), f))
        for a in self.ws.values():
            a.fill(0)  # calloc'd pages made resident: the model holds its workspace from the start
        self._rows, self._context = rows, context

    @property
    def workspace_bytes(self) -> int:
        return sum(a.nbytes for a in self.ws.values())

    def linear(self, lin: StoredLinear, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """y (T, out) = x (T, in) @ W.T (+ bias), on the stored format."""
        if lin.kind == "nvfp4":
            lk.linear_nvfp4(x, lin.weight, lin.block, np.float32(lin.global_scale), y)
        elif lin.kind == "fp8":
            pk.linear_fp8_panels(x, lin.weight, lin.scale, y)
        elif lin.kind == "bf16":
            pk.linear_bf16_panels(x, lin.weight, y)
        else:
            pk.linear_f32_panels(x, lin.weight, y)
        if lin.bias is not None:
            y += lin.bias
        return y

    def _norm(self, x: np.ndarray, weight: np.ndarray, out: np.ndarray) -> np.ndarray:
        fk.rms_norm(x.reshape(-1, x.shape[-1]), weight, self.eps, out.reshape(-1, x.shape[-1]))
        return out

    def forward(self, tokens: np.ndarray, slots: np.ndarray, positions: np.ndarray, kv: PagedKVPool,
                trace: list | None = None) -> np.ndarray:
        """Runs rows (T,) through every layer, writing their K/V into the pool; returns (T, hidden) after the final norm."""
        cfg = self.cfg
        if numba.get_num_threads() != self.threads:
            numba.set_num_threads(self.threads)
        t = len(tokens)
        positions = np.ascontiguousarray(positions, np.int64)
        slots = np.ascontiguousarray(slots, np.int64)
        self._reserve(t, int(positions.max()) + 1 if t else 0)
        ws = {name: a[:t] for name, a in self.ws.items()}
        x, h = ws["hidden"], ws["normed"]
        self.embed_rows(np.ascontiguousarray(tokens, np.int64), x)
        cos, sin = cos_sin(self.freqs, positions)
        kv_rows = kv.rows_at(slots, positions)  # (pages, offsets) (T,) int64, checked once for every layer
        q3 = ws["q"].reshape(t, cfg.num_heads, cfg.head_dim)
        k3 = ws["k"].reshape(t, cfg.num_kv_heads, cfg.head_dim)
        v3 = ws["v"].reshape(t, cfg.num_kv_heads, cfg.head_dim)
        for layer, w in enumerate(self.layers):
            self._norm(x, w["in_norm"], h)
            self.linear(w["q"], h, ws["q"])
            self.linear(w["k"], h, ws["k"])
            self.linear(w["v"], h, ws["v"])
            kp, vp = kv.k[layer], kv.v[layer]
            if kp.dtype != np.float32:
                kp, vp = kp.view(np.uint16), vp.view(np.uint16)
            qn, kn = (w["q_norm"], w["k_norm"]) if cfg.qk_norm else (NO_NORM, NO_NORM)
            fk.qk_norm_rope_kv(q3, k3, v3, qn, kn, self.eps, cos, sin, kp, vp, *kv_rows)
            ak.attention(q3, kp, vp, kv.block_table, slots, positions, self.scale, ws["attn_scores"],
                         ws["attn_out"])
            x += self.linear(w["o"], ws["attn_out"], h)
            self._norm(x, w["post_norm"], h)
            self.linear(w["gate"], h, ws["gate"])
            self.linear(w["up"], h, ws["up"])
            fk.silu_times(ws["gate"], ws["up"])
            x += self.linear(w["down"], ws["gate"], h)
            if trace is not None:
                trace.append(float(np.sqrt(np.mean(x * x))))
        out = np.empty_like(x)
        return self._norm(x, self.final_norm, out)

    def embed_rows(self, tokens: np.ndarray, out: np.ndarray) -> np.ndarray:
        if self.embed.dtype == np.uint16:
            fk.gather_rows_bf16(self.embed, tokens, out)
        else:
            out[:] = self.embed[tokens]
        return out

    def dense_logits(self, hidden: np.ndarray) -> np.ndarray:
        """(T, vocab) float32: every row of the head."""
        hidden = np.ascontiguousarray(hidden, np.float32)
        out = np.empty((hidden.shape[0], self.head.shape[0]), np.float32)
        if self.head.dtype == np.uint16:
            lh.linear_bf16(hidden, self.head, out)
        else:
            lh.linear_f32(hidden, self.head, out)
        return out

    def sparse_logits(self, hidden: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """(T, K) float32 logits of candidate token ids (T, K) only; bit-equal to dense_logits' entries."""
        hidden = np.ascontiguousarray(hidden, np.float32)
        cand = np.ascontiguousarray(candidates, np.int64)
        out = np.empty(cand.shape, np.float32)
        if self.head.dtype == np.uint16:
            lh.candidate_logits_bf16(hidden, self.head, cand, out)
        else:
            lh.candidate_logits_f32(hidden, self.head, cand, out)
        return out
