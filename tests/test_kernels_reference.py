"""CPU tests of kernels/reference.py: each numpy reference against straightforward float64
math (or the CPU backend / grammar stepper it must agree with), so the GPU parity tests
compare the kernels with something known to be right."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from toolcall.builder.catalog import AnswerFormat, Catalog, TokenizedCatalog, Tool
from toolcall.builder.trie import grammar_from_paths
from toolcall.common.formats import BF16 as BF16_WEIGHTS
from toolcall.common.formats import FP8_E4M3, FP32, NVFP4
from toolcall.common.nvfp4 import E2M1_VALUES
from toolcall.kernels import geometry
from toolcall.kernels import reference as ref
from toolcall.kernels import reference_attention as ref_attn
from toolcall.kernels.declarations import launch_shape
from toolcall.runtime.bundle import rope
from toolcall.runtime.cpu import model as cpu_backend
from toolcall.runtime.grammar.stepper import GrammarStepper, decode_tools

BF16 = ml_dtypes.bfloat16


def rel_err(got, want):
    return float(np.max(np.abs(np.float64(got) - want)) / max(np.max(np.abs(want)), 1e-30))


# ---- dequantization ----

def e4m3_value(code: int) -> float:
    """E4M3 "fn" decoded from its bits: bias 7, subnormals, 0x7f / 0xff are NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> 3) & 0xF, code & 0x7
    if exp == 0:
        return sign * man / 8 * 2.0 ** -6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


def test_fp8_dequant_every_code():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    w = np.tile(codes, (3, 1))
    scale = np.array([1.0, 0.5, 3.25], np.float32)
    want = np.array([e4m3_value(int(c)) for c in codes])[None, :] * scale[:, None].astype(np.float64)
    np.testing.assert_array_equal(ref.dequant(FP8_E4M3, w, scale), want.astype(np.float32))


def test_nvfp4_dequant_nibble_order_and_scales():
    e2m1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, size=(2, 64))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)  # element 2k low nibble
    bs_codes = np.array([[0x38, 0x40, 0x30, 0x44], [0x3C, 0x01, 0x48, 0x38]], np.uint8)
    glob = 0.0123
    want = np.empty((2, 64))
    for o in range(2):
        for k in range(64):
            c = codes[o, k]
            v = (-1 if c & 8 else 1) * e2m1[c & 7]
            want[o, k] = v * e4m3_value(int(bs_codes[o, k // 16])) * np.float32(glob)
    got = ref.dequant(NVFP4, packed, bs_codes, np.full(2, glob, np.float32))
    assert rel_err(got, want) < 1e-6


def test_e2m1_half_bits_times_every_e4m3_scale_is_exact():
    """matvec.cuh's decoding, exhaustively: fp16(bits(c)) = e2m1(c) x 2^-14 for all 16 codes, and
    its fp16 product with every finite e4m3 block scale is exact (= e2m1 x scale x 2^-14), so
    with 2^14 folded into the float32 global scale the kernels compute the same numbers."""
    codes = np.arange(16)
    h = ref.e2m1_half_bits(codes).view(np.float16)
    np.testing.assert_array_equal(h.astype(np.float64), E2M1_VALUES.astype(np.float64) * 2.0 ** -14)
    assert np.signbit(h[8]) and h[8] == 0  # code 8 is -0.0
    scales = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)  # 254 finite e4m3 codes
    s16 = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float16)  # e4m3 -> fp16: exact
    np.testing.assert_array_equal(s16.astype(np.float64), [e4m3_value(int(c)) for c in scales])
    prod = h[:, None] * s16[None, :]  # numpy rounds the fp16 product to nearest even, as __hmul2
    exact = E2M1_VALUES.astype(np.float64)[:, None] * s16.astype(np.float64)[None, :] * 2.0 ** -14
    np.testing.assert_array_equal(prod.astype(np.float64), exact)
    assert np.array_equal(np.signbit(prod), np.signbit(exact))
    # the float32 side: (sum of 2^-14-scaled products) x (global x 2^14) == sum x global, bit for bit
    rng = np.random.default_rng(0)
    w = exact.reshape(-1)[rng.integers(0, exact.size, 4096)].astype(np.float32)
    x = rng.standard_normal(4096).astype(np.float32)
    g = np.float32(0.0123)
    acc_new = acc_old = np.float32(0)
    for wi, xi in zip(w, x):
        acc_new = np.float32(acc_new + wi * xi)
        acc_old = np.float32(acc_old + np.float32(wi * 2.0 ** 14) * xi)
    assert acc_new * np.float32(g * np.float32(2 ** 14)) == acc_old * g


def test_hardware_e2m1_decoding_gives_the_bit_placements_bits():
    """sm_100a / sm_120a convert e2m1 codes in hardware and scale the block scales by 2^-14 instead: for
    all 16 codes x 254 finite e4m3 scales the fp16 products are the plain path's, bit for bit (so one
    bundle's answers do not depend on which of the two paths its target compiled)."""
    codes = np.arange(16)
    scales = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    s16 = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float16)
    np.testing.assert_array_equal((s16 * np.float16(2.0 ** -14)).astype(np.float64),
                                  s16.astype(np.float64) * 2.0 ** -14)  # the folded scale is exact
    plain, hardware = (ref.e2m1_scaled_half(codes, scales, hardware=h) for h in (False, True))
    np.testing.assert_array_equal(plain.view(np.uint16), hardware.view(np.uint16))
    exact = E2M1_VALUES.astype(np.float64)[:, None] * s16.astype(np.float64)[None, :] * 2.0 ** -14
    np.testing.assert_array_equal(plain.astype(np.float64), exact)


