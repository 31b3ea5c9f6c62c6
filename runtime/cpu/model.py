"""The CPU reference backend: the model's forward pass in numpy, float32 math throughout.

This is the source of truth every faster path is checked against. A step is a set of rows
(token, slot, position); rows of different sequences (decode rows and prefill chunks) share
one step. Weights are float32 arrays under their Hugging Face names.
"""
from __future__ import annotations

import functools

import numpy as np
import threadpoolctl

from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.bundle.rope import apply_rope, cos_sin, inv_freq
from toolcall.runtime.cpu.backend import CpuBackend
from toolcall.runtime.cpu.kv_pool import PagedKVPool

# BLAS threads of the process once a CpuModel exists. One: on a node shared with other work
# (the product's case), OpenBLAS's spinning worker threads lose whole time slices to the other
# processes; measured on this 2-core machine under load, a 0.6B decode step took 125 ms with one
# thread and about 1,550 ms with two. None leaves the process's setting alone.
DEFAULT_BLAS_THREADS = 1
# Rows per matmul call. BLAS rounds a row differently with the number of rows beside it (1-2
# rows take a gemv path, small blocks other kernels), and on some kernels with the row's place in
# the block (OpenBLAS's Haswell/Zen sgemm: in a 16-row block rows 0-5 round one way, 6-15
# another), so a row's bits would depend on the batch and on how its prompt was chunked. So every
# row goes one of two fixed ways, chosen by the row alone: prompt rows in zero-padded blocks of
# gemm_rows (gemm), answer rows (positions at or past the slot's prompt length,
# PageAllocator.prompt_tokens) one by one (gemv: a decode step stays memory-bound, and at small
# batch gemm costs ~5x gemv). gemm_rows is the largest of GEMM_ROWS_CHOICES at which this
# machine's BLAS gives a row the same bits at every place in the block, probed per matmul shape
# (stable_gemm_rows). Same answers, bit for bit, with or without a shared prefix, in any batch.
GEMM_ROWS_CHOICES = (16, 8, 4, 2, 1)
KEY_BLOCK = 64  # keys per attention matmul (zero-padded), for the same reason

def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (..., d) float32 normalized over the last axis, times weight (d,)."""
    var = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(var + np.float32(eps))) * weight


def _row_stable(rows: int, k: int, n: int, b_transposed: bool) -> bool:
    """Whether (rows, k) @ (k, n) gives a row the same bits at every place in the block, whatever
    the other rows hold (random data, fixed seed; b as the callers pass it: w.T of an (n, k) array,
    or an (k, n) array)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows + 1, k), dtype=np.float32)
    b = rng.standard_normal((n, k), dtype=np.float32).T if b_transposed else rng.standard_normal((k, n), dtype=np.float32)
    first = (x[:rows] @ b)[0]
    for place in range(1, rows):
        block = x[1:].copy()  # other rows differ from the first block's
        block[place] = x[0]
        if not np.array_equal((block @ b)[place], first):
            return False
    return True


@functools.lru_cache(maxsize=None)
def stable_gemm_rows(shapes: tuple[tuple[int, int, bool], ...]) -> int:
    """The largest of GEMM_ROWS_CHOICES row-stable (see _row_stable) for every (k, n, b_transposed)."""
    return next(m for m in GEMM_ROWS_CHOICES if all(_row_stable(m, *shape) for shape in shapes))


def blocked_matmul(x: np.ndarray, w: np.ndarray, rows: int) -> np.ndarray:
    """x (T, in) @ w (out, in).T as (T, out), computed ``rows`` rows at a time (see GEMM_ROWS_CHOICES)."""
    t = len(x)
    pad = -t % rows
    if pad:
        x = np.concatenate([x, np.zeros((pad, x.shape[1]), x.dtype)])
    # (blocks, rows, in) @ (in, out): numpy calls one gemm of ``rows`` rows per block
    return (x.reshape(-1, rows, x.shape[1]) @ w.T).reshape(-1, w.shape[0])[:t]


