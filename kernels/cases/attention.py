"""The attention kernels against kernels/reference_attention.py, and the bits the runtime relies on: a decode row's
output does not depend on the other rows of its launch (its splits come from its position alone), and for the
tensor-core prefill attention a chunk that starts mid-sequence and rows beside padding rows give the bits they
give in the whole prompt. Specs are head geometries (n_heads, n_kv_heads, head_dim)."""
from __future__ import annotations

import numpy as np

from toolcall.kernels import geometry
from toolcall.kernels import reference_attention as ref_attn
from toolcall.kernels.cases import KernelCase
from toolcall.kernels.cases.inputs import BF16, EPS, rope_inputs
from toolcall.kernels.launch import DeviceArray
from toolcall.kernels.runner import KernelRunner, Out

def case_attention(d: KernelRunner, rng, nh, nkv, hd):
    """attention_decode (fused rope, KV write, split-KV attention, merge) vs the reference at positions 0, inside
    one chunk, on chunk edges and past many (splits of one chunk, and of several where the launch has 3 split slots);
    a decode row alone gives the bits it gives beside other rows; the prefill partials + merge vs the reference,
    and the same rows as decode rows close to them. Pages of 32 positions, of 48 at head_dim 64 (not a power of
    two: looked up by division)."""
    decode_and_prefill(d, rng, nh, nkv, hd, lengths=[700, 33, 300, 2048, 65, 66, 1],
                       seq=[0, 1, -1, 2, 3, 4, 5, 6], pos=[699, 32, 3, 63, 2047, 64, 65, 0], alone=(0, 4, 7),
                       prefill_rows=(299, 40))


def case_attention_small(d: KernelRunner, rng, nh, nkv, hd):
    """case_attention at the executor's sizes: decode rows at positions 0, 31, 32, 63, 64, 65 and 299 (5 one-chunk
    splits, and 3 of two chunks), a prefill of 40 positions; the same checks."""
    decode_and_prefill(d, rng, nh, nkv, hd, lengths=[300, 33, 40, 64, 65, 66, 1, 32],
                       seq=[0, 1, -1, 2, 3, 4, 5, 6, 7], pos=[299, 32, 3, 39, 63, 64, 65, 0, 31], alone=(0, 5, 7),
                       prefill_rows=(39, 17))


