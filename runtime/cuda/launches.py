"""The kernel sequences of one step, written once for the host-driven path and the graphs.

A step is a list of ``Launch``es (kernel name, launch sizes, arguments). A launch marked
``parallel`` has the same dependencies as the one before it (a graph runs them side by side;
the host launches them in order on one stream, which is the same computation).

Per layer (<f> = fp8 | nvfp4 | bf16; one fused q|k|v and one gate|up weight in every format):
  decode rows (StepRows.tiles None; the graph's loop body), 5 launches:
    <f>_matvec_rmsnorm qkv -> attention_decode (norm, rope, K/V write, attention, merge)
    -> <f>_matvec o_proj (+= x) -> <f>_matvec_rmsnorm gate|up -> <f>_matvec_swiglu down (+= x)
  prefill tiles, 7 launches: qkv -> qk_norm_rope_kv -> attention_prefill_partial ->
    attention_merge -> o_proj -> gate|up -> down
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
        qkv, gu, part = m.ws["qkv"], m.ws["gate_up"], m.ws["attn_partials"]
        q, kv, i = cfg.q_dim, cfg.kv_dim, cfg.intermediate_size
        # [T, q | k | v] and [T, gate | up]: one fused weight each (runtime/cuda/weights.py)
        self.q, self.k, self.v = qkv, offset(qkv, q * F32), offset(qkv, (q + kv) * F32)
        self.q_stride = self.k_stride = q + 2 * kv
        self.gate, self.up, self.gu_stride = gu, offset(gu, i * F32), 2 * i
        self.splits = m.splits
        self.part_o = part  # [T, heads, S, head_dim] then part_ml [T, heads, S, 2]
        self.part_ml = offset(part, self.t_max * cfg.num_heads * self.splits * cfg.head_dim * F32)

    # ---- matvecs ----
    def _mv(self, kind: str, mv, head: tuple, y, T: int, accumulate: int, parallel=False) -> Launch:
        return Launch(f"{mv.fmt}_matvec{kind}", dict(T=T, out=mv.n_out),
                      (*head, *mv.weight_args(), mv.bias(), y, T, mv.n_in, mv.n_out, accumulate), parallel)

    def _mv_norm(self, mv, norm: str, y, T: int) -> Launch:
        ln, h = self.m.weights.arena[norm], self.m.cfg.hidden_size
        return self._mv("_rmsnorm", mv, (self.m.ws["hidden"], h, ln, self.eps), y, T, 0)

    # ---- one step ----
    def forward(self, rows: StepRows) -> list[Launch]:
        """Embedding and every layer over ``rows``; the residual stream ends in ws["hidden"]."""
        m, cfg, T = self.m, self.m.cfg, rows.T
        w, kv, x = m.weights, m.kv, m.ws["hidden"]
        arena = w.arena
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        out = [Launch("embed_gather", dict(T=T), (rows.tokens, arena[w.embed], cfg.vocab_size, cfg.hidden_size, x, T))]
        attn = m.ws["attn_out"]
        for i, layer in enumerate(w.layers):
            qn = arena[layer.norms["q_norm"]] if "q_norm" in layer.norms else None
            kn = arena[layer.norms["k_norm"]] if "k_norm" in layer.norms else None
            cache = (kv.table, kv.max_pages_per_seq, kv.page_size)
            kv_rows = (self.k, self.k_stride, self.v, self.k_stride, rows.seq, rows.pos, *cache)
            out.append(self._mv_norm(layer.qkv, layer.norms["ln_in"], self.q, T))
            if rows.tiles is None:  # decode: one fused launch up to the o_proj input
                out.append(Launch("attention_decode", dict(T=T, n_kv_heads=nkv, max_splits=self.splits),
                                  (self.q, self.q_stride, *kv_rows, kv.k(i), kv.v(i), qn, kn, arena[w.inv_freq],
                                   self.eps, nh, nkv, hd, self.sm_scale, self.splits, self.part_o, self.part_ml,
                                   m.ws["attn_count"], attn, cfg.q_dim, T)))
            else:
                start, length, n_tiles = rows.tiles
                out.append(Launch("qk_norm_rope_kv", dict(T=T, n_heads=nh, n_kv_heads=nkv),
                                  (self.q, self.q_stride, *kv_rows, qn, kn, arena[w.inv_freq], self.eps, T, nh, nkv,
                                   hd, kv.k(i), kv.v(i))))
                tail = (kv.k(i), kv.v(i), nh, nkv, hd, self.sm_scale, self.splits, self.part_o, self.part_ml)
                out.append(Launch("attention_prefill_partial",
                                  dict(n_tiles=n_tiles, n_kv_heads=nkv, max_splits=self.splits),
                                  (self.q, self.q_stride, rows.seq, rows.pos, start, length, *cache, *tail, n_tiles)))
                out.append(Launch("attention_merge", dict(n_heads=nh, T=T),
                                  (self.part_o, self.part_ml, rows.seq, rows.pos, nh, hd, self.splits, attn,
                                   cfg.q_dim, T)))
            out.append(self._mv("", layer.o, (attn, cfg.q_dim), x, T, 1))
            out.append(self._mv_norm(layer.gate_up, layer.norms["ln_post"], self.gate, T))
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
