"""Per-kernel GPU parity with kernels/reference.py, table-driven, plus the bit-exactness the
runtime relies on: batch-independence, fused == unfused, dense head == sparse head. (Attention:
tests/test_kernels_gpu_attention.py; the linear layers over batch sizes: tests/test_kernels_gpu_linear.py;
the grammar loop: tests/test_kernels_gpu_loop.py.)

Without a GPU the parity tests skip with the reason; ``test_cases_pack_their_arguments``
still runs every case on a dry-run device, so argument names and kinds are checked on CPU.
"""
from __future__ import annotations

import re
import zlib

import ml_dtypes
import numpy as np
import pytest

from toolcall.common.formats import BF16 as BF16_WEIGHTS
from toolcall.common.formats import FP8_E4M3, NVFP4
from toolcall.kernels import reference as ref
from toolcall.kernels import reference_attention as ref_attn
from toolcall.kernels.declarations import Launch
from toolcall.kernels.geometry import PLAIN, RMSNORM, SWIGLU, matvec_kernel
from toolcall.kernels.launch import DeviceArray
from toolcall.kernels.runner import DryRunGpu, KernelRunner, Out
from toolcall.kernels.weight_args import weight_args

BF16 = ml_dtypes.bfloat16
EPS = np.float32(1e-6)


def bf16(rng, *shape):
    return rng.standard_normal(shape).astype(BF16)


def fp8_codes(rng, *shape):
    c = rng.integers(0, 256, shape, dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] = 0x38  # no NaN codes (the quantizer never writes them)
    return c


# ---- matvec family: fmt, prologue, T, in, out, bias, accumulate ----
MATVEC = [(FP8_E4M3, PLAIN, 1, 1024, 48, False, False), (FP8_E4M3, RMSNORM, 8, 1024, 2064, True, False),
          (FP8_E4M3, SWIGLU, 13, 3072, 64, False, True), (FP8_E4M3, PLAIN, 5, 96, 33, True, True),
          (NVFP4, PLAIN, 1, 1024, 40, False, False), (NVFP4, RMSNORM, 9, 2048, 17, True, False),
          (NVFP4, SWIGLU, 3, 3072, 32, False, True), (NVFP4, PLAIN, 2, 96, 16, False, False),
          (BF16_WEIGHTS, PLAIN, 4, 1024, 24, True, True), (BF16_WEIGHTS, RMSNORM, 16, 520, 16, False, False),
          (BF16_WEIGHTS, SWIGLU, 1, 3072, 8, False, False)]
