"""LLVM IR for the fast CPU backend's output-panel ("broadcast") linear tile (llvmlite; numba intrinsics
in runtime/cpu/panel_kernels.py call it).

Weights are repacked at load into panels: panel g holds outputs [gP, gP + P) as (in, P), the P
weights of one input feature k contiguous (the stored format: E4M3 bytes, bf16 bits or float32; the
emitters take the panel's numpy dtype and decode by simd_ir.ELEMENT_DECODERS).
A tile is R activation rows x V vectors of 16 outputs (part of a panel, or whole panels side by
side): per k, the tile's weights are decoded once (V vectors of 16 lanes, runtime/cpu/simd_ir.py's
exact decoders), x[t, k] is broadcast per row, and R * V FMAs follow. Output j of row t is therefore a plain chain over k, with no horizontal reduction:

- k is cut into blocks of KB = 64 features (the last block shorter); within block b,
  acc = fma(x[t, k], w[k, j], acc) over its k in increasing order, starting from +0.0
  (``llvm.fma``: one rounding, no fast-math flags, so LLVM may not reorder);
- the block sums are added in order: y = s_0, then y = y + s_b (float32, through memory: the
  output row holds the running sum, so the tile needs no second set of registers). Blocks keep the
  rounding error of a 3072-feature row near that of a 64-term chain;
- fp8: finally y = y * (scale[j] * 256) (the decoder gives e4m3 / 256; x 256 is exact).

Every (row, output) pair runs this same sequence in a tile of any R, whichever tile it lands in,
so a row's bits do not depend on the rows beside it. The decoders have the same fallbacks as
simd_ir's (no F16C: integer arithmetic), so the bits are the same on any x86-64.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from toolcall.runtime.cpu import simd_ir as s

KB = 64  # input features per block (see the docstring)
AHEAD = 4096  # bytes of each panel stream prefetched ahead of the reads (speed only; measured 1-8 KB alike)


def _chain(builder, dtype: np.dtype, rows, vpp, k_from, k_to, x_rows, bases, streams, unroll, ahead):
    """The accumulators [rows][len(bases)] after k in [k_from, k_to) (i64), starting from +0.0, for the
    16-lane output vectors at ``bases`` (a panel holds vpp of them per feature k): a loop of ``unroll``
    features per pass, then one feature per pass for the rest (the same operations per k). ``streams``:
    the addresses of the panels the vectors lie in (prefetched)."""
    fma = s._fma(builder.module)
    decoders = [s.ELEMENT_DECODERS[dtype](w) for w in bases]
    vecs = len(bases)
    zero = s.splat(s.F32, s.LANES, 0.0)

    def one_k(k, accs):
        block = builder.mul(k, s.const(s.I64, vpp))  # the panel's feature k starts vpp vectors on
        ws = [decoders[v](builder, block, 0) for v in range(vecs)]
        xo = builder.mul(k, s.const(s.I64, 4))
        xs = [s.broadcast(builder, s.load(builder, x_rows[r], xo, s.F32)) for r in range(rows)]
        return [[builder.call(fma, [xs[r], ws[v], accs[r][v]]) for v in range(vecs)] for r in range(rows)]

    def loop(start, accs_in, step, limit):
        """Passes of ``step`` features while k + step <= limit; returns (k after, accumulators)."""
        loop = s.open_loop(builder, "panel", start)
        k = loop.counter
        accs = [[builder.phi(s.VF32) for _ in range(vecs)] for _ in range(rows)]
        for r in range(rows):
            for v in range(vecs):
                accs[r][v].add_incoming(accs_in[r][v], loop.entry)
        more = builder.icmp_unsigned("<=", builder.add(k, s.const(s.I64, step)), limit)
        builder.cbranch(more, loop.body, loop.after)
        builder.position_at_end(loop.body)
        if step > 1 and ahead:  # software prefetch of each panel stream ``ahead`` bytes on (speed only)
            span = step * vpp * s.LANES * dtype.itemsize  # bytes of a panel this pass reads
            for w in streams:
                start = builder.add(builder.add(w, builder.mul(k, s.const(s.I64, span // step))), s.const(s.I64, ahead))
                for line in range(0, span, 64):
                    s._prefetch(builder, builder.add(start, s.const(s.I64, line)))
        new = accs
        for u in range(step):
            new = one_k(builder.add(k, s.const(s.I64, u)), new)
        for r in range(rows):
            for v in range(vecs):
                accs[r][v].add_incoming(new[r][v], builder.block)
        loop.close(builder, builder.add(k, s.const(s.I64, step)))
        builder.position_at_end(loop.after)
        return k, accs

    accs = [[zero] * vecs for _ in range(rows)]
    k, accs = loop(k_from, accs, unroll, k_to) if unroll > 1 else (k_from, accs)
    _, accs = loop(k, accs, 1, k_to)
    return accs


def emit_panel_tile(builder: ir.IRBuilder, dtype: np.dtype, rows: int, panel: int, n, x_addr, x_stride, w_addr,
                    out_addr, out_stride, scale_addr=None, vectors: int | None = None, unroll: int = 2,
                    ahead: int = AHEAD) -> None:
    """For r < rows, j < 16 * vectors: *(float*)(out_addr + r * out_stride + 4 j) = output j of activation
    row r (float32 at x_addr + r * x_stride, n features) against the weights of ``vectors`` consecutive
    16-output vectors starting at w_addr (panels of (n, panel) elements of ``dtype``; default one whole panel): either
    part of one panel (w_addr inside it) or whole consecutive panels; in the order of the module docstring.
    ``scale_addr``: fp8's float32 [16 * vectors] of scale * 256. The tile's shape is speed only (which
    accumulators fit the vector registers); every output's operations are the same in any tile."""
    vpp = panel // s.LANES
    vecs = vpp if vectors is None else vectors
    assert panel % s.LANES == 0 and vpp >= 1 and (vecs <= vpp or vecs % vpp == 0)
    func = builder.function
    x_rows = [builder.add(x_addr, builder.mul(x_stride, s.const(s.I64, r))) for r in range(rows)]
    dst = [[builder.add(out_addr, builder.add(builder.mul(out_stride, s.const(s.I64, r)),
                                              s.const(s.I64, 64 * v))) for v in range(vecs)] for r in range(rows)]
    blocks = s.open_loop(builder, "blocks")
    k0 = blocks.counter
    first, combine, latch = (func.append_basic_block(f"blocks.{n}") for n in ("first", "combine", "latch"))
    builder.cbranch(builder.icmp_unsigned("<", k0, n), blocks.body, blocks.after)

    builder.position_at_end(blocks.body)
    end = builder.add(k0, s.const(s.I64, KB))
    k1 = builder.select(builder.icmp_unsigned("<", end, n), end, n)
    pb = builder.mul(n, s.const(s.I64, panel * dtype.itemsize))  # bytes of one panel
    vb = s.LANES * dtype.itemsize  # bytes of one vector's weights at one k
    streams = [builder.add(w_addr, builder.mul(pb, s.const(s.I64, i))) for i in range(-(-vecs // vpp))]
    bases = [builder.add(streams[v // vpp], s.const(s.I64, vb * (v % vpp))) for v in range(vecs)]
    accs = _chain(builder, dtype, rows, vpp, k0, k1, x_rows, bases, streams, unroll, ahead)
    builder.cbranch(builder.icmp_unsigned("==", k0, s.const(s.I64, 0)), first, combine)

    builder.position_at_end(first)  # y = s_0
    for r in range(rows):
        for v in range(vecs):
            s.store(builder, accs[r][v], dst[r][v], s.const(s.I64, 0))
    builder.branch(latch)
    builder.position_at_end(combine)  # y = y + s_b
    for r in range(rows):
        for v in range(vecs):
            y = s.load(builder, dst[r][v], s.const(s.I64, 0), s.VF32)
            s.store(builder, builder.fadd(y, accs[r][v]), dst[r][v], s.const(s.I64, 0))
    builder.branch(latch)
    builder.position_at_end(latch)
    blocks.close(builder, k1)

    builder.position_at_end(blocks.after)
    if scale_addr is not None:
        for v in range(vecs):
            sv = s.load(builder, scale_addr, s.const(s.I64, 64 * v), s.VF32)
            for r in range(rows):
                y = s.load(builder, dst[r][v], s.const(s.I64, 0), s.VF32)
                s.store(builder, builder.fmul(y, sv), dst[r][v], s.const(s.I64, 0))


def emit_decode(builder: ir.IRBuilder, dtype: np.dtype, nblocks, w_addr, dst_addr) -> None:
    """float32 at dst_addr [16 * nblocks] = the ``dtype`` elements at w_addr decoded, exactly as the tile's
    decoder gives them (fp8: e4m3 / 256), so a float32 tile over the copy (the same scale) has the same bits."""
    decode = s.ELEMENT_DECODERS[dtype](w_addr)
    s.for_blocks(builder, "decode", nblocks, lambda b: s.store(builder, decode(builder, b, 0), dst_addr,
                                                             builder.mul(b, s.const(s.I64, 4 * s.LANES))))