def test_nvfp4_dequant_takes_a_per_row_global_scale():
    """The kernels' layout repeats each tensor's global scale per output row: dequantized through the registry,
    each row is (e2m1 * block) * its global, bit for bit as the row alone with its scalar (the stored layout)."""
    rng = np.random.default_rng(1)
    packed = rng.integers(0, 256, (3, 16), dtype=np.uint8)
    bs = rng.integers(0x30, 0x48, (3, 2), dtype=np.uint8)
    g = np.array([0.5, 0.25, 3.0], np.float32)
    got = ref.dequant(NVFP4, packed, bs, g)
    for i in range(3):
        stored = {"w": packed[i:i + 1], "w_scale": bs[i:i + 1], "w_scale_2": g[i]}
        np.testing.assert_array_equal(got[i:i + 1], NVFP4.dequantize(stored.get, "w"))
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(3, -1)
    blocks = np.repeat(bs.view(ml_dtypes.float8_e4m3fn).astype(np.float32), 16, axis=1)
    np.testing.assert_array_equal(got, (E2M1_VALUES[codes] * blocks) * g[:, None])  # the kernels' order


def test_every_gpu_weight_format_has_matvec_weight_arguments():
    """kernels/weight_args.py: each bundle format's matvecs take its stored tensors in file order, a stored
    scalar per output row; fp32 (CPU only) has no GPU kernels."""
    from toolcall.kernels.weight_args import weight_args
    assert geometry.MATVEC_FORMATS == (FP8_E4M3, NVFP4, BF16_WEIGHTS)
    got = {f: [(a.param, a.suffix, a.per_row, a.shape(48, 64)) for a in weight_args(f)]
           for f in geometry.MATVEC_FORMATS}
    assert got == {FP8_E4M3: [("w", "", False, (48, 64)), ("w_scale", "_scale", False, (48,))],
                   NVFP4: [("w", "", False, (48, 32)), ("w_scale", "_scale", False, (48, 4)),
                           ("global_scale", "_scale_2", True, (48,))],
                   BF16_WEIGHTS: [("w", "", False, (48, 64))]}
    assert FP32 not in geometry.MATVEC_FORMATS
    assert geometry.shape_problems(1024, 3072, 16, 8, 128, FP32) == [
        "fp32 weights: the GPU kernels take fp8_e4m3, nvfp4, bf16"]


