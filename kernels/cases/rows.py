"""Row-wise kernel cases against kernels/reference.py: the matvec family (every format x prologue), the fused
prologues against the unfused kernels (bits), dense head == sparse head, embed_gather / rmsnorm / argmax, and
qk_norm_rope_kv into the paged cache. A row alone gives the bits it gives in a batch."""
from __future__ import annotations

import numpy as np

from toolcall.common.formats import BF16 as BF16_WEIGHTS
from toolcall.common.formats import FP8_E4M3, NVFP4
from toolcall.kernels import reference as ref
from toolcall.kernels import reference_attention as ref_attn
from toolcall.kernels.cases import KernelCase
from toolcall.kernels.cases.inputs import BF16, EPS, WEIGHTS, bf16, fp8_codes, rope_inputs
from toolcall.kernels.geometry import PLAIN, RMSNORM, SWIGLU, matvec_kernel
from toolcall.kernels.launch import DeviceArray
from toolcall.kernels.runner import KernelRunner, Out
from toolcall.kernels.weight_args import weight_args

# ---- matvec family: fmt, prologue, T, in, out, bias, accumulate ----
MATVEC = [(FP8_E4M3, PLAIN, 1, 1024, 48, False, False), (FP8_E4M3, RMSNORM, 8, 1024, 2064, True, False),
          (FP8_E4M3, SWIGLU, 13, 3072, 64, False, True), (FP8_E4M3, PLAIN, 5, 96, 33, True, True),
          (NVFP4, PLAIN, 1, 1024, 40, False, False), (NVFP4, RMSNORM, 9, 2048, 17, True, False),
          (NVFP4, SWIGLU, 3, 3072, 32, False, True), (NVFP4, PLAIN, 2, 96, 16, False, False),
          (BF16_WEIGHTS, PLAIN, 4, 1024, 24, True, True), (BF16_WEIGHTS, RMSNORM, 16, 520, 16, False, False),
          (BF16_WEIGHTS, SWIGLU, 1, 3072, 8, False, False)]
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



# small variants for the executor's CI table (every matvec entry point at a few hundred inputs)
MATVEC_SMALL = [(FP8_E4M3, RMSNORM, 3, 256, 24, True, False), (FP8_E4M3, SWIGLU, 2, 256, 16, False, True),
                (NVFP4, RMSNORM, 3, 256, 16, True, False), (NVFP4, SWIGLU, 2, 256, 24, False, True),
                (BF16_WEIGHTS, PLAIN, 3, 96, 24, True, True), (BF16_WEIGHTS, RMSNORM, 2, 256, 16, False, False),
                (BF16_WEIGHTS, SWIGLU, 3, 256, 8, False, False)]
CI_MATVEC = {(FP8_E4M3, PLAIN, 5, 96, 33, True, True), (NVFP4, PLAIN, 2, 96, 16, False, False), *MATVEC_SMALL}
ROPE_KV = ((16, 8, 128, True), (4, 2, 64, False), (8, 4, 32, True))
CI_ROPE_KV = {(4, 2, 64, False), (8, 4, 32, True)}

CASES = ([KernelCase(f"{f.name}{p}-T{t}-in{i}-out{o}", case_matvec, spec, ci=spec in CI_MATVEC)
          for spec in MATVEC + MATVEC_SMALL for f, p, t, i, o, *_ in [spec]]
         + [KernelCase("fusions", case_fusions, (), ci=True), KernelCase("rows", case_rows, (), ci=True)]
         + [KernelCase(f"rope_kv-{spec}", case_rope_kv, spec, ci=spec in CI_ROPE_KV) for spec in ROPE_KV])
