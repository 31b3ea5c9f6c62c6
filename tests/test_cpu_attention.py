"""The fast backend's paged attention (runtime/cpu/attention_kernels.py) on one table of cases: the
runs' path (head_dim 64/128: 16 positions a run, lanes reduced together) gives the tiles' path's bits,
and both give float64 attention over the same pool to float32 accuracy."""
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
