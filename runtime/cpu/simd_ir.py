"""LLVM IR for the fast CPU backend's dot products, written lane by lane (llvmlite; numba intrinsics in
runtime/cpu/linear_kernels.py call these emitters).

Why explicit vectors: the reduction order of every dot product must not depend on the number of
rows in a step (bit-identical rows in any batch). Leaving it to LLVM's loop vectorizer fixed the
order only per compiled function, vectorized a gather of table-decoded weights badly and could
not share one weight decode between rows. Here the order is written down, the same for any tile:

- a row is cut into 16-element blocks (the last ``n % 16`` elements are the caller's scalar tail);
- block b is added into accumulator ``b % 4`` of 16 float32 lanes: lane l holds
  fma(x[16b + l], w[16b + l], acc) chained over its blocks (NVFP4: x permuted within each chunk to
  the order its decoder gives the weights) (``llvm.fma``: one rounding, no
  contraction choices left to the compiler, the same result on every IEEE machine); four
  accumulators so that a single row is not bound by the FMA latency;
- at the end: (acc0 + acc1) + (acc2 + acc3), then the 16 lanes summed as a fixed tree (8+8, 4+4,
  2+2, 1+1).

A tile of R activation rows against C weight rows decodes each weight block once and feeds R x C
accumulator sets; each (row, weight row) pair's sequence of operations is exactly the one of a
1x1 tile. No fast-math flags are set on any instruction, so LLVM may not reorder them; every
decoder is exact, and where an x86 extension is missing (F16C, SSSE3, AVX-512) a fallback gives
the same values, so the bits are the same on any x86-64 (tests/test_cpu_fast.py checks a baseline
build against the host's).

numba's cache keys on the source file of the jitted function only, not on this file: the kernels'
modules drop their cached entries older than this file at import (linear_kernels._drop_stale_cache).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir

LANES = 16
ACCS = 4  # accumulators per row: block b goes into accumulator b % ACCS (even: see emit_tile's parity)
I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F16, F32 = ir.HalfType(), ir.FloatType()
VF32 = ir.VectorType(F32, LANES)


def vec(ty, n):
    return ir.VectorType(ty, n)


def splat(ty, n, value):
    return ir.Constant(vec(ty, n), [value] * n)


def load(builder: ir.IRBuilder, addr, offset, ty):
    """Unaligned load of ``ty`` at byte address addr + offset (i64 values)."""
    ptr = builder.inttoptr(builder.add(addr, offset), ir.PointerType(ty))
    return builder.load(ptr, align=1, typ=ty)


def store(builder: ir.IRBuilder, value, addr, offset) -> None:
    ptr = builder.inttoptr(builder.add(addr, offset), ir.PointerType(value.type))
    builder.store(value, ptr, align=1)


def hsum(builder: ir.IRBuilder, v):
    """The 16 lanes of v summed as a fixed tree: (l0..7 + l8..15), then halves again, down to one lane."""
    n = LANES
    while n > 1:
        half = n // 2
        lo = builder.shuffle_vector(v, v, ir.Constant(vec(I32, half), list(range(half))))
        hi = builder.shuffle_vector(v, v, ir.Constant(vec(I32, half), list(range(half, n))))
        v, n = builder.fadd(lo, hi), half
    return builder.extract_element(v, ir.Constant(I32, 0))


def const(ty, value):
    return ir.Constant(ty, value)


def broadcast(builder: ir.IRBuilder, value):
    """A float32 value in all 16 lanes."""
    v = builder.insert_element(ir.Constant(VF32, ir.Undefined), value, const(I32, 0))
    return builder.shuffle_vector(v, ir.Constant(VF32, ir.Undefined), ir.Constant(vec(I32, LANES), [0] * LANES))


class Loop(NamedTuple):
    """A counted loop's blocks (``open_loop``): ``counter`` is the i64 phi at the top of ``header``; ``entry``
    the block the loop is entered from (the incoming edge of the callers' other phis)."""

    counter: ir.PhiInstr
    header: ir.Block
    body: ir.Block
    after: ir.Block
    entry: ir.Block

    def close(self, builder: ir.IRBuilder, next_value) -> None:
        """Ends a pass at the current block: the counter's next value, then back to the header."""
        self.counter.add_incoming(next_value, builder.block)
        builder.branch(self.header)


def open_loop(builder: ir.IRBuilder, name: str, start=None) -> Loop:
    """Appends blocks ``<name>.header``, ``.body``, ``.after``, branches from the current block into the header
    and positions there, where the counter starts at ``start`` (i64; default 0). The caller adds its phis,
    branches to body or after, and ends each pass with ``Loop.close``."""
    func = builder.function
    entry = builder.block
    header, body, after = (func.append_basic_block(f"{name}.{part}") for part in ("header", "body", "after"))
    builder.branch(header)
    builder.position_at_end(header)
    counter = builder.phi(I64, name)
    counter.add_incoming(const(I64, 0) if start is None else start, entry)
    return Loop(counter, header, body, after, entry)


def for_blocks(builder: ir.IRBuilder, name: str, nblocks, emit) -> None:
    """``emit(c)`` for c = 0 .. nblocks - 1 (i64), a loop carrying nothing else between passes."""
    loop = open_loop(builder, name)
    builder.cbranch(builder.icmp_unsigned("<", loop.counter, nblocks), loop.body, loop.after)
    builder.position_at_end(loop.body)
    emit(loop.counter)
    loop.close(builder, builder.add(loop.counter, const(I64, 1)))
    builder.position_at_end(loop.after)


def emit_switch(builder: ir.IRBuilder, key, cases, emit) -> None:
    """``emit(case)`` on the path where the i64 ``key`` equals ``code`` for each (code, case) of ``cases``
    (a switch; any other key emits nothing), then positions after it."""
    merge = builder.append_basic_block("switch.merge")
    switch = builder.switch(key, merge)
    for code, case in cases:
        block = builder.append_basic_block("switch.case")
        switch.add_case(const(I64, code), block)
        builder.position_at_end(block)
        emit(case)
        builder.branch(merge)
    builder.position_at_end(merge)


def _fma(module: ir.Module) -> ir.Function:
    name = f"llvm.fma.v{LANES}f32"
    try:
        return module.get_global(name)
    except KeyError:
        return ir.Function(module, ir.FunctionType(VF32, [VF32] * 3), name)


def emit_tile(builder: ir.IRBuilder, rows: int, nblocks, x_addr, x_stride, out_addr, out_stride, decoders,
              ahead=None) -> None:
    """For r < rows, p < len(decoders): *(float*)(out_addr + r * out_stride + 4 p) = the dot product of
    x row r (float32 at x_addr + r * x_stride) with weight row p, in the order of the module docstring.

    ``decoders[p](builder, blk, parity)`` emits the 16 float32 weights of block ``blk`` (i64) of weight
    row p, exactly (parity = blk % 2, known when the code is generated). ``ahead`` (i64 bytes or None):
    prefetch each weight row's bytes that far past those being read (the next tile's rows; speed
    only). A (row, weight row) pair's operations are the same in any tile shape.
    """
    cols = len(decoders)
    fma = _fma(builder.module)
    func = builder.function
    zero = splat(F32, LANES, 0.0)
    x_rows = [builder.add(x_addr, builder.mul(x_stride, const(I64, r))) for r in range(rows)]
    groups = builder.udiv(nblocks, const(I64, ACCS))
    loop = open_loop(builder, "tile")
    i = loop.counter
    pairs = rows * cols
    accs = [[builder.phi(VF32, f"acc{r}_{k}") for k in range(ACCS)] for r in range(pairs)]
    for row in accs:
        for a in row:
            a.add_incoming(zero, loop.entry)
    builder.cbranch(builder.icmp_unsigned("<", i, groups), loop.body, loop.after)

    def step(blk, k, current):
        """Block ``blk`` into accumulator k of every (row, weight row): the new accumulators [rows * cols].
        blk % 2 == k % 2 always (groups start at multiples of ACCS): decoders get it as a constant."""
        ws = [decode(builder, blk, k % 2) for decode in decoders]
        off = builder.mul(blk, const(I64, 4 * LANES))
        xs = [load(builder, x_rows[r], off, VF32) for r in range(rows)]
        return [builder.call(fma, [xs[r], ws[p], current[r * cols + p][k]])
                for r in range(rows) for p in range(cols)]

    builder.position_at_end(loop.body)
    first = builder.mul(i, const(I64, ACCS))
    if ahead is not None:  # software prefetch: the bytes ``ahead`` past those this group reads, per weight row
        for decode in decoders:
            span = ACCS * decode.block_bytes
            start = builder.add(builder.add(decode.row, builder.mul(first, const(I64, decode.block_bytes))), ahead)
            for line in range(0, span, 64):
                _prefetch(builder, builder.add(start, const(I64, line)))
    new = [a[:] for a in accs]
    for k in range(ACCS):
        col = step(builder.add(first, const(I64, k)), k, new)
        for r in range(pairs):
            new[r][k] = col[r]
    for r in range(pairs):
        for k in range(ACCS):
            accs[r][k].add_incoming(new[r][k], builder.block)
    loop.close(builder, builder.add(i, const(I64, 1)))

    # the last nblocks % ACCS blocks go into accumulators 0, 1, ... in order
    builder.position_at_end(loop.after)
    current = [a[:] for a in accs]
    base = builder.mul(groups, const(I64, ACCS))
    for k in range(ACCS - 1):
        have = builder.icmp_unsigned("<", builder.add(base, const(I64, k)), nblocks)
        then = func.append_basic_block(f"tile.rest{k}")
        merge = func.append_basic_block(f"tile.merged{k}")
        before = builder.block
        builder.cbranch(have, then, merge)
        builder.position_at_end(then)
        col = step(builder.add(base, const(I64, k)), k, current)
        then_end = builder.block
        builder.branch(merge)
        builder.position_at_end(merge)
        for r in range(pairs):
            phi = builder.phi(VF32)
            phi.add_incoming(current[r][k], before)
            phi.add_incoming(col[r], then_end)
            current[r][k] = phi
    for r in range(rows):  # (acc0 + acc1) + (acc2 + acc3), then the lanes
        for p in range(cols):
            sums = current[r * cols + p]
            while len(sums) > 1:
                sums = [builder.fadd(sums[j], sums[j + 1]) for j in range(0, len(sums), 2)]
            dst = builder.add(builder.mul(out_stride, const(I64, r)), const(I64, 4 * p))
            store(builder, hsum(builder, sums[0]), out_addr, dst)


def _weights(emit, row, block_bytes):
    """A decoder: ``emit`` plus where its weight row starts (i64 address) and its bytes per block."""
    emit.row, emit.block_bytes = row, block_bytes
    return emit


def _prefetch(builder, addr) -> None:
    name = "llvm.prefetch.p0"
    try:
        fn = builder.module.get_global(name)
    except KeyError:
        fn = ir.Function(builder.module, ir.FunctionType(ir.VoidType(), [ir.PointerType(I8), I32, I32, I32]), name)
    builder.call(fn, [builder.inttoptr(addr, ir.PointerType(I8)), const(I32, 0), const(I32, 3), const(I32, 1)])


# -- weight decoders: block ``blk`` (i64) of a weight row at byte address ``w`` -> 16 float32, exact --

def decode_f32(w):
    def emit(builder, blk, parity):
        return load(builder, w, builder.mul(blk, const(I64, 4 * LANES)), VF32)
    return _weights(emit, w, 64)


def decode_bf16(w):
    """u16 bits [16] -> float32 bits = u16 << 16."""
    def emit(builder, blk, parity):
        bits = load(builder, w, builder.mul(blk, const(I64, 2 * LANES)), vec(I16, LANES))
        wide = builder.shl(builder.zext(bits, vec(I32, LANES)), splat(I32, LANES, 16))
        return builder.bitcast(wide, VF32)
    return _weights(emit, w, 32)


def decode_fp8(w):
    """E4M3 bytes [16] -> float32 of value e4m3 / 256 (the caller multiplies the row scale by 256,
    exactly). With F16C, through float16 bits: E4M3 s.eeee.mmm as float16 s.0eeee.mmm0000000 is
    e4m3 / 2^8 (code exponent 0: float16 subnormals, the same factor); the sign-extended byte << 7
    puts exponent+mantissa at bits 7..13 and the sign at bits 14..15, and clearing bit 14 finishes
    it. Without F16C, the same values by integer arithmetic (``_e4m3_by_bits``). Every result is a
    normal float32 (>= 2^-17): no DAZ hazard. The NaN codes 0x7F/0xFF would read as +-480/256; a
    load refuses them beforehand."""
    def emit(builder, blk, parity):
        b = load(builder, w, builder.mul(blk, const(I64, LANES)), vec(I8, LANES))
        if not _x86_has("f16c"):
            return _e4m3_by_bits(builder, b)
        h = builder.shl(builder.sext(b, vec(I16, LANES)), splat(I16, LANES, 7))
        h = builder.and_(h, splat(I16, LANES, 0xBFFF - (1 << 16)))
        return builder.fpext(builder.bitcast(h, vec(F16, LANES)), VF32)
    return _weights(emit, w, 16)


def _e4m3_by_bits(builder, b):
    """<16 x i8> E4M3 -> e4m3 / 256 as float32: exponent e > 0: bits (code & 0x7F) << 20 plus (127 - 7 - 8)
    << 23; e == 0: float(mantissa) * 2^-17 (exact); the sign bit ORed in."""
    code = builder.zext(b, vec(I32, LANES))
    mag = builder.and_(code, splat(I32, LANES, 0x7F))
    normal = builder.add(builder.shl(mag, splat(I32, LANES, 20)), splat(I32, LANES, 112 << 23))
    sub = builder.fmul(builder.sitofp(builder.and_(mag, splat(I32, LANES, 7)), VF32), splat(F32, LANES, 2.0 ** -17))
    tiny = builder.icmp_unsigned("<", mag, splat(I32, LANES, 8))
    bits = builder.select(tiny, builder.bitcast(sub, vec(I32, LANES)), normal)
    sign = builder.shl(builder.and_(code, splat(I32, LANES, 0x80)), splat(I32, LANES, 24))
    return builder.bitcast(builder.or_(bits, sign), VF32)


def _x86_has(feature: str) -> bool:
    """Whether numba compiles for an x86 target with ``feature`` (the target machine numba uses)."""
    import llvmlite.binding as llvm
    from numba.core import config
    if not llvm.get_process_triple().startswith("x86_64"):
        return False
    features = config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
    return f"+{feature}" in features.split(",")


# 2 * e2m1(code) for codes 0..15 (-0 as 0: its products add nothing either way)
E2M1_TIMES_2 = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]


