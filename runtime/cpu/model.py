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
# Rows per matmul call. BLAS rounds a row differently with the number of rows beside it (1-2
# rows take a gemv path, small blocks other kernels), so a row's bits would depend on the batch
# and on how its prompt was chunked; fixed blocks of GEMM_ROWS rows (zero-padded) make every
# row's result independent of both: the same answers, bit for bit, with or without a shared prefix.
GEMM_ROWS = 16
KEY_BLOCK = 256  # keys per attention matmul (zero-padded), for the same reason


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (..., d) float32 normalized over the last axis, times weight (d,)."""
    var = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(var + np.float32(eps))) * weight


def blocked_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x (T, in) @ w (out, in).T as (T, out), computed GEMM_ROWS rows at a time (see GEMM_ROWS)."""
    t = len(x)
    pad = -t % GEMM_ROWS
    if pad:
        x = np.concatenate([x, np.zeros((pad, x.shape[1]), x.dtype)])
    # (blocks, GEMM_ROWS, in) @ (in, out): numpy calls one gemm of GEMM_ROWS rows per block
    return (x.reshape(-1, GEMM_ROWS, x.shape[1]) @ w.T).reshape(-1, w.shape[0])[:t]


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


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
        y = blocked_matmul(x, self.w[name + ".weight"])  # weight (out, in): BLAS reads it transposed, no copy
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
        """Causal grouped-query attention of each row over its own sequence's cached positions.

        Keys are taken KEY_BLOCK at a time (zero-padded), each block through a matmul of fixed
        shape, and block results are added in order: a row's result has the same bits whatever
        chunk it was computed in (masked and padded keys add exact zeros), see GEMM_ROWS.
        """
        cfg = self.cfg
        group, d, kvh = cfg.num_heads // cfg.num_kv_heads, cfg.head_dim, cfg.num_kv_heads
        out = np.empty((len(q), cfg.num_heads * d), np.float32)
        for slot in np.unique(slots):
            rows = np.nonzero(slots == slot)[0]
            pos = positions[rows]
            length = int(pos.max()) + 1
            keys, values = kv.gather(layer, int(slot), length)  # (length, kv_heads, head_dim)
            nb = -(-length // KEY_BLOCK)
            pad = ((0, nb * KEY_BLOCK - length), (0, 0), (0, 0))
            # (kv_heads, blocks, KEY_BLOCK, head_dim) and its transpose (kv_heads, blocks, head_dim, KEY_BLOCK)
            vb = np.ascontiguousarray(np.pad(values, pad).reshape(nb, KEY_BLOCK, kvh, d).transpose(2, 0, 1, 3))
            kb = np.ascontiguousarray(np.pad(keys, pad).reshape(nb, KEY_BLOCK, kvh, d).transpose(2, 0, 3, 1))
            r = len(rows) * group
            qb = -(-r // GEMM_ROWS) * GEMM_ROWS
            future = (np.arange(nb * KEY_BLOCK)[None, :] > pos[:, None]).repeat(group, axis=0)  # (r, S)
            qs = q[rows].reshape(len(rows), kvh, group, d).transpose(1, 0, 2, 3).reshape(kvh, r, d)
            qs = np.ascontiguousarray(np.pad(qs, ((0, 0), (0, qb - r), (0, 0)))).reshape(kvh, qb // GEMM_ROWS, 1,
                                                                                          GEMM_ROWS, d)
            # (kv_heads, row blocks, key blocks, GEMM_ROWS, KEY_BLOCK): one fixed-shape gemm per pair
            scores = (qs @ kb[:, None]).transpose(0, 1, 3, 2, 4).reshape(kvh, qb, nb * KEY_BLOCK)[:, :r] * self.scale
            scores = np.where(future[None], -np.inf, scores)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            # sums: fixed-length within a block, then blocks in order (cumsum is sequential)
            total = np.cumsum(scores.reshape(kvh, r, nb, KEY_BLOCK).sum(axis=-1), axis=-1)[..., -1:]
            p = np.ascontiguousarray(np.pad(scores / total, ((0, 0), (0, qb - r), (0, 0))))
            p = p.reshape(kvh, qb // GEMM_ROWS, GEMM_ROWS, nb, KEY_BLOCK).transpose(0, 1, 3, 2, 4)
            o = np.cumsum(np.ascontiguousarray(p) @ vb[:, None], axis=2)[:, :, -1]  # (kv_heads, row blocks, GEMM_ROWS, d)
            o = o.reshape(kvh, qb, d)[:, :r].reshape(kvh, len(rows), group, d).transpose(1, 0, 2, 3)
            out[rows] = o.reshape(len(rows), -1)
        return out

    def dense_logits(self, hidden: np.ndarray) -> np.ndarray:
        """(T, vocab) float32: every row of the head."""
        return blocked_matmul(hidden, self.head)

    def sparse_logits(self, hidden: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """(T, K) float32 logits of candidate token ids (T, K) only; padded entries may hold any valid id."""
        rows = self.head[candidates]  # (T, K, hidden)
        return np.einsum("tkh,th->tk", rows, hidden)
