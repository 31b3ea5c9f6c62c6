"""The fast backend's paged attention (runtime/cpu/attention_kernels.py): the runs' path (head_dim 64/128:
16 positions a run, lanes reduced together) gives the tiles' path's bits, and both give float64 attention
over the same pool to float32 accuracy (E4M3 pools: their decoded values times the per-head scales); the fused
q/k norm + rope + KV store gives the separate kernels' bits and the KV format's own encoding."""
import numpy as np
import pytest

from toolcall.common.formats import KV_BF16, KV_FP8_E4M3, KV_FP32
from toolcall.runtime.cpu import attention_kernels as ak

# (rows, heads, kv_heads, head_dim, page_size, max_len, pool's KV format)
CASES = [
    (33, 3, 1, 64, 16, 40, KV_BF16),  # the tool model's shape
    (17, 4, 2, 128, 32, 77, KV_BF16),  # runs that stop mid-page (32-position pages)
    (9, 3, 1, 64, 16, 5, KV_FP32),  # runs shorter than 16
    (12, 2, 2, 128, 16, 300, KV_FP32),
    (8, 2, 1, 48, 16, 50, KV_BF16),  # head_dim 48: only the tiles' path
    (5, 2, 1, 80, 16, 30, KV_FP32),  # head_dim % 16 != 0: the scalar tail
    (33, 3, 1, 64, 16, 40, KV_FP8_E4M3),  # E4M3 codes with per-head scales
    (17, 4, 2, 128, 32, 77, KV_FP8_E4M3),
    (5, 2, 2, 80, 16, 30, KV_FP8_E4M3),  # E4M3's scalar tail
]


def kernel_view(a: np.ndarray) -> np.ndarray:
    """A pool as the kernels read it: 2-byte (bf16) elements as their u16 bits, E4M3 codes and float32 as is."""
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a


