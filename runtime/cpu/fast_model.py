"""The fast CPU backend: the forward pass on the bundle's stored weights (kernels: runtime/cpu/panel_kernels.py,
linear_kernels.py, linear_high.py, attention_kernels.py, fast_kernels.py).

Weights stay in their stored format (runtime/cpu/stored_weights.py): the process holds the contract's
weight bytes, not a float32 copy. Activations are float32 in buffers allocated once for ``max_rows`` rows
(the contract's workspace; q|k|v and gate|up side by side, as the joined linears write them), KV in the
shared paged pool. Every kernel computes a row independently of the step's other rows in a fixed
reduction order, so a sequence's logits have the same bits alone, in any batch and in any prefill
chunking. ``CpuModel`` (runtime/cpu/model.py, numpy float32) stays the reference its tokens must equal.
"""
from __future__ import annotations

import copy
from collections.abc import Callable

import numba
import numpy as np

from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.bundle.rope import cos_sin, inv_freq
from toolcall.runtime.cpu import attention_kernels as ak
from toolcall.runtime.cpu import fast_kernels as fk
from toolcall.runtime.cpu import fused_forward as ff
from toolcall.runtime.cpu import linear_high as lh
from toolcall.runtime.cpu.backend import CpuBackend
from toolcall.runtime.cpu.kv_pool import PagedKVPool
from toolcall.runtime.cpu.stored_weights import LAYOUTS, StoredLinear, StoredWeights, load_stored  # noqa: F401  (toolcall.runtime.engine imports them here)
from toolcall.runtime.jit.one_layout import AnyLayout

# q is read by its strides: the q columns of q|k|v, strided for many rows and C-contiguous for one, share one compile
_attention = AnyLayout(ak.attention, positions=(0,))
NO_NORM = np.empty(0, np.float32)  # qk_norm_rope_kv's "no q/k norm" (families without qk_norm)


def set_threads(threads: int | None) -> int:
    """numba's worker threads for the kernels (None: leave as is; the default is the machine's cores)."""
    if threads is not None:
        numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))
    return numba.get_num_threads()


