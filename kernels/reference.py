"""numpy references of every kernel, argument for argument (float32 math).

Each function takes the arrays its kernel reads, in the kernel's layout (bf16 as
``ml_dtypes.bfloat16``, e4m3 as uint8 codes, NVFP4 as packed uint8), and returns what the
kernel writes; arrays a kernel updates in place (KV cache, grammar state) are updated in place
here too. Sizes the kernels take as scalars come from the shapes. The GPU parity tests compare
each kernel with its function here; the formulas follow runtime/cpu/model.py.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from toolcall.common.formats import WeightFormat
from toolcall.kernels.geometry import (
    ATTN_SPLIT,
    KERNEL_FAMILIES,
    MATVEC_FORMATS,
    MMA,
    PLAIN,
    RMSNORM,
    SWIGLU,
    KernelFamily,
    matvec_kernel,
)
from toolcall.kernels.weight_args import weight_args

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)


def f32(a) -> np.ndarray:
    return np.asarray(a).astype(F32)


# ---- dequantization: through the registry (common/formats.py), exact ----

def dequant(fmt: WeightFormat, w, *scales) -> np.ndarray:
    """float32 [out, in] of one matvec's weight arguments (``w``, then ``scales``: ``fmt``'s kernel
    layout, kernels/weight_args.py) by the registry's ``dequantize``. A per-row scale (a stored scalar
    the kernels take per output row) goes in as a column [out, 1], which multiplies its row as the
    stored scalar multiplies them all."""
    stored = {"w" + a.suffix: f32(v)[:, None] if a.per_row else v for a, v in zip(weight_args(fmt), (w, *scales))}
    return fmt.dequantize(stored.get, "w")


def e2m1_half_bits(codes: np.ndarray) -> np.ndarray:
    """uint16 fp16 bit patterns the kernels build from e2m1 codes (matvec.cuh): the magnitude
    bits shifted into exponent and mantissa, the sign to bit 15; as fp16 that is e2m1 x 2^-14
    (common/nvfp4.py E2M1_VALUES[code] x 2^-14)."""
    c = np.asarray(codes).astype(np.uint16)
    return ((c & 7) << 9) | ((c & 8) << 12)


# ---- row kernels ----

def embed_gather(tokens: np.ndarray, table: np.ndarray) -> np.ndarray:
    """float32 [T, hidden]: table rows of the tokens, zeros for ids outside [0, vocab)."""
    ok = (tokens >= 0) & (tokens < len(table))
    return np.where(ok[:, None], f32(table[np.where(ok, tokens, 0)]), F32(0))


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float, rows: np.ndarray | None = None) -> np.ndarray:
    """(x[r] / sqrt(mean(x[r]^2) + eps)) * w with r = rows[b] (or b); zeros where r < 0."""
    src = x if rows is None else x[np.maximum(rows, 0)]
    var = np.mean(src * src, axis=-1, keepdims=True, dtype=F32)
    y = (src / np.sqrt(var + F32(eps))) * f32(w)
    return y if rows is None else np.where((rows >= 0)[:, None], y, F32(0))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return (gate / (F32(1) + np.exp(-gate))) * up


def linear(x: np.ndarray, w: np.ndarray, bias=None, y=None, accumulate: bool = False) -> np.ndarray:
    """x [T, in] @ w[out, in].T (+ bias), added to y when ``accumulate`` (float32)."""
    r = (f32(x) @ f32(w).T).astype(F32)
    if bias is not None:
        r = r + f32(bias)
    return (f32(y) + r) if accumulate else r


def bf16_hi_lo(x: np.ndarray) -> np.ndarray:
    """float32 hi + lo with hi = bf16(x), lo = bf16(x - hi): the activations linear_mma.cuh multiplies
    (16 significant bits; exact in float32)."""
    hi = f32(np.asarray(x, F32).astype(BF16))
    return hi + f32((np.asarray(x, F32) - hi).astype(BF16))


def _matvec_family(fmt: WeightFormat, family: KernelFamily) -> dict[str, object]:
    seen = bf16_hi_lo if family is MMA else f32  # what the family's products see of the activations

    def plain(x, w, *scales, bias=None, y=None, accumulate=False):
        return linear(seen(x), dequant(fmt, w, *scales), bias, y, accumulate)

    def with_rmsnorm(x, norm_w, eps, w, *scales, bias=None, y=None, accumulate=False):
        return linear(seen(rmsnorm(x, norm_w, eps)), dequant(fmt, w, *scales), bias, y, accumulate)

    def with_swiglu(gate, up, w, *scales, bias=None, y=None, accumulate=False):
        return linear(seen(swiglu(gate, up)), dequant(fmt, w, *scales), bias, y, accumulate)
    return {matvec_kernel(fmt, p, family): f
            for p, f in zip((PLAIN, RMSNORM, SWIGLU), (plain, with_rmsnorm, with_swiglu))}


# kernel name -> reference, for every linear-layer kernel of every family: (x, w, *scales, ...) plain, (x,
# norm_w, eps, w, *scales, ...) with the input RMSNorm, (gate, up, w, *scales, ...) with SwiGLU; scales as
# the kernel's
MATVEC_REFERENCES = {fn: ref for fam in KERNEL_FAMILIES.values() for f in MATVEC_FORMATS
                     for fn, ref in _matvec_family(f, fam).items()}


def head_dense(x: np.ndarray, norm_w: np.ndarray, eps: float, table: np.ndarray) -> np.ndarray:
    """float32 [T, vocab]: the final RMSNorm, then every row of the head."""
    return linear(rmsnorm(x, norm_w, eps), table)


def qk_norm_rope(q, k, pos, q_norm_w, k_norm_w, inv_freq, eps, n_heads, n_kv_heads, head_dim):
    """(q, k) after per-head RMSNorm (skipped for a None weight) and rotate-half RoPE.
    q [T, >= n_heads*head_dim], k [T, >= n_kv_heads*head_dim] float32; returns new arrays."""
    ang = pos.astype(F32)[:, None] * f32(inv_freq)[None, :]  # [T, half]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = []
    for x, heads, nw in ((q, n_heads, q_norm_w), (k, n_kv_heads, k_norm_w)):
        x = f32(x).copy()
        h = x[:, :heads * head_dim].reshape(len(x), heads, head_dim)
        if nw is not None:
            h = rmsnorm(h, nw, eps)
        x1, x2 = h[..., :head_dim // 2], h[..., head_dim // 2:]
        h = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        x[:, :heads * head_dim] = h.reshape(len(x), -1)
        out.append(x)
    return tuple(out)


def qk_norm_rope_kv(q, k, v, seq, pos, block_table, page_size, q_norm_w, k_norm_w, inv_freq, eps,
                    n_heads, n_kv_heads, head_dim, k_cache=None, v_cache=None):
    """(q, k) as qk_norm_rope; with caches, bf16 of the new k and of v written in place (kv_write)."""
    q2, k2 = qk_norm_rope(q, k, pos, q_norm_w, k_norm_w, inv_freq, eps, n_heads, n_kv_heads, head_dim)
    if k_cache is not None:
        kv_write(k2, v, seq, pos, block_table, page_size, k_cache, v_cache)
    return q2, k2


def attention_decode(q, k, v, seq, pos, block_table, page_size, k_cache, v_cache, q_norm_w, k_norm_w,
                     inv_freq, eps, n_heads, n_kv_heads, head_dim, sm_scale, max_splits):
    """attention_decode.cu: float32 [T, n_heads*head_dim] for decode rows (one per sequence):
    q/k norm + rope, the rows' K/V written into the caches in place, then the attention of the
    partials and merge (zeros for padding rows). Returns (out, the rotated k)."""
    q2, k2 = qk_norm_rope_kv(q, k, v, seq, pos, block_table, page_size, q_norm_w, k_norm_w, inv_freq, eps,
                             n_heads, n_kv_heads, head_dim, k_cache, v_cache)
    po, pml = attention_partials(q2, seq, pos, block_table, page_size, k_cache, v_cache, n_heads, n_kv_heads,
                                 head_dim, sm_scale, max_splits)
    return attention_merge(po, pml, seq, pos, max_splits), k2


def kv_write(k, v, seq, pos, block_table, page_size, k_cache, v_cache) -> None:
    """Writes bf16(k[t]), bf16(v[t]) at (page, slot) of each row with seq >= 0, in place."""
    kv_dim = k_cache.shape[2] * k_cache.shape[3]
    for t in np.flatnonzero((seq >= 0) & (pos >= 0)):
        page = block_table[seq[t], pos[t] // page_size]
        if page < 0:
            continue
        slot = pos[t] % page_size
        k_cache[page, slot] = f32(k[t, :kv_dim]).reshape(k_cache.shape[2:]).astype(BF16)
        v_cache[page, slot] = f32(v[t, :kv_dim]).reshape(v_cache.shape[2:]).astype(BF16)


def attention(q, seq, pos, block_table, page_size, k_cache, v_cache, n_heads, n_kv_heads,
              head_dim, sm_scale) -> np.ndarray:
    """float32 [T, n_heads*head_dim]: each row attends to positions 0..pos of its sequence
    (GQA: q head h reads kv head h // (n_heads / n_kv_heads)); zeros for seq < 0."""
    group = n_heads // n_kv_heads
    out = np.zeros((len(q), n_heads * head_dim), F32)
    for t in np.flatnonzero(seq >= 0):
        n = int(pos[t]) + 1
        p = np.arange(n)
        pages = block_table[seq[t], p // page_size]
        keys = f32(k_cache[pages, p % page_size])  # [n, kv_heads, head_dim]
        vals = f32(v_cache[pages, p % page_size])
        qs = f32(q[t, :n_heads * head_dim]).reshape(n_kv_heads, group, head_dim)
        s = np.einsum("kgd,nkd->kgn", qs, keys) * F32(sm_scale)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        out[t] = np.einsum("kgn,nkd->kgd", s, vals).reshape(-1)
    return out


def attention_prefill_mma(q, seq, pos, tile_start, tile_len, block_table, page_size, k_cache, v_cache, n_heads,
                          n_kv_heads, head_dim, sm_scale, out: np.ndarray) -> np.ndarray:
    """``out`` [T, n_heads*head_dim] with the tiles' rows attended (``attention`` on q as bf16 hi + lo, what
    the kernel's products see; its probabilities are hi + lo too, 16 bits); the other rows as they were."""
    rows = np.concatenate([np.arange(s, s + n) for s, n in zip(tile_start, tile_len)] or [[]]).astype(int)
    keep = np.full(len(seq), -1, np.int32)
    keep[rows] = np.asarray(seq)[rows]
    got = attention(bf16_hi_lo(q), keep, pos, block_table, page_size, k_cache, v_cache, n_heads, n_kv_heads,
                    head_dim, sm_scale)
    out = out.copy()
    out[rows] = got[rows]
    return out


def attention_partials(q, seq, pos, block_table, page_size, k_cache, v_cache, n_heads,
                       n_kv_heads, head_dim, sm_scale, max_splits):
    """(part_o [T, n_heads, max_splits, head_dim], part_ml [T, n_heads, max_splits, 2]) as the
    *_partial kernels write them for each row's splits 0 .. pos // ATTN_SPLIT (others: 0)."""
    T, group = len(q), n_heads // n_kv_heads
    part_o = np.zeros((T, n_heads, max_splits, head_dim), F32)
    part_ml = np.zeros((T, n_heads, max_splits, 2), F32)
    for t in np.flatnonzero(seq >= 0):
        qs = f32(q[t, :n_heads * head_dim]).reshape(n_heads, head_dim)
        for s in range(min(int(pos[t]) // ATTN_SPLIT + 1, max_splits)):
            p = np.arange(s * ATTN_SPLIT, min((s + 1) * ATTN_SPLIT, int(pos[t]) + 1))
            pages = block_table[seq[t], p // page_size]
            keys = f32(k_cache[pages, p % page_size])  # [n, kv_heads, head_dim]
            vals = f32(v_cache[pages, p % page_size])
            kv = np.arange(n_heads) // group
            sc = np.einsum("hd,nhd->hn", qs, keys[:, kv]) * F32(sm_scale)
            m = sc.max(axis=1)
            pr = np.exp(sc - m[:, None])
            part_ml[t, :, s] = np.stack([m, pr.sum(axis=1)], axis=1)
            part_o[t, :, s] = np.einsum("hn,nhd->hd", pr, vals[:, kv])
    return part_o, part_ml


def attention_merge(part_o, part_ml, seq, pos, max_splits) -> np.ndarray:
    """float32 [T, n_heads*head_dim] from the partials: sum_s w_s o_s / sum_s w_s l_s."""
    T, n_heads, _, head_dim = part_o.shape
    out = np.zeros((T, n_heads * head_dim), F32)
    for t in np.flatnonzero((seq >= 0) & (pos >= 0)):
        n = min(int(pos[t]) // ATTN_SPLIT + 1, max_splits)
        m, l = part_ml[t, :, :n, 0], part_ml[t, :, :n, 1]
        w = np.exp(m - m.max(axis=1, keepdims=True))
        out[t] = ((w[:, :, None] * part_o[t, :, :n]).sum(axis=1) / (w * l).sum(axis=1)[:, None]).reshape(-1)
    return out


# ---- heads and sampling ----

def head_sparse(xn: np.ndarray, cand: np.ndarray, valid: np.ndarray, table: np.ndarray) -> np.ndarray:
    """float32 [B, E]: xn[b] . table[cand[b, e]] where valid, -inf elsewhere."""
    ok = valid.astype(bool) & (cand >= 0) & (cand < len(table))
    rows = f32(table[np.where(ok, cand, 0)])  # [B, E, hidden]
    return np.where(ok, np.einsum("beh,bh->be", rows, f32(xn)), F32(-np.inf)).astype(F32)


def head_gather(logits: np.ndarray, cand: np.ndarray, valid: np.ndarray) -> np.ndarray:
    ok = valid.astype(bool) & (cand >= 0) & (cand < logits.shape[1])
    picked = np.take_along_axis(logits, np.where(ok, cand, 0), axis=1)
    return np.where(ok, picked, F32(-np.inf)).astype(F32)


def argmax_rows(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [T], float32 [T]): lowest index of the row maximum, NaN counted as -inf."""
    clean = np.where(np.isnan(logits), F32(-np.inf), logits)
    idx = np.argmax(clean, axis=1).astype(np.int32)
    return idx, clean[np.arange(len(clean)), idx].astype(F32)


# ---- grammar (arrays as runtime/grammar/trie.py; state uint64 [S, 1 + W], see state_words) ----

def state_words(states: np.ndarray) -> np.ndarray:
    """A toolcall.runtime.grammar.stepper state record array [S] viewed as the kernels' uint64 [S, 1+W]."""
    return np.ascontiguousarray(states).view(np.uint64).reshape(len(states), -1)


def _node_count(word0: np.uint64) -> tuple[int, int]:
    w = int(word0)
    return w & 0xFFFFFFFF, w >> 32


def grammar_candidates(sample_seq, state, status, g, max_edges, max_tools, allow_empty) -> tuple[np.ndarray, np.ndarray]:
    """(cand int32 [B, max_edges], valid uint8 [B, max_edges]) for grammar ``g`` (a
    toolcall.runtime.grammar.trie.Grammar: its arrays and num_tools) under each sequence's rules
    ``max_tools`` int32 [max_seqs] and ``allow_empty`` uint8 [max_seqs]."""
    B, n_tools = len(sample_seq), g.num_tools
    cand = np.full((B, max_edges), -1, np.int32)
    valid = np.zeros((B, max_edges), np.uint8)
    for b, s in enumerate(sample_seq):
        if s < 0 or status[s] != 0:
            continue
        node, count = _node_count(state[s, 0])
        lo, hi = int(g.node_edge_start[node]), int(g.node_edge_start[node + 1])
        for e in range(min(hi - lo, max_edges)):
            ed = lo + e
            cand[b, e] = g.edge_token[ed]
            kind = int(g.edge_kind[ed])
            if kind == 3:
                ok = count == 0 and bool(allow_empty[s])
            else:
                ok = bool((g.edge_bits[ed] & ~state[s, 1:]).any())
                ok = ok and (kind != 1 or count + 1 < min(int(max_tools[s]), n_tools))
            valid[b, e] = ok
    return cand, valid


def grammar_advance(cand_logits, cand, valid, sample_seq, token_in, pos_in, g, max_out, state,
                    status, out_tokens, out_len, pick=None) -> tuple[np.ndarray, np.ndarray, int]:
    """The pick (``pick[b]`` where given and >= 0, else greedy: ties to the lowest token id), transition and
    bookkeeping as grammar_advance.cu; updates state/status/out_tokens/out_len in place; returns
    (token_out, pos_out, cond)."""
    token_out, pos_out = np.array(token_in, np.int32), np.array(pos_in, np.int32)
    terminal = len(g.node_edge_start) - 2
    running = 0
    for b, s in enumerate(sample_seq):
        if s < 0 or status[s] != 0:
            continue
        slots = np.flatnonzero(valid[b])
        drawn = -1 if pick is None else int(pick[b])
        if len(slots) == 0 or (drawn >= 0 and drawn not in slots):
            status[s] = 3
            continue
        if drawn >= 0:
            e = drawn
        else:
            logits = np.where(np.isnan(cand_logits[b, slots]), -np.inf, cand_logits[b, slots])
            tied = slots[logits == logits.max()]
            e = int(tied[np.argmin(cand[b, tied])])
        length = int(out_len[s])
        if length >= max_out:
            status[s] = 2
            continue
        node, count = _node_count(state[s, 0])
        ed = int(g.node_edge_start[node]) + e
        if g.edge_kind[ed] in (1, 2):
            tool = int(g.edge_tool[ed])
            state[s, 1 + tool // 64] |= np.uint64(1 << (tool % 64))
            count += 1
        node = int(g.edge_child[ed])
        state[s, 0] = np.uint64(node | (count << 32))
        out_tokens[s, length] = cand[b, e]
        out_len[s] = length + 1
        token_out[b], pos_out[b] = cand[b, e], pos_in[b] + 1
        status[s] = 1 if node == terminal else (2 if length + 1 >= max_out else 0)
        running += int(status[s] == 0)
    return token_out, pos_out, int(running > 0)
