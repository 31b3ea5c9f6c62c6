"""The kernel sequences of one step, written once for the host-driven path and the graphs.

A step is a list of ``Launch``es (kernel name, launch sizes, arguments). A launch marked
``parallel`` has the same dependencies as the one before it (a graph runs them side by side;
the host launches them in order on one stream, which is the same computation).

Per layer (<f> = fp8 | nvfp4 | bf16; one fused q/k/v and gate/up weight except for nvfp4):
  <f>_matvec_rmsnorm q, k, v  ->  qk_norm_rope  ->  kv_write  ->  attention partial + merge
  ->  <f>_matvec o_proj (+= x)  ->  <f>_matvec_rmsnorm gate, up  ->  <f>_matvec_swiglu down (+= x)
then, for sampling: rmsnorm (rows gathered) -> grammar_candidates -> head_sparse -> grammar_advance.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.geometry import ATTN_QCHUNK
from kernels.launch import DeviceArray

from .buffers import offset

F32 = 4


@dataclass(frozen=True)
class Launch:
    fn: str
    sizes: dict
    args: tuple
    parallel: bool = False  # graph: same dependencies as the previous launch


@dataclass(frozen=True)
class StepRows:
    """One step's rows on the device: int32 [T] tokens, seq (slot, < 0 padding), pos; prefill
    tiles (tile_start, tile_len, n_tiles) for attention_prefill_partial, or None for the decode
    kernel (one row per block row)."""

    T: int
    tokens: DeviceArray
    seq: DeviceArray
    pos: DeviceArray
    tiles: tuple[DeviceArray, DeviceArray, int] | None = None


def rows_per_tile(num_heads: int, num_kv_heads: int) -> int:
    """Query rows of one prefill tile: ATTN_QCHUNK // group keeps a tile in one query chunk."""
    return max(1, ATTN_QCHUNK // (num_heads // num_kv_heads))


class StepLaunches:
    """Launch lists over a loaded model's buffers (``model``: a CudaModel)."""

    def __init__(self, model):
        m = self.m = model
        cfg, self.t_max = m.cfg, m.limits.max_tokens_per_step
        self.eps = np.float32(cfg.rms_norm_eps)
        self.sm_scale = np.float32(1.0 / np.sqrt(cfg.head_dim))
        self.fused = m.weights.fmt != "nvfp4"
        qkv, gu, part = m.ws["qkv"], m.ws["gate_up"], m.ws["attn_partials"]
        q, kv, i, t = cfg.q_dim, cfg.kv_dim, cfg.intermediate_size, self.t_max
        if self.fused:  # [T, q | k | v] and [T, gate | up]
            self.q, self.k, self.v = qkv, offset(qkv, q * F32), offset(qkv, (q + kv) * F32)
            self.q_stride = self.k_stride = q + 2 * kv
            self.gate, self.up, self.gu_stride = gu, offset(gu, i * F32), 2 * i
        else:  # [T, q], [T, k], [T, v] and [T, gate], [T, up] one after the other
            self.q, self.k, self.v = qkv, offset(qkv, t * q * F32), offset(qkv, t * (q + kv) * F32)
            self.q_stride, self.k_stride = q, kv
            self.gate, self.up, self.gu_stride = gu, offset(gu, t * i * F32), i
        self.splits = m.splits
        self.part_o = part  # [T, heads, S, head_dim] then part_ml [T, heads, S, 2]
        self.part_ml = offset(part, t * cfg.num_heads * self.splits * cfg.head_dim * F32)

    # ---- matvecs ----
    def _mv(self, kind: str, mv, head: tuple, y, T: int, accumulate: int, parallel=False) -> Launch:
        return Launch(f"{mv.fmt}_matvec{kind}", dict(T=T, out=mv.n_out),
                      (*head, *mv.weight_args(), mv.bias(), y, T, mv.n_in, mv.n_out, accumulate), parallel)

    def _qkv(self, layer, x, T: int) -> list[Launch]:
        ln, h = self.m.weights.arena[layer.norms["ln_in"]], self.m.cfg.hidden_size
        outs = [self.q] if self.fused else [self.q, self.k, self.v]
        return [self._mv("_rmsnorm", mv, (x, h, ln, self.eps), y, T, 0, parallel=j > 0)
                for j, (mv, y) in enumerate(zip(layer.qkv, outs))]

    def _mlp_in(self, layer, x, T: int) -> list[Launch]:
        ln, h = self.m.weights.arena[layer.norms["ln_post"]], self.m.cfg.hidden_size
        outs = [self.gate] if self.fused else [self.gate, self.up]
        return [self._mv("_rmsnorm", mv, (x, h, ln, self.eps), y, T, 0, parallel=j > 0)
                for j, (mv, y) in enumerate(zip(layer.gate_up, outs))]

    # ---- one step ----
    def forward(self, rows: StepRows) -> list[Launch]:
        """Embedding and every layer over ``rows``; the residual stream ends in ws["hidden"]."""
        m, cfg, T = self.m, self.m.cfg, rows.T
        w, kv, x = m.weights, m.kv, m.ws["hidden"]
        arena = w.arena
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        out = [Launch("embed_gather", dict(T=T), (rows.tokens, arena[w.embed], cfg.vocab_size, cfg.hidden_size, x, T))]
        for i, layer in enumerate(w.layers):
            qn = arena[layer.norms["q_norm"]] if "q_norm" in layer.norms else None
            kn = arena[layer.norms["k_norm"]] if "k_norm" in layer.norms else None
            out += self._qkv(layer, x, T)
            out.append(Launch("qk_norm_rope", dict(T=T, n_heads=nh, n_kv_heads=nkv),
                              (self.q, self.q_stride, self.k, self.k_stride, rows.pos, qn, kn, arena[w.inv_freq],
                               self.eps, T, nh, nkv, hd)))
            cache = (kv.table, kv.max_pages_per_seq, kv.page_size)
            out.append(Launch("kv_write", dict(T=T), (self.k, self.k_stride, self.v, self.k_stride, rows.seq, rows.pos,
                                                      *cache, nkv, hd, kv.k(i), kv.v(i), T)))
            tail = (kv.k(i), kv.v(i), nh, nkv, hd, self.sm_scale, self.splits, self.part_o, self.part_ml)
            if rows.tiles is None:
                out.append(Launch("attention_decode_partial", dict(T=T, n_kv_heads=nkv, max_splits=self.splits),
                                  (self.q, self.q_stride, rows.seq, rows.pos, *cache, *tail, T)))
            else:
                start, length, n_tiles = rows.tiles
                out.append(Launch("attention_prefill_partial",
                                  dict(n_tiles=n_tiles, n_kv_heads=nkv, max_splits=self.splits),
                                  (self.q, self.q_stride, rows.seq, rows.pos, start, length, *cache, *tail, n_tiles)))
            attn = m.ws["attn_out"]
            out.append(Launch("attention_merge", dict(n_heads=nh, T=T),
                              (self.part_o, self.part_ml, rows.seq, rows.pos, nh, hd, self.splits, attn, cfg.q_dim, T)))
            out.append(self._mv("", layer.o, (attn, cfg.q_dim), x, T, 1))
            out += self._mlp_in(layer, x, T)
            out.append(self._mv("_swiglu", layer.down, (self.gate, self.up, self.gu_stride), x, T, 1))
        return out

    def final_norm(self, T: int, rows: DeviceArray | None = None) -> Launch:
        """rmsnorm of x's rows (gathered by int32 ``rows`` [T] when given) into ws["normed"]."""
        cfg, w = self.m.cfg, self.m.weights
        return Launch("rmsnorm", dict(B=T), (self.m.ws["hidden"], cfg.hidden_size, rows, w.arena[w.final_norm],
                                             self.eps, self.m.ws["normed"], cfg.hidden_size, T, cfg.hidden_size))

    def sample(self, d: dict, rows: DeviceArray | None, cond_handle: int) -> list[Launch]:
        """One greedy grammar step for the one sequence of ``d`` (decode-row views: token, pos,
        seq, row): final norm of its row, candidates, sparse head, grammar_advance."""
        m, cfg, g = self.m, self.m.cfg, self.m.grammar
        arena, ws, gw = m.weights.arena, m.ws, m.weights
        M, W, N = g.max_edges_per_node, g.bitset_words, g.num_nodes
        ga = {n: arena["grammar." + n] for n in ("node_edge_start", "edge_token", "edge_kind", "edge_bits",
                                                 "edge_child", "edge_tool")}
        st = (ws["gram_state"], ws["gram_status"])
        return [
            self.final_norm(1, rows),
            Launch("grammar_candidates", dict(max_edges=M, B=1),
                   (d["seq"], *st, ga["node_edge_start"], ga["edge_token"], ga["edge_kind"], ga["edge_bits"], W, N,
                    g.num_tools, g.max_tools, int(g.allow_empty), M, 1, ws["cand"], ws["valid"])),
            Launch("head_sparse", dict(n_cand=M, B=1),
                   (ws["normed"], cfg.hidden_size, ws["cand"], ws["valid"], arena[gw.head], cfg.hidden_size,
                    cfg.vocab_size, M, 1, ws["logits_sparse"])),
            Launch("grammar_advance", dict(B=1),
                   (ws["logits_sparse"], ws["cand"], ws["valid"], d["seq"], d["token"], d["pos"],
                    ga["node_edge_start"], ga["edge_child"], ga["edge_kind"], ga["edge_tool"], W, N, M,
                    m.limits.max_output_tokens, 1, *st, ws["out_tokens"], ws["out_len"], d["token"], d["pos"],
                    ws["sync_ws"], ws["cond"], int(cond_handle))),
        ]
