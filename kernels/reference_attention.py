"""numpy references of the rope and attention kernels (embedding.cu's rotary table, qk_norm_rope.cu,
attention_decode.cu, attention.cu, attention_merge.cu, attention_prefill_mma.cu), argument for argument, as
kernels/reference.py holds the others: each takes the arrays its kernel reads in the kernel's layout and returns
what it writes (the KV cache updated in place); the formulas follow runtime/cpu/model.py.
"""
from __future__ import annotations

import numpy as np

from toolcall.kernels.geometry import ATTN_SPLIT, decode_split_keys, tile_rows
from toolcall.kernels.reference import BF16, F32, bf16_hi_lo, f32, rmsnorm


def rope_table(pos, inv_freq) -> np.ndarray:
    """embed_gather's rotary table, float32 [T, head_dim / 2, 2]: (cos, sin) of float32(pos) * inv_freq."""
    ang = np.asarray(pos).astype(F32)[:, None] * f32(inv_freq)[None, :]  # [T, half]
    return np.stack([np.cos(ang), np.sin(ang)], axis=-1).astype(F32)


def qk_norm_rope(q, k, rope, q_norm_w, k_norm_w, eps, n_heads, n_kv_heads, head_dim):
    """(q, k) after per-head RMSNorm (skipped for a None weight) and rotate-half RoPE with the rows' (cos, sin)
    pairs ``rope`` [T, head_dim / 2, 2] (rope_table). q [T, >= n_heads*head_dim], k [T, >= n_kv_heads*head_dim]
    float32; returns new arrays."""
    cos, sin = f32(rope[..., 0])[:, None, :], f32(rope[..., 1])[:, None, :]
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


def qk_norm_rope_kv(q, k, v, seq, pos, block_table, page_size, q_norm_w, k_norm_w, rope, eps,
                    n_heads, n_kv_heads, head_dim, k_cache=None, v_cache=None):
    """(q, k) as qk_norm_rope; with caches, bf16 of the new k and of v written in place (kv_write)."""
    q2, k2 = qk_norm_rope(q, k, rope, q_norm_w, k_norm_w, eps, n_heads, n_kv_heads, head_dim)
    if k_cache is not None:
        kv_write(k2, v, seq, pos, block_table, page_size, k_cache, v_cache)
    return q2, k2


def attention_decode(q, k, v, seq, pos, block_table, page_size, k_cache, v_cache, q_norm_w, k_norm_w,
                     rope, eps, n_heads, n_kv_heads, head_dim, sm_scale, max_splits):
    """attention_decode.cu: float32 [T, n_heads*head_dim] for decode rows (one per sequence):
    q/k norm + rope, the rows' K/V written into the caches in place, then each row's splits
    (geometry.decode_split_keys) merged (zeros for padding rows). Returns (out, the rotated k)."""
    q2, k2 = qk_norm_rope_kv(q, k, v, seq, pos, block_table, page_size, q_norm_w, k_norm_w, rope, eps,
                             n_heads, n_kv_heads, head_dim, k_cache, v_cache)
    out = np.zeros((len(q), n_heads * head_dim), F32)
    for t in np.flatnonzero((seq >= 0) & (pos >= 0)):
        qs = f32(q2[t, :n_heads * head_dim]).reshape(n_heads, head_dim)
        parts = [_split_partial(qs, block_table[seq[t]], k0, k1, page_size, k_cache, v_cache, sm_scale)
                 for k0, k1 in decode_split_keys(pos[t], max_splits)]
        m, total, o = (np.stack(x, axis=1) for x in zip(*parts))  # [n_heads, splits(, head_dim)]
        out[t] = _merge(m, total, o).reshape(-1)
    return out, k2


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
    rows = tile_rows(tile_start, tile_len)
    keep = np.full(len(seq), -1, np.int32)
    keep[rows] = np.asarray(seq)[rows]
    got = attention(bf16_hi_lo(q), keep, pos, block_table, page_size, k_cache, v_cache, n_heads, n_kv_heads,
                    head_dim, sm_scale)
    out = out.copy()
    out[rows] = got[rows]
    return out


def _split_partial(qs, bt_row, k0, k1, page_size, k_cache, v_cache, sm_scale):
    """(m, l, o) of query heads qs [n_heads, head_dim] over keys k0 .. k1 - 1 (bt_row: the sequence's
    block-table row): the running max [n_heads], the sum of exp(score - m) and the unnormalized output."""
    n_heads, group = len(qs), len(qs) // k_cache.shape[2]
    p = np.arange(k0, k1)
    pages = bt_row[p // page_size]
    kv = np.arange(n_heads) // group
    keys = f32(k_cache[pages, p % page_size])[:, kv]  # [n, n_heads, head_dim]
    vals = f32(v_cache[pages, p % page_size])[:, kv]
    sc = np.einsum("hd,nhd->hn", qs, keys) * F32(sm_scale)
    m = sc.max(axis=1)
    pr = np.exp(sc - m[:, None])
    return m, pr.sum(axis=1), np.einsum("hn,nhd->hd", pr, vals)


def _merge(m, total, o) -> np.ndarray:
    """[n_heads, head_dim] from the splits' running max m and sum ``total`` [n_heads, n] and outputs o
    [n_heads, n, head_dim]: sum_s w_s o_s / sum_s w_s total_s, w_s = exp(m_s - max m)."""
    w = np.exp(m - m.max(axis=1, keepdims=True))
    return (w[:, :, None] * o).sum(axis=1) / (w * total).sum(axis=1)[:, None]


def attention_partials(q, seq, pos, block_table, page_size, k_cache, v_cache, n_heads,
                       n_kv_heads, head_dim, sm_scale, max_splits):
    """(part_o [T, n_heads, max_splits, head_dim], part_ml [T, n_heads, max_splits, 2]) as the
    *_partial kernels write them for each row's splits 0 .. pos // ATTN_SPLIT (others: 0)."""
    T = len(q)
    part_o = np.zeros((T, n_heads, max_splits, head_dim), F32)
    part_ml = np.zeros((T, n_heads, max_splits, 2), F32)
    for t in np.flatnonzero(seq >= 0):
        qs = f32(q[t, :n_heads * head_dim]).reshape(n_heads, head_dim)
        for s in range(min(int(pos[t]) // ATTN_SPLIT + 1, max_splits)):
            m, total, o = _split_partial(qs, block_table[seq[t]], s * ATTN_SPLIT,
                                         min((s + 1) * ATTN_SPLIT, int(pos[t]) + 1), page_size, k_cache, v_cache,
                                         sm_scale)
            part_ml[t, :, s] = np.stack([m, total], axis=1)
            part_o[t, :, s] = o
    return part_o, part_ml


def attention_merge(part_o, part_ml, seq, pos, max_splits) -> np.ndarray:
    """float32 [T, n_heads*head_dim] from the partials: sum_s w_s o_s / sum_s w_s l_s."""
    T, n_heads, _, head_dim = part_o.shape
    out = np.zeros((T, n_heads * head_dim), F32)
    for t in np.flatnonzero((seq >= 0) & (pos >= 0)):
        n = min(int(pos[t]) // ATTN_SPLIT + 1, max_splits)
        out[t] = _merge(part_ml[t, :, :n, 0], part_ml[t, :, :n, 1], part_o[t, :, :n]).reshape(-1)
    return out