def _e2m1_times_2(builder, codes):
    """<16 x i8> codes 0..15 -> <16 x i8> 2 * e2m1: one pshufb where SSSE3 is there, else arithmetic
    (the same integers: the bits of every dot product are the same either way)."""
    v16 = vec(I8, LANES)
    if _x86_has("ssse3"):
        name = "llvm.x86.ssse3.pshuf.b.128"
        try:
            pshufb = builder.module.get_global(name)
        except KeyError:
            pshufb = ir.Function(builder.module, ir.FunctionType(v16, [v16, v16]), name)
        return builder.call(pshufb, [ir.Constant(v16, E2M1_TIMES_2), codes])
    m = builder.and_(codes, splat(I8, LANES, 1))
    e = builder.and_(builder.lshr(codes, splat(I8, LANES, 1)), splat(I8, LANES, 3))
    normal = builder.shl(builder.or_(m, splat(I8, LANES, 2)), builder.sub(e, splat(I8, LANES, 1)))
    mag = builder.select(builder.icmp_unsigned("==", e, splat(I8, LANES, 0)), m, normal)
    neg = builder.icmp_unsigned("!=", builder.and_(codes, splat(I8, LANES, 8)), splat(I8, LANES, 0))
    return builder.select(neg, builder.neg(mag), mag)


