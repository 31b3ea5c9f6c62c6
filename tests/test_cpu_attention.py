"""The fast backend's paged attention (runtime/cpu/attention_kernels.py): the runs' path (head_dim 64/128:
16 positions a run, lanes reduced together) gives the tiles' path's bits, and both give float64 attention
over the same pool to float32 accuracy; the fused q/k norm + rope + KV store gives the separate kernels' bits."""
import ml_dtypes
import numpy as np
import pytest

from runtime.cpu import attention_kernels as ak

# (rows, heads, kv_heads, head_dim, page_size, max_len, pool dtype)
CASES = [
    (33, 3, 1, 64, 16, 40, "bf16"),  # the tool model's shape
    (17, 4, 2, 128, 32, 77, "bf16"),  # runs that stop mid-page (32-position pages)
    (9, 3, 1, 64, 16, 5, "f32"),  # runs shorter than 16
    (12, 2, 2, 128, 16, 300, "f32"),
    (8, 2, 1, 48, 16, 50, "bf16"),  # head_dim 48: only the tiles' path
    (5, 2, 1, 80, 16, 30, "f32"),  # head_dim % 16 != 0: the scalar tail
]


def _case(rows, heads, kv_heads, hd, page_size, max_len, dtype, seed=0):
    rng = np.random.default_rng(seed)
    pages_per_seq = -(-max_len // page_size)
    seqs = 8
    pool = (seqs * pages_per_seq, page_size, kv_heads, hd)
    k = rng.standard_normal(pool).astype(np.float32)
    v = rng.standard_normal(pool).astype(np.float32)
    if dtype == "bf16":  # the kernel reads bf16 pools as their bits; the reference reads the same values
        k, v = (a.astype(ml_dtypes.bfloat16) for a in (k, v))
        kbits, vbits = k.view(np.uint16), v.view(np.uint16)
        k, v = k.astype(np.float32), v.astype(np.float32)
    else:
        kbits, vbits = k, v
    table = rng.permutation(seqs * pages_per_seq).reshape(seqs, pages_per_seq).astype(np.int32)
    slots = rng.integers(0, seqs, rows).astype(np.int64)
    positions = rng.integers(0, max_len, rows).astype(np.int64)
    positions[0] = max_len - 1  # one row over the whole context
    q = rng.standard_normal((rows, heads, hd)).astype(np.float32)
    return q, k, v, kbits, vbits, table, slots, positions


def _reference(q, k, v, table, slots, positions, scale):
    rows, heads, hd = q.shape
    page_size, kv_heads = k.shape[1], k.shape[2]
    out = np.zeros((rows, heads * hd))
    for t in range(rows):
        n = positions[t] + 1
        idx = np.arange(n)
        pages, offs = table[slots[t], idx // page_size], idx % page_size
        for h in range(heads):
            kvh = h // (heads // kv_heads)
            s = (k[pages, offs, kvh].astype(np.float64) @ q[t, h].astype(np.float64)) * scale
            p = np.exp(s - s.max())
            out[t, h * hd:(h + 1) * hd] = (p @ v[pages, offs, kvh].astype(np.float64)) / p.sum()
    return out


@pytest.mark.parametrize("rows,heads,kv_heads,hd,page_size,max_len,dtype", CASES)
def test_attention_runs_give_the_tiles_bits_and_the_float64_values(rows, heads, kv_heads, hd, page_size, max_len,
                                                                   dtype):
    q, k, v, kbits, vbits, table, slots, positions = _case(rows, heads, kv_heads, hd, page_size, max_len, dtype)
    scale = np.float32(hd ** -0.5)
    outs = []
    for runs in (True, False):
        scores = np.zeros((rows, heads, table.shape[1] * page_size), np.float32)
        out = np.full((rows, heads * hd), np.nan, np.float32)
        ak.attention(q, kbits, vbits, table, slots, positions, scale, scores, out, runs)
        outs.append(out)
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    ref = _reference(q, k, v, table, slots, positions, float(scale))
    np.testing.assert_allclose(outs[0], ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("rows,heads,kv_heads,hd,pool,norm", [(37, 3, 1, 64, "bf16", True), (5, 16, 8, 128, "bf16", True),
                                                             (9, 4, 2, 64, "f32", True), (6, 2, 1, 32, "bf16", False)])
def test_fused_qk_norm_rope_kv_gives_the_separate_kernels_bits(rows, heads, kv_heads, hd, pool, norm):
    """qk_norm_rope_kv == rms_norm per head, rope, and PagedKVPool.write's cast and store (NaN included)."""
    from runtime.cpu import fast_kernels as fk
    rng = np.random.default_rng(1)
    q = rng.standard_normal((rows, heads, hd)).astype(np.float32) * 3
    k = rng.standard_normal((rows, kv_heads, hd)).astype(np.float32) * 3
    v = rng.standard_normal((rows, kv_heads, hd)).astype(np.float32)
    v[0, 0, :3] = [np.nan, -np.inf, 1 + 2 ** -8]  # a NaN, an infinity, a tie that rounds to even
    qw, kw = (rng.standard_normal(hd).astype(np.float32) if norm else np.empty(0, np.float32) for _ in range(2))
    cos, sin = (rng.standard_normal((rows, hd)).astype(np.float32) for _ in range(2))
    pages, offs = rng.permutation(64)[:rows].astype(np.int32), rng.integers(0, 16, rows).astype(np.int64)
    dt = ml_dtypes.bfloat16 if pool == "bf16" else np.float32
    eps = np.float32(1e-6)
    q1, k1 = q.copy(), k.copy()
    if norm:
        fk.rms_norm(q1.reshape(-1, hd), qw, eps, q1.reshape(-1, hd))
        fk.rms_norm(k1.reshape(-1, hd), kw, eps, k1.reshape(-1, hd))
    fk.rope(q1, cos, sin)
    fk.rope(k1, cos, sin)
    kp1, vp1 = np.zeros((64, 16, kv_heads, hd), dt), np.zeros((64, 16, kv_heads, hd), dt)
    kp1[pages, offs], vp1[pages, offs] = k1.astype(dt), v.astype(dt)
    kp2, vp2 = np.zeros_like(kp1), np.zeros_like(vp1)
    bits = (lambda a: a.view(np.uint16)) if pool == "bf16" else (lambda a: a)
    qkv = np.concatenate([a.reshape(rows, -1) for a in (q, k, v)], axis=1)  # the model's q|k|v buffer
    fk.qk_norm_rope_kv(qkv, heads, qw, kw, eps, cos, sin, bits(kp2), bits(vp2), pages, offs)
    q2, k2 = qkv[:, :heads * hd].reshape(q.shape), qkv[:, heads * hd:(heads + kv_heads) * hd].reshape(k.shape)
    for a, b in [(q1, q2), (k1, k2), (kp1, kp2)]:
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    one = np.concatenate([a[2:3].reshape(1, -1) for a in (q, k, v)], axis=1)  # row 2 alone: the same bits
    fk.qk_norm_rope_kv(one, heads, qw, kw, eps, cos[2:3], sin[2:3], bits(np.zeros_like(kp1)),
                       bits(np.zeros_like(vp1)), pages[2:3], offs[2:3])
    assert np.array_equal(one.view(np.uint8), qkv[2:3].view(np.uint8))
    nan = np.isnan(vp1.astype(np.float32))
    assert np.array_equal(nan, np.isnan(vp2.astype(np.float32)))  # NaN payloads may differ; NaN stays NaN
    assert np.array_equal(vp1[~nan].view(np.uint8), vp2[~nan].view(np.uint8))
