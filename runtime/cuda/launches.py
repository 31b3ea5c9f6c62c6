"""The kernel sequences of one step, written once for the host-driven path and the graphs.

A step is a list of ``Launch``es (toolcall.kernels.declarations: kernel name and arguments by the
kernel's parameter names; the grid comes from those arguments). A launch marked ``parallel`` has
the same dependencies as the one before it (a graph runs them side by side; the host launches
them in order on one stream, which is the same computation).

embed_gather first (the rows' embeddings, and the step's rotary (cos, sin) table every rope below reads), then
per layer (<f> = the weight format's kernel prefix; one fused q|k|v and one gate|up weight in every format):
  decode rows (StepRows.tiles None; the graph's loop body), 5 launches:
    <f>_matvec_rmsnorm qkv -> attention_decode[_wide] (norm, rope, K/V write, split-KV attention, merge)
    -> <f>_matvec o_proj (+= x) -> <f>_matvec_rmsnorm gate|up -> <f>_matvec_swiglu down (+= x)
  prefill tiles, 7 launches: qkv -> qk_norm_rope_kv -> attention_prefill_partial ->
    attention_merge -> o_proj -> gate|up -> down (the mma kernel family: 6, attention_prefill_mma in
    one pass for the partials and the merge)
then, for sampling: rmsnorm (rows gathered) -> grammar_candidates -> head_sparse -> grammar_advance.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolcall.kernels.declarations import Launch
from toolcall.kernels.geometry import PLAIN, RMSNORM, SWIGLU, decode_kernel, matvec_kernel
from toolcall.kernels.launch import DeviceArray
from toolcall.runtime.bundle.layout import AttentionPartials
from toolcall.runtime.cuda.buffers import offset

F32 = 4
# bytes attention_decode asks L2 for at most: a third of the smallest L2 of the targets (an A100's 40 MB), so the
# weights ahead never crowd out the KV reads beside them (a Qwen3-0.6B FP8 layer's span is ~15.7 MB)
L2_PREFETCH_MAX = 16 << 20
__all__ = ["Launch", "StepLaunches", "StepRows"]


@dataclass(frozen=True)
class StepRows:
    """One step's rows on the device: int32 [T] tokens, seq (slot, < 0 padding), pos; prefill
    tiles (tile_start, tile_len, n_tiles) for the prefill attention, or None for the decode
    kernel (one row per block row). ``decode`` > 0 with tiles: a mixed step, rows 0 .. decode - 1 one
    row each of their sequences (the decode kernel) and the rest prefill chunks (tiles counted from row
    ``decode``)."""

    T: int
    tokens: DeviceArray
    seq: DeviceArray
    pos: DeviceArray
    tiles: tuple[DeviceArray, DeviceArray, int] | None = None
    decode: int = 0


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
        # the partials, laid out for the prefill kernels or for the decode kernel (layout.py AttentionPartials)
        parts = AttentionPartials.of(m.limits)
        self.splits, self.decode_splits = parts.splits, parts.decode_splits
        self.part_o = part
        self.part_ml = offset(part, parts.rows * cfg.num_heads * parts.splits * cfg.head_dim * F32)
        self.decode_part_ml = offset(part, parts.decode_rows * cfg.num_heads * parts.decode_splits * cfg.head_dim * F32)
        self.decode_attention = decode_kernel(cfg.num_heads, cfg.num_kv_heads)
        # the kernel family's prefill attention (kernels/geometry.py KernelFamily.prefill_attention)
        self.prefill_attention = {("attention_prefill_partial", "attention_merge"): self._split_attention,
                                  ("attention_prefill_mma",): self._one_pass_attention}[m.family.prefill_attention]

    # ---- matvecs ----
    def _mv(self, prologue: str, mv, head: dict, y, T: int, accumulate: int) -> Launch:
        """``mv``'s matvec with ``prologue`` over the input arguments ``head``, into (or onto) ``y``."""
        return Launch(matvec_kernel(mv.fmt, prologue, self.m.family), dict(
            **head, **mv.weight_args(), bias=mv.bias(), y=y, T=T, n_in=mv.n_in, n_out=mv.n_out, accumulate=accumulate))

    def _mv_norm(self, mv, norm: str, y, T: int) -> Launch:
        ln = self.m.weights.arena[norm]
        return self._mv(RMSNORM, mv, dict(x=self.m.ws["hidden"], x_stride=self.m.cfg.hidden_size, norm_w=ln,
                                          eps=self.eps), y, T, 0)

    # ---- prefill attention: ``tiles`` the tile kernels' common arguments, ``out`` [rows, q_dim] ----
    def _split_attention(self, tiles: dict, out, rows: int) -> list[Launch]:
        """Partials over ATTN_SPLIT key splits, then the merge (attention.cu, attention_merge.cu)."""
        cfg = self.m.cfg
        return [Launch("attention_prefill_partial", dict(tiles, sm_scale=self.sm_scale, max_splits=self.splits,
                                                         part_o=self.part_o, part_ml=self.part_ml)),
                Launch("attention_merge", dict(part_o=self.part_o, part_ml=self.part_ml, seq=tiles["seq"],
                                               pos=tiles["pos"], n_heads=cfg.num_heads, head_dim=cfg.head_dim,
                                               max_splits=self.splits, out=out, out_stride=cfg.q_dim, T=rows))]

    def _one_pass_attention(self, tiles: dict, out, rows: int) -> list[Launch]:
        """Every key in one pass on tensor cores, straight into ``out`` (attention_prefill_mma.cu)."""
        return [Launch("attention_prefill_mma", dict(tiles, sm_scale=self.sm_scale, out=out,
                                                     out_stride=self.m.cfg.q_dim))]

    # ---- one step ----
    def forward(self, rows: StepRows) -> list[Launch]:
        """Embedding and every layer over ``rows``; the residual stream ends in ws["hidden"]."""
        m, cfg, T = self.m, self.m.cfg, rows.T
        w, kv, x = m.weights, m.kv, m.ws["hidden"]
        arena = w.arena
        heads = dict(n_heads=cfg.num_heads, n_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)
        table = m.ws["rope"]  # [T, head_dim / 2, 2]: the step's (cos, sin) pairs, made by embed_gather
        out = [Launch("embed_gather", dict(tokens=rows.tokens, table=arena[w.embed], vocab=cfg.vocab_size,
                                           hidden=cfg.hidden_size, x=x, pos=rows.pos, inv_freq=arena[w.inv_freq],
                                           rope_pairs=cfg.head_dim // 2, rope=table, T=T))]
        attn = m.ws["attn_out"]
        cache = dict(block_table=kv.table, max_pages_per_seq=kv.max_pages_per_seq, page_size=kv.page_size)
        splits = dict(sm_scale=self.sm_scale, max_splits=self.decode_splits, part_o=self.part_o,
                      part_ml=self.decode_part_ml)
        for i, layer in enumerate(w.layers):
            layer_kv = dict(k_cache=kv.k(i), v_cache=kv.v(i))
            # q, k, v columns of the fused [T, q | k | v] buffer, the rows' sequences and positions
            rope_args = dict(q=self.q, q_stride=self.q_stride, k=self.k, k_stride=self.k_stride, v=self.v,
                             v_stride=self.k_stride, seq=rows.seq, pos=rows.pos, **cache,
                             q_norm_w=arena[layer.norms["q_norm"]] if "q_norm" in layer.norms else None,
                             k_norm_w=arena[layer.norms["k_norm"]] if "k_norm" in layer.norms else None,
                             rope=table, eps=self.eps, **heads, **layer_kv)
            out.append(self._mv_norm(layer.qkv, layer.norms["ln_in"], self.q, T))
            decode = T if rows.tiles is None else rows.decode
            if decode:  # decode rows: one fused launch up to the o_proj input
                ahead = w.after_attention(i)  # into L2 while attention runs
                out.append(Launch(self.decode_attention, dict(
                    **rope_args, **splits, counters=m.ws["attn_count"], out=attn, prefetch=ahead,
                    prefetch_bytes=min(ahead.nbytes, L2_PREFETCH_MAX), out_stride=cfg.q_dim, T=decode)))
            if rows.tiles is not None:  # prefill tiles over rows decode .. T - 1 (their views start there)
                start, length, n_tiles = rows.tiles
                q, k, v = (offset(a, decode * self.q_stride * F32) for a in (self.q, self.k, self.v))
                seq, pos = offset(rows.seq, decode * 4), offset(rows.pos, decode * 4)
                chunk = dict(rope_args, q=q, k=k, v=v, seq=seq, pos=pos,
                             rope=offset(table, decode * cfg.head_dim * F32))
                out.append(Launch("qk_norm_rope_kv", dict(**chunk, T=T - decode)))
                tiles = dict(q=q, q_stride=self.q_stride, seq=seq, pos=pos, tile_start=start, tile_len=length,
                             **cache, **layer_kv, **heads, n_tiles=n_tiles)
                out += self.prefill_attention(tiles, offset(attn, decode * cfg.q_dim * F32), T - decode)
            out.append(self._mv(PLAIN, layer.o, dict(x=attn, x_stride=cfg.q_dim), x, T, 1))
            out.append(self._mv_norm(layer.gate_up, layer.norms["ln_post"], self.gate, T))
            out.append(self._mv(SWIGLU, layer.down, dict(gate=self.gate, up=self.up, x_stride=self.gu_stride), x, T, 1))
        return out

    def final_norm(self, T: int, rows: DeviceArray | None = None) -> Launch:
        """rmsnorm of x's rows (gathered by int32 ``rows`` [T] when given) into ws["normed"]."""
        w, h = self.m.weights, self.m.cfg.hidden_size
        return Launch("rmsnorm", dict(x=self.m.ws["hidden"], x_stride=h, rows=rows, w=w.arena[w.final_norm],
                                      eps=self.eps, y=self.m.ws["normed"], y_stride=h, B=T, n=h))

    def sample(self, d: dict, rows: DeviceArray | None, cond_handle: int) -> list[Launch]:
        """One greedy grammar step for the one sequence of ``d`` (decode-row views: token, pos,
        seq, row): final norm of its row, candidates, sparse head, grammar_advance."""
        m, cfg, g = self.m, self.m.cfg, self.m.grammar
        arena, ws, gw = m.weights.arena, m.ws, m.weights
        ga = {n: arena["grammar." + n] for n in ("node_edge_start", "edge_token", "edge_kind", "edge_bits",
                                                 "edge_child", "edge_tool")}
        sizes = dict(n_words=g.bitset_words, n_nodes=g.num_nodes, max_edges=g.max_edges_per_node, B=1)
        state = dict(state=ws["gram_state"], status=ws["gram_status"])
        return [
            self.final_norm(1, rows),
            Launch("grammar_candidates", dict(
                sample_seq=d["seq"], **state, node_edge_start=ga["node_edge_start"], edge_token=ga["edge_token"],
                edge_kind=ga["edge_kind"], edge_bits=ga["edge_bits"], n_tools=g.num_tools,
                max_tools=ws["gram_max_tools"], allow_empty=ws["gram_allow_empty"], **sizes, cand=ws["cand"],
                valid=ws["valid"])),
            Launch("head_sparse", dict(xn=ws["normed"], x_stride=cfg.hidden_size, cand=ws["cand"], valid=ws["valid"],
                                       table=arena[gw.head], hidden=cfg.hidden_size, vocab=cfg.vocab_size,
                                       n_cand=g.max_edges_per_node, B=1, out=ws["logits_sparse"])),
            Launch("grammar_advance", dict(
                cand_logits=ws["logits_sparse"], cand=ws["cand"], valid=ws["valid"], pick=None, sample_seq=d["seq"],
                token_in=d["token"], pos_in=d["pos"], node_edge_start=ga["node_edge_start"],
                edge_child=ga["edge_child"], edge_kind=ga["edge_kind"], edge_tool=ga["edge_tool"], **sizes,
                max_out=m.limits.max_output_tokens, **state, out_tokens=ws["out_tokens"], out_len=ws["out_len"],
                token_out=d["token"], pos_out=d["pos"], sync_ws=ws["sync_ws"], cond_out=ws["cond"],
                cond_handle=int(cond_handle))),
        ]