def rowwise_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x (T, in) @ w (out, in).T as (T, out), one row per BLAS call (see GEMM_ROWS_CHOICES)."""
    return (x[:, None, :] @ w.T)[:, 0]


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


class CpuModel(CpuBackend):
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
        linears = {(w.shape[1], w.shape[0], True) for name, w in weights.items()
                   if name.endswith("_proj.weight") and w.ndim == 2}  # x @ w.T, w (out, in)
        attention = {(cfg.head_dim, KEY_BLOCK, True), (KEY_BLOCK, cfg.head_dim, False)}  # q @ k.T, p @ v
        self.gemm_rows = stable_gemm_rows(tuple(sorted(linears | attention)))  # see GEMM_ROWS_CHOICES

    def _linear(self, x: np.ndarray, name: str, answer_rows: np.ndarray | None = None) -> np.ndarray:
        """x (T, in) through a linear layer; ``answer_rows`` (T,) bool picks the one-by-one rows (GEMM_ROWS_CHOICES)."""
        w = self.w[name + ".weight"]  # (out, in): BLAS reads it transposed, no copy
        if answer_rows is None or not answer_rows.any():
            y = blocked_matmul(x, w, self.gemm_rows)
        elif answer_rows.all():
            y = rowwise_matmul(x, w)
        else:
            y = np.empty((len(x), w.shape[0]), np.float32)
            y[~answer_rows] = blocked_matmul(x[~answer_rows], w, self.gemm_rows)
            y[answer_rows] = rowwise_matmul(x[answer_rows], w)
        bias = self.w.get(name + ".bias")
        return y + bias if bias is not None else y

    def forward(self, tokens: np.ndarray, slots: np.ndarray, positions: np.ndarray, kv: PagedKVPool,
                trace: list | None = None, outputs: np.ndarray | None = None) -> np.ndarray:
        """Runs rows (T,) through every layer, writing their K/V into the pool; returns (T, hidden) after the final norm.

        ``trace``, if given, receives the residual stream's RMS after each layer (activation-range checks).
        ``outputs`` (R,) row indices: only those rows' hidden states are returned, (R, hidden).
        """
        cfg = self.cfg
        t = len(tokens)
        prompt_tokens = getattr(kv, "prompt_tokens", None)  # (slots,) int64; huge where unknown
        answer = positions >= prompt_tokens[slots] if prompt_tokens is not None else None  # (T,) see GEMM_ROWS_CHOICES
        x = self.embed[tokens]  # (T, hidden) float32 copy
        cos, sin = cos_sin(self.freqs, positions)
        for layer in range(cfg.num_layers):
            p = f"model.layers.{layer}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            q = self._linear(h, p + "self_attn.q_proj", answer).reshape(t, cfg.num_heads, cfg.head_dim)
            k = self._linear(h, p + "self_attn.k_proj", answer).reshape(t, cfg.num_kv_heads, cfg.head_dim)
            v = self._linear(h, p + "self_attn.v_proj", answer).reshape(t, cfg.num_kv_heads, cfg.head_dim)
            if cfg.qk_norm:
                q = rms_norm(q, self.w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
                k = rms_norm(k, self.w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            kv.write(layer, slots, positions, k, v)
            attn = self._attention(layer, q, slots, positions, kv)  # (T, heads*head_dim)
            x = x + self._linear(attn, p + "self_attn.o_proj", answer)
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            mlp = silu(self._linear(h, p + "mlp.gate_proj", answer)) * self._linear(h, p + "mlp.up_proj", answer)
            x = x + self._linear(mlp, p + "mlp.down_proj", answer)
            if trace is not None:
                trace.append(float(np.sqrt(np.mean(x * x))))
        x = x if outputs is None else x[outputs]
        return rms_norm(x, self.w["model.norm.weight"], cfg.rms_norm_eps)

    def _attention(self, layer: int, q: np.ndarray, slots: np.ndarray, positions: np.ndarray,
                   kv: PagedKVPool) -> np.ndarray:
        """Causal grouped-query attention of each row over its own sequence's cached positions.

        Keys are taken KEY_BLOCK at a time (zero-padded) and query rows gemm_rows at a time, each
        pair through a matmul of fixed shape; softmax sums are fixed-length within a key block,
        then added block after block (cumsum is sequential), and so are the outputs: a row's
        result has the same bits whatever chunk it was computed in (masked and padded keys add
        exact zeros), see GEMM_ROWS_CHOICES.
        """
        cfg = self.cfg
        group, d, kvh, kb_ = cfg.num_heads // cfg.num_kv_heads, cfg.head_dim, cfg.num_kv_heads, KEY_BLOCK
        gr = self.gemm_rows
        out = np.empty((len(q), cfg.num_heads * d), np.float32)
        for slot in np.unique(slots):
            rows = np.nonzero(slots == slot)[0]
            pos = positions[rows]
            length = int(pos.max()) + 1
            keys, values = kv.gather(layer, int(slot), length)  # (length, kv_heads, head_dim)
            nb = -(-length // kb_)
            kp = np.zeros((kvh, nb * kb_, d), np.float32)  # (kv_heads, blocks * KEY_BLOCK, head_dim)
            vp = np.zeros((kvh, nb * kb_, d), np.float32)
            kp[:, :length] = keys.transpose(1, 0, 2)
            vp[:, :length] = values.transpose(1, 0, 2)
            r = len(rows) * group  # query rows (row, query head of a kv head), row-major
            qb = -(-r // gr)
            qp = np.zeros((kvh, qb * gr, d), np.float32)
            qp[:, :r] = q[rows].reshape(len(rows), kvh, group, d).transpose(1, 0, 2, 3).reshape(kvh, r, d)
            row_pos = np.full(qb * gr, nb * kb_, np.int64)  # padding rows see every key (no NaN)
            row_pos[:r] = pos.repeat(group)
            # (kv_heads, row blocks, key blocks, gr, KEY_BLOCK): one fixed-shape gemm per pair
            scores = qp.reshape(kvh, qb, 1, gr, d) @ kp.reshape(kvh, 1, nb, kb_, d).swapaxes(-1, -2)
            future = (np.arange(nb * kb_).reshape(1, nb, 1, kb_)
                      > row_pos.reshape(qb, 1, gr, 1))  # (row blocks, key blocks, gr, KEY_BLOCK)
            scores = np.where(future, -np.inf, scores * self.scale)
            scores = np.exp(scores - scores.max(axis=(2, 4), keepdims=True))
            total = np.cumsum(scores.sum(axis=-1, keepdims=True), axis=2)[:, :, -1:]  # blocks in order
            o = (scores / total) @ vp.reshape(kvh, 1, nb, kb_, d)  # (kv_heads, row blocks, key blocks, gr, d)
            o = np.cumsum(o, axis=2)[:, :, -1].reshape(kvh, qb * gr, d)[:, :r]
            out[rows] = o.reshape(kvh, len(rows), group, d).transpose(1, 0, 2, 3).reshape(len(rows), -1)
        return out

    def memory(self) -> dict[str, int]:
        return {"weights": sum(a.nbytes for a in self.w.values())}

    def dense_logits(self, hidden: np.ndarray) -> np.ndarray:
        """(T, vocab) float32: every row of the head."""
        return rowwise_matmul(hidden, self.head)  # sampled rows, one by one (a row's bits: its own)

    def sparse_logits(self, hidden: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """(T, K) float32 logits of candidate token ids (T, K) only; padded entries may hold any valid id."""
        rows = self.head[candidates]  # (T, K, hidden)
        return np.einsum("tkh,th->tk", rows, hidden)
