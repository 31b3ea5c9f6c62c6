"""The CPU reference backend: the model's forward pass in numpy, float32 math throughout.

This is the source of truth every faster path is checked against. A step is a set of rows
(token, slot, position); rows of different sequences (decode rows and prefill chunks) share
one step. Weights are float32 arrays under their Hugging Face names.
"""
from __future__ import annotations

import numpy as np
import threadpoolctl

from .kv_pool import PagedKVPool
from ..model_config import ModelConfig
from ..rope import apply_rope, cos_sin, inv_freq


# BLAS threads of the process once a CpuModel exists. One: on a node shared with other work
# (the product's case), OpenBLAS's spinning worker threads lose whole time slices to the other
# processes; measured on this 2-core machine under load, a 0.6B decode step took 125 ms with one
# thread and 1,560 ms with two (bench/RESULTS.md). None leaves the process's setting alone.
DEFAULT_BLAS_THREADS = 1
# A linear layer is one BLAS matrix-vector product per row, always from the same two buffers.
# OpenBLAS picks its kernel by the matrix sizes (M=1 matrix-vector; small M*N*K a "small matrix"
# kernel whose sums change with M), so x @ W.T over the step's rows gives a row bits that depend
# on how many rows share the step. Per-row products do not; the fixed buffers keep the operands'
# alignment the same too. Measured faster than fixed 8-row matrix products here (those repack the
# whole weight every call): decode 0.3 vs 2 s/token on the 0.6B shape under load.


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (..., d) float32 normalized over the last axis, times weight (d,)."""
    var = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(var + np.float32(eps))) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def matmul_rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x (T, in) @ w (out, in).T -> (T, out) float32, one matrix-vector product per row (batch-independent bits)."""
    out = np.empty((len(x), w.shape[0]), np.float32)
    row, y = _row_buffers(w.shape[1], w.shape[0])
    for t in range(len(x)):
        row[:] = x[t]
        np.matmul(w, row, out=y)  # weight (out, in) C-contiguous: BLAS sgemv
        out[t] = y
    return out


_BUFFERS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def _row_buffers(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """The one (in,) input and (out,) output buffer for products of these sizes (same addresses every call)."""
    key = (n_in, n_out)
    if key not in _BUFFERS:
        _BUFFERS[key] = (np.zeros(n_in, np.float32), np.zeros(n_out, np.float32))
    return _BUFFERS[key]


class CpuModel:
    """Forward pass over rows, plus the dense head (all vocab rows) and the sparse head (given rows)."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray], blas_threads: int | None = DEFAULT_BLAS_THREADS):
        if blas_threads is not None:
            threadpoolctl.threadpool_limits(blas_threads, user_api="blas")  # process-wide, see above
        self.cfg = cfg
        self.w = weights
        self.embed = weights["model.embed_tokens.weight"]  # (vocab, hidden) float32
        self.head = self.embed if cfg.tie_word_embeddings else weights["lm_head.weight"]
        self.freqs = inv_freq(cfg)
        self.scale = np.float32(1.0 / np.sqrt(cfg.head_dim))

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        y = matmul_rows(x, self.w[name + ".weight"])
        bias = self.w.get(name + ".bias")
        return y + bias if bias is not None else y

    def forward(self, tokens: np.ndarray, slots: np.ndarray, positions: np.ndarray, kv: PagedKVPool,
                trace: list | None = None) -> np.ndarray:
        """Runs rows (T,) through every layer, writing their K/V into the pool; returns (T, hidden) after the final norm.

        ``trace``, if given, receives the residual stream's RMS after each layer (activation-range checks).
        """
        cfg = self.cfg
        t = len(tokens)
        x = self.embed[tokens]  # (T, hidden) float32 copy
        cos, sin = cos_sin(self.freqs, positions)
        for layer in range(cfg.num_layers):
            p = f"model.layers.{layer}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            q = self._linear(h, p + "self_attn.q_proj").reshape(t, cfg.num_heads, cfg.head_dim)
            k = self._linear(h, p + "self_attn.k_proj").reshape(t, cfg.num_kv_heads, cfg.head_dim)
            v = self._linear(h, p + "self_attn.v_proj").reshape(t, cfg.num_kv_heads, cfg.head_dim)
            if cfg.qk_norm:
                q = rms_norm(q, self.w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
                k = rms_norm(k, self.w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            kv.write(layer, slots, positions, k, v)
            attn = self._attention(layer, q, slots, positions, kv)  # (T, heads*head_dim)
            x = x + self._linear(attn, p + "self_attn.o_proj")
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            mlp = silu(self._linear(h, p + "mlp.gate_proj")) * self._linear(h, p + "mlp.up_proj")
            x = x + self._linear(mlp, p + "mlp.down_proj")
            if trace is not None:
                trace.append(float(np.sqrt(np.mean(x * x))))
        return rms_norm(x, self.w["model.norm.weight"], cfg.rms_norm_eps)

    def _attention(self, layer: int, q: np.ndarray, slots: np.ndarray, positions: np.ndarray,
                   kv: PagedKVPool) -> np.ndarray:
        """Causal grouped-query attention of each row over its own sequence's cached positions."""
        cfg = self.cfg
        group = cfg.num_heads // cfg.num_kv_heads
        out = np.empty((len(q), cfg.num_heads * cfg.head_dim), np.float32)
        # One row at a time over exactly its positions 0..pos: a row's sums never see another
        # row's length (a prefill chunk's longest row) nor its place in the step.
        for row in range(len(q)):
            keys, values = kv.gather(layer, int(slots[row]), int(positions[row]) + 1)  # (S, kv_heads, head_dim)
            qs = q[row].reshape(cfg.num_kv_heads, group, cfg.head_dim)
            scores = np.einsum("kgd,skd->kgs", qs, keys) * self.scale  # (kv_heads, group, S)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            out[row] = np.einsum("kgs,skd->kgd", scores, values).reshape(-1)
        return out

    def dense_logits(self, hidden: np.ndarray) -> np.ndarray:
        """(T, vocab) float32: every row of the head."""
        return matmul_rows(hidden, self.head)

    def sparse_logits(self, hidden: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """(T, K) float32 logits of candidate token ids (T, K) only; padded entries may hold any valid id."""
        rows = self.head[candidates]  # (T, K, hidden)
        # products then numpy's pairwise sum along the contiguous last axis: each logit's order
        # depends on hidden only (BLAS matrix-vector kernels change with K, the batch's widest row)
        return (rows * hidden[:, None, :]).sum(axis=-1)