# random weight arguments in each format's kernel layout: (w, scales), as kernels/weight_args.py orders them
WEIGHTS = {
    FP8_E4M3: lambda rng, n_out, n_in: (fp8_codes(rng, n_out, n_in), rng.uniform(1e-3, 1e-2, n_out).astype(np.float32)),
    # a per-row global scale: two source tensors of different scales fused (q|k, gate|up)
    NVFP4: lambda rng, n_out, n_in: (rng.integers(0, 256, (n_out, n_in // 2), dtype=np.uint8),
                                     rng.integers(0x28, 0x48, (n_out, n_in // 16), dtype=np.uint8),
                                     np.where(np.arange(n_out) < n_out // 2, 0.01, 0.0037).astype(np.float32)),
    BF16_WEIGHTS: lambda rng, n_out, n_in: (bf16(rng, n_out, n_in),),
}


def case_matvec(d: KernelRunner, rng, fmt, pro, T, n_in, n_out, with_bias, acc):
    stride = n_in + 4 * (T % 2)
    x = rng.standard_normal((T, stride)).astype(np.float32)
    up = rng.standard_normal((T, stride)).astype(np.float32)
    norm_w = bf16(rng, n_in)
    w, *scales = WEIGHTS[fmt](rng, n_out, n_in)
    weights = dict(zip((a.param for a in weight_args(fmt)), (w, *scales)))
    bias = rng.standard_normal(n_out).astype(np.float32) if with_bias else None
    y0 = rng.standard_normal((T, n_out)).astype(np.float32)
    head = {PLAIN: dict(x=x), RMSNORM: dict(x=x, norm_w=norm_w, eps=EPS), SWIGLU: dict(gate=x, up=up)}[pro]
    fn = matvec_kernel(fmt, pro)

    def launch(rows):
        h = {k: a[rows] if isinstance(a, np.ndarray) and a.shape[0] == T else a for k, a in head.items()}
        return d.run(fn, **h, x_stride=stride, **weights, bias=bias, y=Out(y0[rows]), T=len(rows), n_in=n_in,
                     n_out=n_out, accumulate=int(acc))["y"]

    got = launch(np.arange(T))
    xs = x[:, :n_in]
    xp = {PLAIN: xs, RMSNORM: ref.rmsnorm(xs, norm_w, EPS), SWIGLU: ref.swiglu(xs, up[:, :n_in])}[pro]
    ref_head = {PLAIN: (xs,), RMSNORM: (xs, norm_w, EPS), SWIGLU: (xs, up[:, :n_in])}[pro]
    want = ref.MATVEC_REFERENCES[fn](*ref_head, w, *scales, bias=bias, y=y0, accumulate=acc)
    wd = ref.dequant(fmt, w, *scales)
    scale = np.abs(xp) @ np.abs(wd).T + (np.abs(y0) if acc else 0) + (np.abs(bias) if with_bias else 0)
    d.close(got, want, atol=3e-5 * scale + 1e-6, label=fn)
    d.same(launch(np.array([T - 1])), got[T - 1:], f"{fn}: row {T - 1} alone vs in a batch of {T}")


def case_fusions(d: KernelRunner, rng):
    """Fused prologues give the bits of the unfused kernels; dense head == sparse head."""
    T, n, n_out, vocab = 5, 1024, 32, 999
    x = rng.standard_normal((T, n)).astype(np.float32)
    up = rng.standard_normal((T, n)).astype(np.float32)
    nw, wb, w8 = bf16(rng, n), bf16(rng, n_out, n), fp8_codes(rng, n_out, n)
    s8 = rng.uniform(1e-3, 1e-2, n_out).astype(np.float32)
    y = np.zeros((T, n_out), np.float32)
    xn = d.run("rmsnorm", x=x, x_stride=n, rows=None, w=nw, eps=EPS, y=Out(np.zeros_like(x)), y_stride=n, B=T,
               n=n)["y"]
    d.close(xn, ref.rmsnorm(x, nw, EPS), atol=1e-5, rtol=1e-5, label="rmsnorm")
    mv = dict(bias=None, y=Out(y), T=T, n_in=n, n_out=n_out, accumulate=0)
    fused = d.run("bf16_matvec_rmsnorm", x=x, x_stride=n, norm_w=nw, eps=EPS, w=wb, **mv)["y"]
    plain = d.run("bf16_matvec", x=xn, x_stride=n, w=wb, **mv)["y"]
    d.same(fused, plain, "bf16_matvec_rmsnorm vs rmsnorm + bf16_matvec")
    act = d.run("swiglu", gate=x, up=up, in_stride=n, y=Out(np.zeros_like(x)), y_stride=n, T=T, n=n)["y"]
    d.close(act, ref.swiglu(x, up), atol=1e-7, rtol=2e-6, label="swiglu")
    fp8_fused, fp8_plain = matvec_kernel(FP8_E4M3, SWIGLU), matvec_kernel(FP8_E4M3)
    fused = d.run(fp8_fused, gate=x, up=up, x_stride=n, w=w8, w_scale=s8, **mv)["y"]
    plain = d.run(fp8_plain, x=act, x_stride=n, w=w8, w_scale=s8, **mv)["y"]
    d.same(fused, plain, f"{fp8_fused} vs swiglu + {fp8_plain}")
    table = bf16(rng, vocab, n)
    dense = d.run("head_dense", x=x, x_stride=n, norm_w=nw, eps=EPS, table=table,
                  logits=Out(np.zeros((T, vocab), np.float32)), T=T, hidden=n, vocab=vocab)["logits"]
    want = ref.head_dense(x, nw, EPS, table)
    d.close(dense, want, atol=3e-5 * (np.abs(ref.rmsnorm(x, nw, EPS)) @ np.abs(table.astype(np.float32)).T) + 1e-6,
            label="head_dense")
    E = 40
    cand = rng.integers(-2, vocab + 2, (T, E)).astype(np.int32)
    valid = rng.integers(0, 2, (T, E)).astype(np.uint8)
    sparse = d.run("head_sparse", xn=xn, x_stride=n, cand=cand, valid=valid, table=table, hidden=n, vocab=vocab,
                   n_cand=E, B=T, out=Out(np.zeros((T, E), np.float32)))["out"]
    gathered = d.run("head_gather", logits=dense, cand=cand, valid=valid, vocab=vocab, n_cand=E, B=T,
                     out=Out(np.zeros((T, E), np.float32)))["out"]
    d.same(gathered, ref.head_gather(dense, cand, valid), "head_gather")
    d.same(sparse, gathered, "head_sparse vs head_dense at the candidates")


def case_rows(d: KernelRunner, rng):
    """embed_gather (and its rotary table: sincosf against numpy's float64-rounded cos / sin, a few ulp), rmsnorm
    with a row gather, argmax."""
    vocab, hidden, T = 300, 256, 5
    table = bf16(rng, vocab, hidden)
    tokens = np.array([0, 299, -1, 300, 17], np.int32)
    pos, inv_freq = np.array([0, 1, 511, 2047, 40000], np.int32), rope_inputs(rng, 1, 1, 128, False)[0]
    got = d.run("embed_gather", tokens=tokens, table=table, vocab=vocab, hidden=hidden,
                x=Out(np.ones((T, hidden), np.float32)), pos=pos, inv_freq=inv_freq, rope_pairs=64,
                rope=Out(np.ones((T, 64, 2), np.float32)), T=T)
    x = got["x"]
    d.same(x, ref.embed_gather(tokens, table), "embed_gather")
    d.close(got["rope"], ref_attn.rope_table(pos, inv_freq), atol=2e-6, label="embed_gather's rotary table")
    alone = d.run("embed_gather", tokens=tokens, table=table, vocab=vocab, hidden=hidden,
                  x=Out(np.ones((T, hidden), np.float32)), pos=None, inv_freq=None, rope_pairs=64, rope=None, T=T)
    d.same(alone["x"], x, "embed_gather without a rotary table")
    rows = np.array([4, -1, 0], np.int32)
    nw = bf16(rng, hidden)
    y = d.run("rmsnorm", x=x, x_stride=hidden, rows=rows, w=nw, eps=EPS, y=Out(np.ones((3, hidden), np.float32)),
              y_stride=hidden, B=3, n=hidden)["y"]
    d.close(y, ref.rmsnorm(x, nw, EPS, rows), atol=1e-6, rtol=1e-5, label="rmsnorm gather")
    n = 151936
    logits = rng.standard_normal((4, n)).astype(np.float32)
    logits[1, [5, 100000]] = 9.0
    logits[2, ::7] = np.nan
    logits[3] = -np.inf
    got = d.run("argmax_rows", logits=logits, stride=n, n=n, T=4, out_idx=Out(np.zeros(4, np.int32)),
                out_val=Out(np.zeros(4, np.float32)))
    want_idx, want_val = ref.argmax_rows(logits)
    d.same(got["out_idx"], want_idx, "argmax index")
    d.same(got["out_val"], want_val, "argmax value")


def rope_inputs(rng, nh, nkv, hd, qk_norm):
    inv_freq = (1.0 / 1e6 ** (np.arange(0, hd, 2) / hd)).astype(np.float32)
    qw, kw = (bf16(rng, hd), bf16(rng, hd)) if qk_norm else (None, None)
    return inv_freq, qw, kw


def case_rope_kv(d: KernelRunner, rng, nh, nkv, hd, qk_norm):
    """qk_norm_rope_kv in place on a fused qkv buffer, K and V into the paged cache."""
    T, width, ps = 4, (nh + 2 * nkv) * hd, 16
    qkv = rng.standard_normal((T, width)).astype(np.float32)
    pos = np.array([5, 17, 0, 40000], np.int32)
    seq = np.array([0, 1, -1, 1], np.int32)
    bt = np.full((2, 2501), -1, np.int32)
    bt[0, 0], bt[1, 1], bt[1, 2500] = 3, 2, 4
    inv_freq, qw, kw = rope_inputs(rng, nh, nkv, hd, qk_norm)
    table = ref_attn.rope_table(pos, inv_freq)  # what embed_gather makes (case_rows checks it)
    kc, vc = (rng.standard_normal((5, ps, nkv, hd)).astype(BF16) for _ in range(2))
    base = d.gpu.upload(qkv)
    k_off, v_off = nh * hd * 4, (nh + nkv) * hd * 4
    k_dev, v_dev = DeviceArray(base.ptr + k_off, base.nbytes - k_off), DeviceArray(base.ptr + v_off, base.nbytes - v_off)
    caches = d.run("qk_norm_rope_kv", q=base, q_stride=width, k=k_dev, k_stride=width, v=v_dev, v_stride=width, seq=seq,
                   pos=pos, block_table=bt, max_pages_per_seq=bt.shape[1], page_size=ps, q_norm_w=qw, k_norm_w=kw,
                   rope=table, eps=EPS, T=T, n_heads=nh, n_kv_heads=nkv, head_dim=hd, k_cache=Out(kc),
                   v_cache=Out(vc))
    kc2, vc2 = caches["k_cache"], caches["v_cache"]
    got = d.gpu.download(base, qkv.shape, qkv.dtype)
    kw_ref, vw_ref = kc.copy(), vc.copy()
    q2, k2 = ref_attn.qk_norm_rope_kv(qkv[:, :nh * hd], qkv[:, nh * hd:(nh + nkv) * hd], qkv[:, (nh + nkv) * hd:], seq,
                                 pos, bt, ps, qw, kw, table, EPS, nh, nkv, hd, kw_ref, vw_ref)
    d.close(got[:, :(nh + nkv) * hd], np.concatenate([q2, k2], axis=1), atol=3e-5, rtol=1e-5,
            label="qk_norm_rope_kv q, k")
    d.same(got[:, (nh + nkv) * hd:], qkv[:, (nh + nkv) * hd:], "qk_norm_rope_kv leaves v alone")
    # the cache holds bf16 of the kernel's own k (rounding of a 1-ulp rope difference aside)
    mine_k, mine_v = kc.copy(), vc.copy()
    ref_attn.kv_write(got[:, nh * hd:(nh + nkv) * hd], qkv[:, (nh + nkv) * hd:], seq, pos, bt, ps, mine_k, mine_v)
    d.same(kc2.view(np.uint16), mine_k.view(np.uint16), "qk_norm_rope_kv: k cache = bf16(k)")
    d.same(vc2.view(np.uint16), vw_ref.view(np.uint16), "qk_norm_rope_kv: v cache")
    d.gpu.free(base)


MATVEC_IDS = [f"{f.name}{p}-T{t}-in{i}-out{o}" for f, p, t, i, o, *_ in MATVEC]
CASES = ([pytest.param(case_matvec, spec, id=i) for spec, i in zip(MATVEC, MATVEC_IDS)]
         + [pytest.param(case_fusions, (), id="fusions"), pytest.param(case_rows, (), id="rows")]
         + [pytest.param(case_rope_kv, spec, id=f"rope_kv-{spec}")
            for spec in ((16, 8, 128, True), (4, 2, 64, False), (8, 4, 32, True))])


def run_case(dev: KernelRunner, case, spec) -> None:
    """A table case on the GPU, its random inputs seeded by the case's spec."""
    case(dev, np.random.default_rng(zlib.crc32(repr(spec).encode())), *spec)


def pack_case(case, spec) -> None:
    """A table case on a dry-run device: every launch names its kernel's parameters (each once) with the right
    kinds (the CPU's check of a GPU case)."""
    dry = KernelRunner(DryRunGpu())
    case(dry, np.random.default_rng(0), *spec)
    assert dry.gpu.launches


@pytest.mark.gpu
@pytest.mark.parametrize("case,spec", CASES)
def test_kernel_parity(dev, case, spec):
    run_case(dev, case, spec)


@pytest.mark.parametrize("case,spec", CASES)
def test_cases_pack_their_arguments(case, spec):
    pack_case(case, spec)


GOOD = dict(x=None, x_stride=4, w=None, w_scale=None, bias=None, y=None, T=1, n_in=16, n_out=16, accumulate=0)


@pytest.mark.parametrize("change,message", [
    (dict(w_scale=...), "fp8_e4m3_matvec: missing argument(s) 'w_scale'"),
    (dict(global_scale=None), "fp8_e4m3_matvec: no parameter(s) named 'global_scale'"),
    (dict(x_stride=1.5), "'x_stride' is an integer"),
    (dict(accumulate=2**31), "accumulate = 2147483648 does not fit in int32"),
    (dict(w=3.0), "'w' is a device pointer"),
])
def test_launcher_refuses_bad_arguments_by_name(change, message):
    """A missing or unknown name, or a value of the wrong kind, fails on the host naming kernel and parameter,
    at the Launch (names) or at packing (kinds)."""
    dry = KernelRunner(DryRunGpu())
    args = {k: v for k, v in {**GOOD, **change}.items() if v is not ...}
    with pytest.raises(TypeError, match=re.escape(message)):
        dry.launch(Launch(matvec_kernel(FP8_E4M3), args))