def head_scales(fmt, kv_heads: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(scale, kernel read multiplier) (kv_heads,) f32: random scales for a scaled format, else ones."""
    if not fmt.scaled:
        return np.ones(kv_heads, np.float32), np.ones(kv_heads, np.float32)
    scale = (rng.random(kv_heads) * 0.02 + 0.005).astype(np.float32)
    return scale, np.float32(256) * scale


def _case(rows, heads, kv_heads, hd, page_size, max_len, fmt, seed=0):
    rng = np.random.default_rng(seed)
    pages_per_seq = -(-max_len // page_size)
    seqs = 8
    pool = (seqs * pages_per_seq, page_size, kv_heads, hd)
    # the kernel reads the pools in the KV format (bf16 as its bits, E4M3 codes); the reference the same values
    (ks, k_mult), (vs, v_mult) = head_scales(fmt, kv_heads, rng), head_scales(fmt, kv_heads, rng)
    k, v = (fmt.encode(rng.standard_normal(pool).astype(np.float32), (np.float32(1) / s).astype(np.float32))
            for s in (ks, vs))
    kbits, vbits = kernel_view(k), kernel_view(v)
    k, v = fmt.decode(k, ks), fmt.decode(v, vs)
    table = rng.permutation(seqs * pages_per_seq).reshape(seqs, pages_per_seq).astype(np.int32)
    slots = rng.integers(0, seqs, rows).astype(np.int64)
    positions = rng.integers(0, max_len, rows).astype(np.int64)
    positions[0] = max_len - 1  # one row over the whole context
    q = rng.standard_normal((rows, heads, hd)).astype(np.float32)
    return q, k, v, kbits, vbits, table, slots, positions, k_mult, v_mult


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


@pytest.mark.parametrize("rows,heads,kv_heads,hd,page_size,max_len,fmt", CASES)
def test_attention_runs_give_the_tiles_bits_and_the_float64_values(rows, heads, kv_heads, hd, page_size, max_len,
                                                                   fmt):
    q, k, v, kbits, vbits, table, slots, positions, k_mult, v_mult = _case(rows, heads, kv_heads, hd, page_size,
                                                                         max_len, fmt)
    scale = np.float32(hd ** -0.5)
    outs = []
    for runs in (True, False):
        scores = np.zeros((rows, heads, table.shape[1] * page_size), np.float32)
        out = np.full((rows, heads * hd), np.nan, np.float32)
        ak.attention(q, kbits, vbits, table, slots, positions, scale, scores, out, k_mult, v_mult, runs)
        outs.append(out)
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    ref = _reference(q, k, v, table, slots, positions, float(scale))
    np.testing.assert_allclose(outs[0], ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("rows,heads,kv_heads,hd,fmt,norm", [
    (37, 3, 1, 64, KV_BF16, True), (5, 16, 8, 128, KV_BF16, True), (9, 4, 2, 64, KV_FP32, True),
    (6, 2, 1, 32, KV_BF16, False), (11, 4, 2, 64, KV_FP8_E4M3, True), (6, 2, 1, 32, KV_FP8_E4M3, False)])
def test_fused_qk_norm_rope_kv_gives_the_separate_kernels_bits(rows, heads, kv_heads, hd, fmt, norm):
    """qk_norm_rope_kv == rms_norm per head, the reference's rope, and PagedKVPool.write's cast and store (NaN
    included)."""
    from toolcall.runtime.bundle.rope import apply_rope
    from toolcall.runtime.cpu import fast_kernels as fk
    rng = np.random.default_rng(1)
    q = rng.standard_normal((rows, heads, hd)).astype(np.float32) * 3
    k = rng.standard_normal((rows, kv_heads, hd)).astype(np.float32) * 3
    v = rng.standard_normal((rows, kv_heads, hd)).astype(np.float32)
    v[0, 0, :3] = [np.nan, -np.inf, 1 + 2 ** -8]  # a NaN, an infinity, a tie that rounds to even
    qw, kw = (rng.standard_normal(hd).astype(np.float32) if norm else np.empty(0, np.float32) for _ in range(2))
    cos, sin = (rng.standard_normal((rows, hd)).astype(np.float32) for _ in range(2))
    pages, offs = rng.permutation(64)[:rows].astype(np.int32), rng.integers(0, 16, rows).astype(np.int64)
    dt = fmt.dtype
    eps = np.float32(1e-6)
    q1, k1 = q.copy(), k.copy()
    if norm:
        fk.rms_norm(q1.reshape(-1, hd), qw, eps, q1.reshape(-1, hd))
        fk.rms_norm(k1.reshape(-1, hd), kw, eps, k1.reshape(-1, hd))
    q1, k1 = apply_rope(q1, cos, sin), apply_rope(k1, cos, sin)
    (ks, _), (vs, _) = head_scales(fmt, kv_heads, rng), head_scales(fmt, kv_heads, rng)
    k_inv, v_inv = (np.float32(1) / ks).astype(np.float32), (np.float32(1) / vs).astype(np.float32)
    kp1, vp1 = np.zeros((64, 16, kv_heads, hd), dt), np.zeros((64, 16, kv_heads, hd), dt)
    kp1[pages, offs], vp1[pages, offs] = fmt.encode(k1, k_inv), fmt.encode(v, v_inv)
    kp2, vp2 = np.zeros_like(kp1), np.zeros_like(vp1)
    bits = kernel_view
    qkv = np.concatenate([a.reshape(rows, -1) for a in (q, k, v)], axis=1)  # the model's q|k|v buffer
    fk.qk_norm_rope_kv(qkv, heads, qw, kw, eps, cos, sin, bits(kp2), bits(vp2), pages, offs, k_inv, v_inv)
    q2, k2 = qkv[:, :heads * hd].reshape(q.shape), qkv[:, heads * hd:(heads + kv_heads) * hd].reshape(k.shape)
    for a, b in [(q1, q2), (k1, k2), (kp1, kp2)]:
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    one = np.concatenate([a[2:3].reshape(1, -1) for a in (q, k, v)], axis=1)  # row 2 alone: the same bits
    fk.qk_norm_rope_kv(one, heads, qw, kw, eps, cos[2:3], sin[2:3], bits(np.zeros_like(kp1)),
                       bits(np.zeros_like(vp1)), pages[2:3], offs[2:3], k_inv, v_inv)
    assert np.array_equal(one.view(np.uint8), qkv[2:3].view(np.uint8))
    nan = np.isnan(vp1.astype(np.float32))
    assert np.array_equal(nan, np.isnan(vp2.astype(np.float32)))  # NaN payloads may differ; NaN stays NaN
    assert np.array_equal(vp1[~nan].view(np.uint8), vp2[~nan].view(np.uint8))


def test_the_e4m3_store_gives_the_formats_codes():
    """fast_kernels._e4m3_code (the fused store's encoder) == common/fp8.py encode_e4m3 (ml_dtypes' rounding,
    saturated) on every float32 bit pattern class: zeros, subnormal codes and their ties, normals and their
    ties, the saturation edge (448, 464), infinities and NaN."""
    from numba import njit

    from toolcall.common.fp8 import encode_e4m3
    from toolcall.runtime.cpu import fast_kernels as fk

    @njit
    def encode_all(x, out):
        for i in range(x.size):
            out[i] = fk._e4m3_code(x[i])

    rng = np.random.default_rng(4)
    grid = np.arange(256, dtype=np.uint8)[np.arange(256) % 128 != 127].view(np.int8)  # every finite code
    exact = KV_FP8_E4M3.decode(grid[:, None], np.ones(1, np.float32))[:, 0]
    ties = (exact[:-1] + exact[1:]) / 2  # midpoints between neighbouring codes (some cross zero: fine)
    x = np.concatenate([exact, ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf),
                        [0.0, -0.0, 447.9, 448.0, 463.9, 464.0, 465.0, 1e30, np.inf, -np.inf, 2.0 ** -10, 2.0 ** -11],
                        rng.standard_normal(20000) * 10.0 ** rng.integers(-8, 4, 20000)]).astype(np.float32)
    x = np.concatenate([x, -x])
    out = np.empty(x.size, np.int8)
    encode_all(x, out)
    assert np.array_equal(out, encode_e4m3(x).view(np.int8))
    nan = np.empty(1, np.int8)
    encode_all(np.array([np.nan], np.float32), nan)
    assert nan[0] & 0x7F == 0x7F  # NaN stays a NaN code (0x7F or 0xFF)
