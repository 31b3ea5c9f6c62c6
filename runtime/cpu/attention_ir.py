"""LLVM IR for attention's runs of positions (llvmlite; the numba intrinsics in
runtime/cpu/attention_kernels.py call these emitters).

A run is up to 16 consecutive positions of one page (K/V rows ``stride`` bytes apart), for one
query head:

- ``emit_scores``: the run's 16 q.k dot products, each in exactly the order of a 1x1 tile of
  runtime/cpu/simd_ir.py (block b into accumulator b % 4, then (acc0 + acc1) + (acc2 + acc3), then the
  16 lanes as the fixed tree 8+8, 4+4, 2+2, 1+1). The lane trees of the 16 dots are done together, as a
  transpose: level k adds, for every dot at once, the same lane pairs as hsum's level k, so each score
  is bit-equal to the tile's while the reduction costs 15 adds for 16 dots instead of 4 per dot.
  Positions past the run's length read the run's last row (in bounds) and are not stored.
- ``emit_pv``: o += p_j v_j for the run's positions in order, one fma per element and position
  (the axpy of simd_ir.emit_axpy repeated), with o held in registers across the run.
"""
from __future__ import annotations

from llvmlite import ir

from toolcall.runtime.cpu.simd_ir import (
    ACCS,
    I32,
    I64,
    LANES,
    VF32,
    _fma,
    broadcast,
    const,
    load,
    open_loop,
    splat,
    store,
    vec,
)

I1 = ir.IntType(1)

RUN = LANES  # positions per run: one score per lane


def _shuffle(builder, a, b, lanes):
    return builder.shuffle_vector(a, b, ir.Constant(vec(I32, LANES), lanes))


def _dot_lanes(builder, fma, q_blocks, decode, row):
    """The 16 lane partial sums of q . k_row: block b into accumulator b % ACCS from zero, then the pairs."""
    accs = [splat(ir.FloatType(), LANES, 0.0) for _ in range(ACCS)]
    for b, qb in enumerate(q_blocks):
        accs[b % ACCS] = builder.call(fma, [qb, decode(builder, row, b), accs[b % ACCS]])
    while len(accs) > 1:
        accs = [builder.fadd(accs[j], accs[j + 1]) for j in range(0, len(accs), 2)]
    return accs[0]


def _transpose_sum(builder, vs):
    """[16 vectors] -> one vector whose lane i is hsum(vs[i]) (simd_ir.hsum's tree, per dot)."""
    width = LANES // 2  # lanes of each dot still to be halved
    while len(vs) > 1:
        nxt = []
        per = LANES // (2 * width)  # dots held by each input vector
        for a, b in zip(vs[0::2], vs[1::2]):
            lo, hi = [], []
            for src in range(2):
                for d in range(per):
                    base = src * LANES + d * 2 * width
                    lo += list(range(base, base + width))
                    hi += list(range(base + width, base + 2 * width))
            nxt.append(builder.fadd(_shuffle(builder, a, b, lo), _shuffle(builder, a, b, hi)))
        vs, width = nxt, width // 2
    return vs[0]


def _masked_store(builder, value, addr, n) -> None:
    """Lanes i < n of value to float32 at addr + 4 i."""
    name = "llvm.masked.store.v16f32.p0"
    ptr_ty = ir.PointerType(ir.FloatType())
    try:
        fn = builder.module.get_global(name)
    except KeyError:
        fn = ir.Function(builder.module, ir.FunctionType(ir.VoidType(), [VF32, ptr_ty, I32, vec(I1, LANES)]), name)
    lanes = ir.Constant(vec(I64, LANES), list(range(LANES)))
    splat_n = builder.shuffle_vector(builder.insert_element(ir.Constant(vec(I64, LANES), ir.Undefined), n,
                                                            const(I32, 0)),
                                     ir.Constant(vec(I64, LANES), ir.Undefined), ir.Constant(vec(I32, LANES), [0] * LANES))
    mask = builder.icmp_unsigned("<", lanes, splat_n)
    builder.call(fn, [value, builder.inttoptr(addr, ptr_ty), const(I32, 4), mask])


def emit_scores(builder: ir.IRBuilder, nblocks: int, q_addr, k_addr, stride, n, s_addr, decode) -> None:
    """s[i] = q . k_i for i < n (1 <= n <= 16): q float32 [16 nblocks] at q_addr, k_i the row at
    k_addr + i * stride (``decode(builder, row, b)``: its block b as 16 float32), s float32 at s_addr."""
    fma = _fma(builder.module)
    q_blocks = [load(builder, q_addr, const(I64, 4 * LANES * b), VF32) for b in range(nblocks)]
    last = builder.sub(n, const(I64, 1))
    dots = []
    for i in range(RUN):
        pos = builder.select(builder.icmp_unsigned("<", const(I64, i), n), const(I64, i), last)
        row = builder.add(k_addr, builder.mul(pos, stride))
        dots.append(_dot_lanes(builder, fma, q_blocks, decode, row))
    _masked_store(builder, _transpose_sum(builder, dots), s_addr, n)


def emit_pv(builder: ir.IRBuilder, nblocks: int, p_addr, v_addr, stride, n, o_addr, decode) -> None:
    """o[16 b + l] = fma(p_j, v_j[16 b + l], o[16 b + l]) for j = 0 .. n-1 in order: p float32 at p_addr,
    v_j the row at v_addr + j * stride, o float32 [16 nblocks] at o_addr (read once, written once)."""
    fma = _fma(builder.module)
    start = [load(builder, o_addr, const(I64, 4 * LANES * b), VF32) for b in range(nblocks)]
    loop = open_loop(builder, "pv")
    j = loop.counter
    acc = [builder.phi(VF32, f"o{b}") for b in range(nblocks)]
    for a, s in zip(acc, start):
        a.add_incoming(s, loop.entry)
    builder.cbranch(builder.icmp_unsigned("<", j, n), loop.body, loop.after)
    builder.position_at_end(loop.body)
    pv = broadcast(builder, load(builder, p_addr, builder.mul(j, const(I64, 4)), ir.FloatType()))
    row = builder.add(v_addr, builder.mul(j, stride))
    new = [builder.call(fma, [pv, decode(builder, row, b), a]) for b, a in enumerate(acc)]
    for a, v in zip(acc, new):
        a.add_incoming(v, builder.block)
    loop.close(builder, builder.add(j, const(I64, 1)))
    builder.position_at_end(loop.after)
    for b, a in enumerate(acc):
        store(builder, a, o_addr, const(I64, 4 * LANES * b))


def row_blocks(decoder):
    """The emitters' ``decode(builder, row, b)``: block b (an int) of the row at byte address ``row``, by
    ``decoder`` (one of simd_ir's, e.g. ELEMENT_DECODERS[dtype])."""
    return lambda builder, row, b: decoder(row)(builder, const(I64, b), b % 2)