def decode_and_prefill(d: KernelRunner, rng, nh, nkv, hd, lengths, seq, pos, alone, prefill_rows):
    """Sequence s holds lengths[s] positions; decode rows (seq, pos) (-1: a padding row); the rows ``alone`` again
    one a launch; sequence 2 again as a prefill of all its lengths[2] positions, whose ``prefill_rows`` are checked
    as decode rows too."""
    ps = 48 if hd == 64 else 32
    pages = [geometry.cdiv(n, ps) for n in lengths]
    perm = rng.permutation(sum(pages))
    bt = np.full((len(lengths), max(pages)), -1, np.int32)
    for s, start in enumerate(np.cumsum([0] + pages[:-1])):
        bt[s, :pages[s]] = perm[start:start + pages[s]]
    kc, vc = (rng.standard_normal((sum(pages), ps, nkv, hd)).astype(BF16) for _ in range(2))
    scale = np.float32(hd ** -0.5)
    inv_freq, qw, kw = rope_inputs(rng, nh, nkv, hd, True)

    heads = dict(n_heads=nh, n_kv_heads=nkv, head_dim=hd)
    paging = dict(block_table=bt, max_pages_per_seq=bt.shape[1], page_size=ps)

    def partials(T, S):
        return dict(sm_scale=scale, max_splits=S, part_o=Out(np.zeros((T, nh, S, hd), np.float32)),
                    part_ml=Out(np.zeros((T, nh, S, 2), np.float32)))

    def decode(q, k, v, seq, pos, kc, vc, S, prefetch=None):
        T = len(q)
        return d.run(geometry.decode_kernel(nh, nkv), q=q, q_stride=nh * hd, k=Out(k), k_stride=nkv * hd, v=v,
                     v_stride=nkv * hd, seq=seq, pos=pos, **paging, k_cache=Out(kc), v_cache=Out(vc), q_norm_w=qw,
                     k_norm_w=kw, rope=ref_attn.rope_table(pos, inv_freq), eps=EPS, **heads, **partials(T, S),
                     counters=Out(np.zeros((T, nkv), np.int32)), out=Out(np.ones((T, nh * hd), np.float32)),
                     out_stride=nh * hd, prefetch=prefetch, prefetch_bytes=0 if prefetch is None else prefetch.nbytes,
                     T=T)

    seq, pos = np.array(seq, np.int32), np.array(pos, np.int32)
    q, k, v = (rng.standard_normal((len(seq), n * hd)).astype(np.float32) for n in (nh, nkv, nkv))
    for S in (geometry.decode_max_splits(max(lengths)), 3):  # one-chunk splits; 3 of several chunks each
        got = decode(q, k, v, seq, pos, kc, vc, S, prefetch=np.arange(3 << 20, dtype=np.uint8))  # 3 MiB into L2
        kc2, vc2, counters, out = got["k_cache"], got["v_cache"], got["counters"], got["out"]
        kc_ref, vc_ref = kc.copy(), vc.copy()
        want, _ = ref_attn.attention_decode(q, k, v, seq, pos, bt, ps, kc_ref, vc_ref, qw, kw,
                                            ref_attn.rope_table(pos, inv_freq), EPS, nh, nkv, hd, scale, S)
        d.close(out, want, atol=2e-5, rtol=1e-5, label=f"attention_decode, {S} split slots")
        d.same(counters, np.zeros_like(counters), "attention_decode leaves its split counters at zero")
        d.close(kc2.astype(np.float32), kc_ref.astype(np.float32), atol=1e-2, rtol=1e-2,
                label="attention_decode k cache")
        d.same(vc2.view(np.uint16), vc_ref.view(np.uint16), "attention_decode v cache")
        for r in alone:  # a row alone: the bits it had beside the others
            row = slice(r, r + 1)
            one = decode(q[row], k[row], v[row], seq[row], pos[row], kc, vc, S)["out"]
            d.same(one, out[row], f"decode row at position {pos[r]} alone vs beside {len(seq) - 1} others, "
                                  f"{S} split slots")
    # prefill of seq 2's positions from the same raw projections the decode rows would get
    T = lengths[2]
    pseq, ppos = np.full(T, 2, np.int32), np.arange(T, dtype=np.int32)
    width = (nh + 2 * nkv) * hd
    qkv = rng.standard_normal((T, width)).astype(np.float32)
    base = d.gpu.upload(qkv)
    kd, vd = DeviceArray(base.ptr + nh * hd * 4, 0), DeviceArray(base.ptr + (nh + nkv) * hd * 4, 0)
    kcd, vcd = d.gpu.upload(kc), d.gpu.upload(vc)
    d.run("qk_norm_rope_kv", q=base, q_stride=width, k=kd, k_stride=width, v=vd, v_stride=width, seq=pseq, pos=ppos,
          **paging, q_norm_w=qw, k_norm_w=kw, rope=ref_attn.rope_table(ppos, inv_freq), eps=EPS, T=T, **heads,
          k_cache=kcd, v_cache=vcd)
    start, length = geometry.prefill_tiles(pseq, ppos, max(1, geometry.ATTN_QCHUNK // (nh // nkv)))
    S = geometry.attention_max_splits(max(lengths))
    parts = d.run("attention_prefill_partial", q=base, q_stride=width, seq=pseq, pos=ppos, tile_start=start,
                  tile_len=length, **paging, k_cache=kcd, v_cache=vcd, **heads, **partials(T, S), n_tiles=len(start))
    pout = d.run("attention_merge", part_o=parts["part_o"], part_ml=parts["part_ml"], seq=pseq, pos=ppos, n_heads=nh,
                 head_dim=hd, max_splits=S, out=Out(np.ones((T, nh * hd), np.float32)), out_stride=nh * hd,
                 T=T)["out"]
    kc_pre, vc_pre = d.gpu.download(kcd, kc.shape, kc.dtype), d.gpu.download(vcd, vc.shape, vc.dtype)
    # The attention kernels are checked on the q and K/V cache the rope kernel wrote (case_rope_kv checks
    # that kernel): a 1-ulp rope difference that flips one bf16 K rounding moves a score by ~2^-9
    # relative, which an H200 run (2026-12-04) showed as 1.5e-4 in a few outputs against the reference's own cache.
    q_dev = d.gpu.download(base, qkv.shape, qkv.dtype)[:, :nh * hd]
    d.close(pout, ref_attn.attention(q_dev, pseq, ppos, bt, ps, kc_pre, vc_pre, nh, nkv, hd, scale), atol=2e-5,
            rtol=1e-5, label="attention prefill")
    # prefill rows again as decode rows over the prefill's cache: the same values to rounding
    for r in prefill_rows:
        row = slice(r, r + 1)
        raw = qkv[row]
        got = decode(raw[:, :nh * hd], raw[:, nh * hd:(nh + nkv) * hd], raw[:, (nh + nkv) * hd:], pseq[row],
                     ppos[row], kc_pre, vc_pre, geometry.decode_max_splits(max(lengths)))
        d.close(got["out"], pout[row], atol=2e-5, rtol=1e-5, label=f"decode row at position {r} vs prefill tiles")
    for arr in (base, kcd, vcd):
        d.gpu.free(arr)


def case_attention_batch(d: KernelRunner, rng, nh, nkv, hd):
    """attention_decode over 512 rows at positions spread over 0 .. 2047 against the reference; three of them alone
    give the bits they had among the 512. Every row's pages are one shared 2,048-position run (read-only) but the
    page holding its own position, which is its own (the row writes its K/V there)."""
    ps, rows, shared = 32, 512, 2048 // 32
    pos = np.sort(rng.integers(0, 2048, rows)).astype(np.int32)
    pos[0], pos[-1] = 0, 2047
    seq = rng.permutation(rows).astype(np.int32)
    bt = np.tile(np.arange(shared, dtype=np.int32), (rows, 1))
    bt[seq, pos // ps] = shared + np.arange(rows, dtype=np.int32)  # the page of each row's own position
    kc, vc = (rng.standard_normal((shared + rows, ps, nkv, hd)).astype(BF16) for _ in range(2))
    q, k, v = (rng.standard_normal((rows, n * hd)).astype(np.float32) for n in (nh, nkv, nkv))
    inv_freq, qw, kw = rope_inputs(rng, nh, nkv, hd, True)
    rope = ref_attn.rope_table(pos, inv_freq)
    S, scale = geometry.decode_max_splits(2048), np.float32(hd ** -0.5)

    def decode(r):
        T = len(r)
        return d.run(geometry.decode_kernel(nh, nkv), q=q[r], q_stride=nh * hd, k=Out(k[r]), k_stride=nkv * hd, v=v[r],
                     v_stride=nkv * hd, seq=seq[r], pos=pos[r], block_table=bt, max_pages_per_seq=shared, page_size=ps,
                     k_cache=Out(kc), v_cache=Out(vc), q_norm_w=qw, k_norm_w=kw, rope=rope[r], eps=EPS,
                     n_heads=nh, n_kv_heads=nkv, head_dim=hd, sm_scale=scale, max_splits=S,
                     part_o=Out(np.zeros((T, nh, S, hd), np.float32)), part_ml=Out(np.zeros((T, nh, S, 2), np.float32)),
                     counters=Out(np.zeros((T, nkv), np.int32)), out=Out(np.ones((T, nh * hd), np.float32)),
                     out_stride=nh * hd, prefetch=None, prefetch_bytes=0, T=T)["out"]

    every = decode(np.arange(rows))
    if d.dry:  # packed; the reference's 512 rows only where there is a result to hold against it
        return
    want, _ = ref_attn.attention_decode(q, k, v, seq, pos, bt, ps, kc.copy(), vc.copy(), qw, kw, rope, EPS, nh, nkv,
                                        hd, scale, S)
    d.close(every, want, atol=2e-5, rtol=1e-5, label="attention_decode, 512 rows")
    for r in (0, 255, rows - 1):
        d.same(decode(np.array([r])), every[r:r + 1], f"decode row at position {pos[r]} alone vs among 512")


def case_attention_mma(d: KernelRunner, rng, nh, nkv, hd):
    """attention_prefill_mma (one pass, tensor cores) over a 300-row prompt against the reference, and the rows of
    a chunk that starts mid-sequence (row 170, its keys before it already cached) with the same bits as in the
    whole prompt's launch (other tiles, other neighbours)."""
    ps, T = 32, 300
    n_pages = geometry.cdiv(T, ps)
    bt = rng.permutation(n_pages + 3)[:n_pages].astype(np.int32)[None, :]
    kc, vc = (rng.standard_normal((n_pages + 3, ps, nkv, hd)).astype(BF16) for _ in range(2))
    q = rng.standard_normal((T, nh * hd)).astype(np.float32)
    seq, pos = np.zeros(T, np.int32), np.arange(T, dtype=np.int32)
    scale = np.float32(hd ** -0.5)
    rows_per_tile = geometry.MMA.rows_per_tile(nh, nkv)

    def launch(start, length, seq=seq, pos=pos) -> np.ndarray:
        return d.run("attention_prefill_mma", q=q, q_stride=nh * hd, seq=seq, pos=pos, tile_start=start,
                     tile_len=length, block_table=bt, max_pages_per_seq=n_pages, page_size=ps, k_cache=kc,
                     v_cache=vc, n_heads=nh, n_kv_heads=nkv, head_dim=hd, sm_scale=scale,
                     out=Out(np.ones((T, nh * hd), np.float32)), out_stride=nh * hd, n_tiles=len(start))["out"]

    start, length = geometry.prefill_tiles(seq, pos, rows_per_tile)
    whole = launch(start, length)
    want = ref_attn.attention_prefill_mma(q, seq, pos, start, length, bt, ps, kc, vc, nh, nkv, hd, scale,
                                     np.ones((T, nh * hd), np.float32))
    d.close(whole, want, atol=2e-5, rtol=1e-5, label="attention_prefill_mma")
    start, length = geometry.prefill_tiles(seq[170:], pos[170:], rows_per_tile)
    d.same(launch(start + 170, length)[170:], whole[170:],
           "attention_prefill_mma: a chunk from row 170 vs the same rows of the prompt")
    # the graph's fixed tiles run past a last chunk's rows into padding rows (seq, pos -1): zeros there
    pad_seq, pad_pos = np.where(np.arange(T) < 290, seq, -1).astype(np.int32), np.where(np.arange(T) < 290, pos, -1)
    start = np.arange(256, T, rows_per_tile, dtype=np.int32)  # with G = 8, 8-row tiles: 296 .. 299 all padding
    got = launch(start, np.minimum(rows_per_tile, T - start).astype(np.int32), pad_seq, pad_pos.astype(np.int32))
    d.same(got[256:290], whole[256:290], "attention_prefill_mma: rows beside padding rows in their tile")
    d.same(got[290:], np.zeros_like(got[290:]), "attention_prefill_mma: padding rows in a tile are zeros")



ATTENTION = ((16, 8, 128), (4, 4, 128), (4, 2, 64), (3, 1, 64), (8, 2, 128), (8, 1, 64), (16, 2, 128), (8, 4, 32),
             (16, 1, 32))
ATTENTION_BATCH = ((16, 8, 128), (8, 1, 64))
ATTENTION_MMA = ((16, 8, 128), (3, 1, 64), (8, 2, 64), (8, 1, 64), (8, 4, 32), (16, 2, 128))
# case_attention_small's geometries: group sizes 1, 2, 4, 8 (attention_decode and attention_decode_wide), head_dim
# 64 (pages of 48: partial, looked up by division), 128 and 32
ATTENTION_SMALL = ((2, 2, 64), (4, 2, 64), (4, 1, 128), (8, 1, 32))
CI = {("mma", (3, 1, 64)), ("mma", (8, 4, 32))}

CASES = ([KernelCase(f"attention-{spec}", case_attention, spec, ci=("attention", spec) in CI) for spec in ATTENTION]
         + [KernelCase(f"attention_small-{spec}", case_attention_small, spec, ci=True) for spec in ATTENTION_SMALL]
         + [KernelCase(f"attention_batch-{spec}", case_attention_batch, spec, ci=("batch", spec) in CI)
            for spec in ATTENTION_BATCH]
         + [KernelCase(f"attention_mma-{spec}", case_attention_mma, spec, ci=("mma", spec) in CI)
            for spec in ATTENTION_MMA])