_CONCAT = ir.Constant(vec(I32, LANES), list(range(LANES)))


def decode_nvfp4(w, blocks, lut):
    """Block ``blk``'s 8 bytes (element 2k in the low nibble of byte k) as 16 float32 e2m1 * block scale
    in the order [low nibbles 0..7, high nibbles 0..7]: the x row must be permuted the same way
    (each 16-block as its 8 even elements, then its 8 odd ones). 2 * e2m1 is a small integer; ``lut``
    (float32 [256], address) holds e4m3(code) / 2, so float32(2 * e2m1) * lut[block byte] is exact."""
    def emit(builder, blk, parity):
        b = load(builder, w, builder.mul(blk, const(I64, LANES // 2)), vec(I8, LANES // 2))
        lo = builder.and_(b, splat(I8, LANES // 2, 15))
        hi = builder.lshr(b, splat(I8, LANES // 2, 4))
        ints = _e2m1_times_2(builder, builder.shuffle_vector(lo, hi, _CONCAT))
        values = builder.sitofp(builder.sext(ints, vec(I32, LANES)), VF32)
        code = builder.zext(load(builder, blocks, blk, I8), I64)
        scale = load(builder, lut, builder.mul(code, const(I64, 4)), F32)
        return builder.fmul(values, broadcast(builder, scale))
    return _weights(emit, w, 8)


UPPER_HALF_16 = ir.Constant(vec(I32, LANES), [0] * (LANES // 2) + [16] * (LANES // 2))


def _permute_two_tables(builder, low_table, idx, high_table):
    """out[l] = (high_table if idx[l] & 16 else low_table)[idx[l] & 15]: one vpermi2ps with AVX-512F,
    else lane by lane (the same values)."""
    if _x86_has("avx512f"):
        name = "llvm.x86.avx512.vpermi2var.ps.512"
        try:
            fn = builder.module.get_global(name)
        except KeyError:
            fn = ir.Function(builder.module, ir.FunctionType(VF32, [VF32, vec(I32, LANES), VF32]), name)
        return builder.call(fn, [low_table, idx, high_table])
    both = builder.shuffle_vector(low_table, high_table, ir.Constant(vec(I32, 2 * LANES), list(range(2 * LANES))))
    out = ir.Constant(VF32, ir.Undefined)
    for lane in range(LANES):
        j = builder.and_(builder.extract_element(idx, const(I32, lane)), const(I32, 31))
        out = builder.insert_element(out, builder.extract_element(both, j), const(I32, lane))
    return out


def decode_nvfp4_pairs(w, blocks, tables):
    """NVFP4 for rows of a multiple of 32 elements, two 16-blocks (16 bytes) at a time: vector-block
    2u holds the low nibbles of bytes 16u..16u+15 (elements 32u + 0, 2, ..., 30), vector-block 2u+1
    the high nibbles (the odd elements): the x row must be permuted the same way (each 32-chunk as
    its 16 even elements, then its 16 odd ones). Lanes 0-7 come from scale block 2u, lanes 8-15 from
    block 2u+1: ``tables`` (float32 [256, 16], address) holds e2m1(j) * e4m3(code) (exact) and one
    two-table permute picks every lane's value."""
    def emit(builder, blk, parity):
        unit = builder.lshr(blk, const(I64, 1))
        raw = builder.zext(load(builder, w, builder.mul(unit, const(I64, LANES)), vec(I8, LANES)), vec(I32, LANES))
        nibble = builder.and_(raw, splat(I32, LANES, 15)) if parity == 0 else builder.lshr(raw, splat(I32, LANES, 4))
        idx = builder.or_(nibble, UPPER_HALF_16)
        first = builder.mul(unit, const(I64, 2))
        tabs = []
        for j in range(2):
            code = builder.zext(load(builder, blocks, builder.add(first, const(I64, j)), I8), I64)
            tabs.append(load(builder, tables, builder.mul(code, const(I64, 4 * LANES)), VF32))
        return _permute_two_tables(builder, tabs[0], idx, tabs[1])
    return _weights(emit, w, 8)


def emit_axpy(builder: ir.IRBuilder, nblocks, p, o_addr, decode) -> None:
    """o[16c + l] = fma(p, w[16c + l], o[16c + l]) for every block c < nblocks (o float32 at o_addr, w the
    decoded weight row, p a float): attention's o += p_j v_j, elementwise, so no order to fix."""
    fma = _fma(builder.module)
    pv = broadcast(builder, p)

    def block(c):
        off = builder.mul(c, const(I64, 4 * LANES))
        o = load(builder, o_addr, off, VF32)
        store(builder, builder.call(fma, [pv, decode(builder, c, 0), o]), o_addr, off)
    for_blocks(builder, "axpy", nblocks, block)


# the decoders of weight rows by the array's element type (a dtype is one element format here): int8 E4M3
# bytes (fp8: values e4m3 / 256), uint16 bf16 bits, float32; NVFP4's codes (uint8) also need their block
# scales and a table (decode_nvfp4, decode_nvfp4_pairs)
ELEMENT_DECODERS = {np.dtype(np.int8): decode_fp8, np.dtype(np.uint16): decode_bf16, np.dtype(np.float32): decode_f32}