# ---- row kernels vs float64 ----

@pytest.mark.parametrize("T,n_in,n_out", [(1, 64, 16), (5, 1024, 48), (16, 96, 7)])
def test_linear_matches_float64(T, n_in, n_out):
    rng = np.random.default_rng(T)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    y0 = rng.standard_normal((T, n_out)).astype(np.float32)
    want = y0.astype(np.float64) + x.astype(np.float64) @ w.T.astype(np.float64) + b
    assert rel_err(ref.linear(x, w, b, y0, accumulate=True), want) < 1e-5


def test_rmsnorm_float64_and_row_gather():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    w = rng.standard_normal(256).astype(BF16)
    eps = 1e-6
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + eps) * w.astype(np.float64)
    assert rel_err(ref.rmsnorm(x, w, eps), want) < 1e-6
    gathered = ref.rmsnorm(x, w, eps, rows=np.array([3, -1, 0], np.int32))
    np.testing.assert_array_equal(gathered[1], 0)
    np.testing.assert_allclose(gathered[[0, 2]], ref.rmsnorm(x, w, eps)[[3, 0]], rtol=0, atol=0)
    # the CPU backend (source of truth) computes the same formula
    np.testing.assert_allclose(ref.rmsnorm(x, w, eps),
                               cpu_backend.rms_norm(x, w.astype(np.float32), eps), rtol=1e-6)


def test_swiglu_float64():
    g = np.linspace(-20, 20, 101, dtype=np.float32)[None, :]
    u = np.linspace(3, -3, 101, dtype=np.float32)[None, :]
    want = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * u
    assert rel_err(ref.swiglu(g, u), want) < 1e-6