class FastCpuModel(CpuBackend):
    """CpuModel's interface (forward over rows, dense and sparse heads) on stored weights, numba kernels."""

    lanes_supported = True

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
                qkv=lin.get(p + "self_attn.qkv_proj"), q=lin.get(p + "self_attn.q_proj"),
                k=lin.get(p + "self_attn.k_proj"), v=lin.get(p + "self_attn.v_proj"), o=lin[p + "self_attn.o_proj"],
                gate_up=lin.get(p + "mlp.gate_up_proj"), gate=lin.get(p + "mlp.gate_proj"),
                up=lin.get(p + "mlp.up_proj"), down=lin[p + "mlp.down_proj"]))
        self.final_norm = v["model.norm.weight"]
        self.fused = None  # the layers' arrays for the one-call layer loop once ``enable_fused``; None: the Python loop
        self._pools = None  # (kv pool, typed lists of its K and V layers) for the fused loop
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
        # q|k|v and gate|up side by side: one output buffer for a joined linear, column views for the parts
        self.ws = dict(hidden=np.zeros((rows, h), f), normed=np.zeros((rows, h), f),
                       qkv=np.zeros((rows, cfg.q_dim + 2 * cfg.kv_dim), f), attn_out=np.zeros((rows, cfg.q_dim), f),
                       gate_up=np.zeros((rows, 2 * i), f), attn_scores=np.zeros((rows, cfg.num_heads, context), f))
        for a in self.ws.values():
            a.fill(0)  # calloc'd pages made resident: the model holds its workspace from the start
        self._rows, self._context = rows, context

    def enable_fused(self) -> bool:
        """Runs the layers as one nogil numba call from now on (runtime/cpu/fused_forward.py; the same bits),
        where the weight formats allow; whether they do. For forwards that run beside other Python threads
        (runtime/batching/lanes.py): each compiled layout costs the compiler tens of seconds, so it is opt-in."""
        self.fused = ff.layer_arrays(self.layers, NO_NORM)
        return self.fused is not None

    def split(self, lanes: int, rows: int) -> list["FastCpuModel"]:
        """This model (its step buffers resized to ``rows`` rows) and ``lanes - 1`` twins, their layer loops
        fused (``enable_fused``; the twins share it)."""
        self.resize_workspace(rows)
        self.enable_fused()
        return [self] + [self.twin(rows) for _ in range(lanes - 1)]

    def twin(self, rows: int) -> "FastCpuModel":
        """This model's weights with step buffers of its own for ``rows`` rows: twins may run ``forward``
        at the same time on different threads, over disjoint sequences (runtime/batching/lanes.py)."""
        other = copy.copy(self)  # the weights, layers and vectors are shared, read-only
        other.resize_workspace(rows)
        return other

    def resize_workspace(self, rows: int) -> None:
        """Step buffers for exactly ``rows`` rows (contexts as before); the old ones are let go."""
        context, self._rows, self._context = self._context, 0, 0
        self._reserve(rows, context)

    @property
    def max_threads(self) -> int:
        """The most kernel threads ``threads`` may be set to (numba's pool size)."""
        return numba.config.NUMBA_NUM_THREADS

    @property
    def workspace_bytes(self) -> int:
        return sum(a.nbytes for a in self.ws.values())

    def memory(self) -> dict[str, int]:
        return {"weights": self.weights.nbytes, "workspace": self.workspace_bytes}

    def new_kv_pool(self, limits, kv_format, scales=None) -> PagedKVPool:
        """The pool with its calloc'd pages made resident: a bound engine holds what the contract states."""
        pool = super().new_kv_pool(limits, kv_format, scales)
        for a in pool.k + pool.v:
            a.view(np.uint8).fill(0)
        return pool

    def step_call(self, plan, kv) -> Callable[[], np.ndarray]:
        """The step laid out on the calling thread, its layers in the returned call (``forward_call``)."""
        return self.forward_call(plan.tokens, plan.slots, plan.positions, kv, outputs=plan.outputs)

    def linear(self, lin: StoredLinear, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """y (T, out) = x (T, in) @ W.T (+ bias), by the stored format's kernel."""
        LAYOUTS[lin.fmt].run(lin, x, y)
        if lin.bias is not None:
            y += lin.bias
        return y

    def _norm(self, x: np.ndarray, weight: np.ndarray, out: np.ndarray) -> np.ndarray:
        fk.rms_norm(x.reshape(-1, x.shape[-1]), weight, self.eps, out.reshape(-1, x.shape[-1]))
        return out

    def forward(self, tokens: np.ndarray, slots: np.ndarray, positions: np.ndarray, kv: PagedKVPool,
                trace: list | None = None, outputs: np.ndarray | None = None) -> np.ndarray:
        """Runs rows (T,) through every layer, writing their K/V into the pool; returns (T, hidden) after the
        final norm, or only the rows ``outputs`` (R,) sorted: the last layer stores every row's K/V, then
        runs attention, o_proj and the MLP on those rows alone (each row's bits as in a full pass)."""
        return self.forward_call(tokens, slots, positions, kv, trace, outputs)()

    def forward_call(self, tokens: np.ndarray, slots: np.ndarray, positions: np.ndarray, kv: PagedKVPool,
                     trace: list | None = None, outputs: np.ndarray | None = None) -> Callable[[], np.ndarray]:
        """``forward`` in two parts: this call lays the step out (Python: views, embedding rows, rotary
        tables, the rows' pages) and returns the rest. With the fused layer loop the rest is one nogil call
        that holds the GIL only to enter and to return, so runtime/batching/lanes.py runs this part on the engine
        thread, which holds the GIL for its own Python anyway, and the rest on a lane's worker: the worker
        no longer waits for the GIL behind the engine thread (and the event loop) before its kernels."""
        if numba.get_num_threads() != self.threads:
            numba.set_num_threads(self.threads)
        t = len(tokens)
        positions = np.ascontiguousarray(positions, np.int64)
        slots = np.ascontiguousarray(slots, np.int64)
        self._reserve(t, int(positions.max()) + 1 if t else 0)
        v = self._views(t)
        self.embed_rows(np.ascontiguousarray(tokens, np.int64), v["hidden"])
        cos, sin = cos_sin(self.freqs, positions)
        kv_rows = kv.rows_at(slots, positions)  # (pages, offsets) (T,) int64, checked once for every layer
        if self.fused is not None and trace is None:
            return self._fused_call(v, cos, sin, kv_rows, slots, positions, kv, outputs)
        return lambda: self._layers_forward(v, cos, sin, kv_rows, slots, positions, kv, trace, outputs)

    def _layers_forward(self, v: dict, cos, sin, kv_rows, slots, positions, kv: PagedKVPool, trace: list | None,
                        outputs: np.ndarray | None) -> np.ndarray:
        """forward's layers from Python, a kernel launch each (the same kernels as the fused loop)."""
        cfg = self.cfg
        if numba.get_num_threads() != self.threads:  # the thread that runs this may not be forward_call's
            numba.set_num_threads(self.threads)
        t = len(slots)
        last = len(self.layers) - 1
        for layer, w in enumerate(self.layers):
            x, h, qkv = v["hidden"], v["normed"], v["qkv"]
            self._norm(x, w["in_norm"], h)
            if w["qkv"] is not None:
                self.linear(w["qkv"], h, qkv)
            else:
                self.linear(w["q"], h, v["q"])
                self.linear(w["k"], h, v["k"])
                self.linear(w["v"], h, v["v"])
            kp, vp = kv.kernel_pool(kv.k[layer]), kv.kernel_pool(kv.v[layer])
            k_inv, v_inv, k_mult, v_mult = kv.kernel_scales[:, layer]
            qn, kn = (w["q_norm"], w["k_norm"]) if cfg.qk_norm else (NO_NORM, NO_NORM)
            fk.qk_norm_rope_kv(qkv, cfg.num_heads, qn, kn, self.eps, cos, sin, kp, vp, *kv_rows, k_inv, v_inv)
            if layer == last and outputs is not None:  # every row's K/V is stored: the rest is for the outputs
                rows = np.ascontiguousarray(outputs, np.int64)
                assert np.all(rows[1:] > rows[:-1]) and (len(rows) == 0 or 0 <= rows[0] <= rows[-1] < t)
                t, slots, positions = len(rows), slots[rows], positions[rows]
                x[:t], qkv[:t] = x[rows], qkv[rows]  # compacted in place: rows ascend, so row i <- rows[i] >= i
                v = self._views(t)
                x, h, qkv = v["hidden"], v["normed"], v["qkv"]
            _attention(v["q3"], kp, vp, kv.block_table, slots, positions, self.scale, v["attn_scores"],
                         v["attn_out"], k_mult, v_mult)
            x += self.linear(w["o"], v["attn_out"], h)
            self._norm(x, w["post_norm"], h)
            if w["gate_up"] is not None:
                self.linear(w["gate_up"], h, v["gate_up"])
            else:
                self.linear(w["gate"], h, v["gate"])
                self.linear(w["up"], h, v["up"])
            fk.silu_times(v["gate_up"])
            x += self.linear(w["down"], v["gate"], h)
            if trace is not None:
                trace.append(float(np.sqrt(np.mean(x * x))))
        out = np.empty_like(v["hidden"])
        return self._norm(v["hidden"], self.final_norm, out)

    def _fused_call(self, v: dict, cos, sin, kv_rows, slots, positions, kv: PagedKVPool,
                    outputs: np.ndarray | None) -> Callable[[], np.ndarray]:
        """forward's layers as one nogil call (runtime/cpu/fused_forward.py; the same kernels and bits), its
        arguments bound."""
        t = len(slots)
        rows = np.arange(t, dtype=np.int64) if outputs is None else np.ascontiguousarray(outputs, np.int64)
        assert np.all(rows[1:] > rows[:-1]) and (len(rows) == 0 or 0 <= rows[0] <= rows[-1] < t)
        r = self._views(len(rows))
        if self._pools is None or self._pools[0] is not kv:  # typed lists of the pool's layers, made once
            self._pools = (kv, ff.as_list(kv.kernel_pool(a) for a in kv.k), ff.as_list(kv.kernel_pool(a) for a in kv.v))
        out = np.empty_like(r["hidden"])
        layers = ff.fused_layers_serial if self.threads == 1 else ff.fused_layers
        args = (self.fused, self._pools[1], self._pools[2], kv.kernel_scales, kv.block_table, self.eps, self.scale, self.cfg.num_heads,
                cos, sin, *kv_rows, slots, positions, rows, v["hidden"], v["normed"], v["qkv"], v["attn_out"],
                v["gate_up"], v["attn_scores"], slots[rows], positions[rows], r["hidden"], r["normed"], r["qkv"],
                r["attn_out"], r["gate_up"], r["attn_scores"], self.final_norm, out)
        threads = self.threads

        def call() -> np.ndarray:
            if threads > 1 and numba.get_num_threads() != threads:  # per thread: the worker's own setting
                numba.set_num_threads(threads)
            return layers(*args)
        return call

    def _views(self, t: int) -> dict[str, np.ndarray]:
        """The workspace's first ``t`` rows, with q/k/v and gate/up as column views of their joined buffers."""
        cfg = self.cfg
        qd, kvd, inter = cfg.q_dim, cfg.kv_dim, cfg.intermediate_size
        v = {name: a[:t] for name, a in self.ws.items()}
        qkv, gate_up = v["qkv"], v["gate_up"]
        v.update(q=qkv[:, :qd], k=qkv[:, qd:qd + kvd], v=qkv[:, qd + kvd:], gate=gate_up[:, :inter],
                 up=gate_up[:, inter:])
        v["q3"] = v["q"].reshape(t, cfg.num_heads, cfg.head_dim)  # a view of qkv (rows strided), not a copy
        assert t == 0 or np.may_share_memory(v["q3"], qkv)
        return v

    def embed_rows(self, tokens: np.ndarray, out: np.ndarray) -> np.ndarray:
        if self.embed.dtype == np.uint16:  # fused, one thread: the serial kernel (a parallel launch takes the GIL)
            (ff.fk_serial if self.fused is not None and self.threads == 1 else fk).gather_rows_bf16(self.embed, tokens, out)
        else:
            out[:] = self.embed[tokens]
        return out

    def dense_logits(self, hidden: np.ndarray) -> np.ndarray:
        """(T, vocab) float32: every row of the head."""
        hidden = np.ascontiguousarray(hidden, np.float32)
        out = np.empty((hidden.shape[0], self.head.shape[0]), np.float32)
        lh.linear_rows(hidden, self.head, out)  # the head: u16 bf16 bits or f32
        return out

    def sparse_logits(self, hidden: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """(T, K) float32 logits of candidate token ids (T, K) only; bit-equal to dense_logits' entries."""
        hidden = np.ascontiguousarray(hidden, np.float32)
        cand = np.ascontiguousarray(candidates, np.int64)
        out = np.empty(cand.shape, np.float32)
        lh.candidate_logits(hidden, self.head, cand, out)
        return out