@pytest.mark.parametrize("qk_norm", [True, False])
def test_qk_norm_rope_is_a_rotation_and_matches_cpu_backend(qk_norm):
    rng = np.random.default_rng(2)
    T, nh, nkv, hd = 3, 4, 2, 64
    q = rng.standard_normal((T, nh * hd)).astype(np.float32)
    k = rng.standard_normal((T, nkv * hd)).astype(np.float32)
    pos = np.array([0, 7, 40000], np.int32)
    inv_freq = (1.0 / 1e6 ** (np.arange(0, hd, 2) / hd)).astype(np.float32)
    nq = rng.standard_normal(hd).astype(BF16) if qk_norm else None
    nk = rng.standard_normal(hd).astype(BF16) if qk_norm else None
    q2, k2 = ref_attn.qk_norm_rope(q, k, ref_attn.rope_table(pos, inv_freq), nq, nk, 1e-6, nh, nkv, hd)
    # float64 complex rotation of (x1 + i x2) by the float32 angle
    qn = ref.rmsnorm(q.reshape(T, nh, hd), nq, 1e-6) if qk_norm else q.reshape(T, nh, hd)
    z = qn[..., :hd // 2].astype(np.float64) + 1j * qn[..., hd // 2:]
    ang = (pos.astype(np.float32)[:, None] * inv_freq).astype(np.float64)[:, None, :]
    z = z * np.exp(1j * ang)
    want = np.concatenate([z.real, z.imag], axis=-1).reshape(T, -1)
    assert rel_err(q2, want) < 1e-5
    # bit-compatible with runtime/bundle/rope.py (the CPU backend's rope)
    cos, sin = rope.cos_sin(inv_freq, pos)
    kn = ref.rmsnorm(k.reshape(T, nkv, hd), nk, 1e-6) if qk_norm else k.reshape(T, nkv, hd)
    np.testing.assert_array_equal(k2, rope.apply_rope(kn, cos, sin).reshape(T, -1))


def test_kv_write_rounds_to_nearest_even_and_skips_padding():
    page_size, nkv, hd = 4, 1, 8
    kc = np.zeros((3, page_size, nkv, hd), BF16)
    vc = np.zeros_like(kc)
    bt = np.array([[2, 0], [1, -1]], np.int32)
    # 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties go to the even (1.0)
    k = np.full((3, hd), 1 + 2 ** -8, np.float32)
    k[1] = 1 + 3 * 2 ** -8  # halfway between 1+2^-7 and 1+2^-6: even is 1 + 2^-6
    v = -k
    seq, pos = np.array([0, 0, -1], np.int32), np.array([1, 5, 0], np.int32)
    ref_attn.kv_write(k, v, seq, pos, bt, page_size, kc, vc)
    assert np.all(kc[2, 1].astype(np.float32) == 1.0)
    assert np.all(kc[0, 1].astype(np.float32) == 1 + 2 ** -6)
    assert np.all(vc[0, 1].astype(np.float32) == -(1 + 2 ** -6))
    assert np.count_nonzero(kc.astype(np.float32)) == 2 * hd  # the padding row wrote nothing


# ---- attention ----

def paged_problem(seed, lengths, nh=4, nkv=2, hd=64, page_size=16):
    """Random paged caches for sequences of the given lengths, pages shuffled over the pool."""
    rng = np.random.default_rng(seed)
    pages_per = [geometry.cdiv(n, page_size) for n in lengths]
    perm = rng.permutation(sum(pages_per) + 2)
    bt = np.full((len(lengths), max(pages_per)), -1, np.int32)
    i = 0
    for s, n in enumerate(pages_per):
        bt[s, :n] = perm[i:i + n]
        i += n
    kc = rng.standard_normal((len(perm), page_size, nkv, hd)).astype(BF16)
    vc = rng.standard_normal((len(perm), page_size, nkv, hd)).astype(BF16)
    return bt, kc, vc


def attention_f64(q, seq, pos, bt, page_size, kc, vc, nh, nkv, hd, scale):
    out = np.zeros((len(q), nh * hd))
    for t in range(len(q)):
        if seq[t] < 0:
            continue
        p = np.arange(pos[t] + 1)
        keys = kc[bt[seq[t], p // page_size], p % page_size].astype(np.float64)
        vals = vc[bt[seq[t], p // page_size], p % page_size].astype(np.float64)
        for h in range(nh):
            s = keys[:, h // (nh // nkv)] @ q[t, h * hd:(h + 1) * hd].astype(np.float64) * scale
            pr = np.exp(s - s.max())
            out[t, h * hd:(h + 1) * hd] = pr @ vals[:, h // (nh // nkv)] / pr.sum()
    return out


def test_attention_and_split_merge_match_float64():
    lengths = [700, 33]
    bt, kc, vc = paged_problem(3, lengths)
    nh, nkv, hd, ps = 4, 2, 64, 16
    seq = np.array([0, 1, -1, 0, 1], np.int32)
    pos = np.array([699, 0, 5, 255, 32], np.int32)
    q = np.random.default_rng(4).standard_normal((5, nh * hd)).astype(np.float32)
    scale = np.float32(hd ** -0.5)
    want = attention_f64(q, seq, pos, bt, ps, kc, vc, nh, nkv, hd, scale)
    direct = ref_attn.attention(q, seq, pos, bt, ps, kc, vc, nh, nkv, hd, scale)
    max_splits = geometry.attention_max_splits(700)
    po, pml = ref_attn.attention_partials(q, seq, pos, bt, ps, kc, vc, nh, nkv, hd, scale, max_splits)
    merged = ref_attn.attention_merge(po, pml, seq, pos, max_splits)
    assert max_splits == 3
    assert rel_err(direct, want) < 1e-5 and rel_err(merged, want) < 1e-5
    np.testing.assert_array_equal(merged[2], 0)


@pytest.mark.parametrize("hd,S", [(32, 11), (64, 11), (128, 11), (64, 3), (64, 1)])
def test_attention_decode_is_rope_kv_write_then_attention(hd, S):
    """attention_decode.cu's reference: q/k norm + rope, the rows' K/V into the cache, attention over the row's
    splits merged (700 keys: 11 one-chunk splits, or 3 of 4 chunks, or one of all 11), zeros for padding rows."""
    nh, nkv, ps = 4, 2, 16
    bt, kc, vc = paged_problem(5, [700, 33], nh, nkv, hd, ps)
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((3, n * hd)).astype(np.float32) for n in (nh, nkv, nkv))
    seq, pos = np.array([0, 1, -1], np.int32), np.array([699, 32, 3], np.int32)
    qw, kw = (rng.standard_normal(hd).astype(BF16) for _ in range(2))
    table = ref_attn.rope_table(pos, (1.0 / 1e6 ** (np.arange(0, hd, 2) / hd)).astype(np.float32))
    scale = np.float32(hd ** -0.5)
    kc2, vc2 = kc.copy(), vc.copy()
    out, k_rot = ref_attn.attention_decode(q, k, v, seq, pos, bt, ps, kc2, vc2, qw, kw, table, 1e-6, nh, nkv, hd,
                                           scale, S)
    q2, k2 = ref_attn.qk_norm_rope(q, k, table, qw, kw, 1e-6, nh, nkv, hd)
    kc3, vc3 = kc.copy(), vc.copy()
    ref_attn.kv_write(k2, v, seq, pos, bt, ps, kc3, vc3)
    assert kc2.tobytes() == kc3.tobytes() and vc2.tobytes() == vc3.tobytes() and kc2.tobytes() != kc.tobytes()
    np.testing.assert_array_equal(k_rot, k2)
    want = attention_f64(q2, seq, pos, bt, ps, kc3, vc3, nh, nkv, hd, scale)
    assert rel_err(out, want) < 1e-5
    np.testing.assert_array_equal(out[2], 0)


@pytest.mark.parametrize("max_positions", [1, 64, 65, 700, 2048, 2049, 40_000])
def test_decode_splits_cover_every_key_once_in_whole_chunks(max_positions):
    """attention_decode's split rule (geometry.decode_split_keys): keys 0 .. pos in order, each once, splits of
    whole DECODE_KEYS chunks but the last, no more splits than the launch's slots (decode_max_splits), and one
    chunk a split while the context fits the slots."""
    S = geometry.decode_max_splits(max_positions)
    assert 1 <= S <= geometry.DECODE_MAX_SPLITS
    for pos in sorted({0, 1, 63, 64, 65, 511, 2047, 2048, max_positions - 1}):
        ranges = geometry.decode_split_keys(pos, S)
        assert ranges[0][0] == 0 and ranges[-1][1] == pos + 1 and len(ranges) <= S, (pos, ranges)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])) and all(k1 > k0 for k0, k1 in ranges)
        assert all((k1 - k0) % geometry.DECODE_KEYS == 0 for k0, k1 in ranges[:-1])
        if pos < max_positions and pos < geometry.DECODE_KEYS * geometry.DECODE_MAX_SPLITS:
            assert len(ranges) == pos // geometry.DECODE_KEYS + 1


# ---- heads, argmax ----

def test_head_sparse_gather_and_dense_agree():
    rng = np.random.default_rng(5)
    table = rng.standard_normal((50, 32)).astype(BF16)
    x = rng.standard_normal((2, 32)).astype(np.float32)
    norm_w = rng.standard_normal(32).astype(BF16)
    cand = np.array([[3, 49, 0, -1], [7, 7, 12, 60]], np.int32)
    valid = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], np.uint8)
    xn = ref.rmsnorm(x, norm_w, 1e-6)
    sparse = ref.head_sparse(xn, cand, valid, table)
    want = np.einsum("bh,beh->be", xn.astype(np.float64), table[np.clip(cand, 0, 49)].astype(np.float64))
    ok = valid.astype(bool) & (cand >= 0) & (cand < 50)
    assert np.all(np.isneginf(sparse[~ok]))
    assert rel_err(sparse[ok], want[ok]) < 1e-5
    dense = ref.head_dense(x, norm_w, 1e-6, table)
    np.testing.assert_allclose(ref.head_gather(dense, cand, valid)[ok], sparse[ok], rtol=1e-5, atol=1e-5)


def test_argmax_tie_break_and_nan():
    logits = np.array([[1, 3, 3, -1], [np.nan, -np.inf, -np.inf, np.nan],
                       [np.nan, 2, 5, 5]], np.float32)
    idx, val = ref.argmax_rows(logits)
    assert idx.tolist() == [1, 0, 2] and val.tolist() == [3, -np.inf, 5]


# ---- launch geometry ----

def test_prefill_tiles_cut_runs_of_one_sequence():
    seq = np.array([0, 0, 0, 1, 1, -1, 2, 0, 0], np.int32)
    pos = np.array([0, 1, 2, 5, 6, 0, 9, 3, 4], np.int32)
    start, length = geometry.prefill_tiles(seq, pos, rows_per_tile=2)
    assert start.tolist() == [0, 2, 3, 6, 7] and length.tolist() == [2, 1, 2, 1, 2]


@pytest.mark.parametrize("kernel,sizes,grid,block", [
    ("fp8_e4m3_matvec", dict(T=9, n_out=33), (5, 2, 1), 256),  # plain: 8 rows a block
    ("fp8_e4m3_matvec_rmsnorm", dict(T=9, n_out=33), (3, 2, 1), 256),  # 16 rows a block
    ("nvfp4_matvec_swiglu", dict(T=1, n_out=1024), (128, 1, 1), 256),  # down_proj at T=1: 128 blocks
    ("head_dense", dict(T=1, vocab=151936), (9496, 1, 1), 256),
    ("attention_decode", dict(T=5, n_kv_heads=8, max_splits=3), (5, 8, 3), 128),
    ("attention_decode_wide", dict(T=1, n_kv_heads=2, max_splits=32), (1, 2, 32), 128),
    ("grammar_advance", dict(B=17), (3, 1, 1), 256),
    ("qk_norm_rope_kv", dict(T=2, n_heads=16, n_kv_heads=8), (6, 2, 1), 128),
])
def test_launch_shapes(kernel, sizes, grid, block):
    assert launch_shape(kernel, **sizes) == (grid, (block, 1, 1))


def test_launch_shape_names_what_is_wrong():
    with pytest.raises(KeyError, match="needs size 'n_out'"):
        launch_shape("bf16_matvec", T=1)
    with pytest.raises(TypeError, match="no parameter.s. named 'out'"):
        launch_shape("bf16_matvec", T=1, out=16)
    with pytest.raises(KeyError, match="no kernel 'fp8_matvec'"):
        launch_shape("fp8_matvec", T=1, n_out=16)


def test_shape_problems_name_the_dimension():
    assert geometry.shape_problems(1024, 3072, 16, 8, 128, NVFP4) == []
    problems = geometry.shape_problems(1000, 3072, 16, 8, 96, FP8_E4M3)
    assert any("hidden_size = 1000 is not a multiple of 16 (fp8_e4m3 matvec)" in p for p in problems)
    assert any("head_dim = 96" in p for p in problems)
    for hd in (32, 64, 128):  # the trained tool model has head_dim 32
        assert geometry.shape_problems(512, 1536, 8, 4, hd, NVFP4) == [], hd
    assert "head_dim = 16: attention supports 32, 64, 128" in geometry.shape_problems(256, 512, 4, 2, 16, FP8_E4M3)


# ---- grammar: the references agree with toolcall.runtime.grammar.stepper (the CPU truth) ----

def make_grammar(paths, max_tools=3, allow_empty=False):
    catalog = Catalog(tools=tuple(Tool(f"tool{i}") for i in range(len(paths))),
                      answer=AnswerFormat(max_tools=max_tools, allow_empty=allow_empty))
    return grammar_from_paths(TokenizedCatalog(catalog, tuple(map(tuple, paths)), 1000, 1001))


GRAMMARS = {
    "prefix": dict(paths=[[5], [5, 6], [7, 8, 9], [7, 10]], max_tools=3),
    "empty_ok": dict(paths=[[4], [9, 2]], max_tools=2, allow_empty=True),
    "single": dict(paths=[[3, 4], [3, 5], [6]], max_tools=1),
    "wide": dict(paths=[[i, 200 + i % 3] for i in range(70)], max_tools=5),  # 2 bitset words
}


@pytest.mark.parametrize("name", GRAMMARS)
def test_grammar_kernels_follow_the_stepper(name):
    """Candidates under each sequence's own rules (the catalog's, at most one tool, a tool required) and the
    advance, greedy or taking a given pick (a sampled row's), step for step with the host stepper."""
    g = make_grammar(**GRAMMARS[name])
    stepper = GrammarStepper(g)
    rng = np.random.default_rng(len(name))
    B, S, max_out = 6, 8, 64
    M = g.max_edges_per_node
    records = stepper.initial_states(S)
    records[7] = stepper.initial_state([0])  # a subset of one tool: no separator after it (nothing else is left)
    state = ref.state_words(records).copy()
    status = np.zeros(S, np.int32)
    status[5] = 1  # a finished sequence stays put
    out_tokens = np.zeros((S, max_out), np.int32)
    out_len = np.zeros(S, np.int32)
    seq = np.array([0, 2, 3, -1, 5, 7], np.int32)
    max_tools = np.full(S, g.max_tools, np.int32)
    max_tools[2] = 1  # "at most one tool"
    allow_empty = np.full(S, g.allow_empty, np.uint8)
    allow_empty[3] = 0  # "at least one tool"
    drawn = np.array([False, True, False, False, False, True])  # rows whose pick is given
    token, pos = np.full(B, 11, np.int32), np.arange(B, dtype=np.int32)
    for _ in range(100):
        cand, valid = ref.grammar_candidates(seq, state, status, g, M, max_tools, allow_empty)
        live = (seq >= 0) & (status[np.maximum(seq, 0)] == 0)
        rows = np.maximum(seq, 0)
        want_tok, _, want_allowed = stepper.allowed_mask_batch(records[rows], None, max_tools[rows],
                                                               allow_empty[rows].astype(bool))
        np.testing.assert_array_equal(cand[live], want_tok[live])
        np.testing.assert_array_equal(valid[live].astype(bool), want_allowed[live])
        assert not valid[~live].any()
        logits = rng.standard_normal((B, M)).astype(np.float32)
        logits[:, 1] = logits[:, 0]  # ties: the lower token id must win
        before = records.copy()
        picks = np.array([rng.choice(np.flatnonzero(valid[b])) if drawn[b] and valid[b].any() else -1
                          for b in range(B)], np.int32)
        token2, pos2, cond = ref.grammar_advance(logits, cand, valid, seq, token, pos, g, max_out,
                                                 state, status, out_tokens, out_len, picks)
        records = state.view(records.dtype).reshape(S)
        for b in np.flatnonzero(live):
            pick = picks[b] if picks[b] >= 0 else int(np.argmax(np.where(valid[b], logits[b], -np.inf)))
            assert token2[b] == cand[b, pick] and pos2[b] == pos[b] + 1
            new, taken = stepper.step_batch(before[seq[b]:seq[b] + 1], np.array([cand[b, pick]]))
            assert taken[0] >= 0 and new.tobytes() == records[seq[b]:seq[b] + 1].tobytes()
        for b in np.flatnonzero(~live):
            assert token2[b] == token[b] and pos2[b] == pos[b]
        token, pos = token2, pos2
        if not cond:
            break
    assert not cond and set(status[[0, 2, 3, 7]]) == {1}
    for s in (0, 2, 3, 7):
        names = decode_tools(g, out_tokens[s, :out_len[s]].tolist())
        assert (0 if allow_empty[s] else 1) <= len(names) <= max_tools[s]
        assert len(set(names)) == len(names)
