"""Control flow and warp- / block-level opcodes: bra, ret / exit, bar.sync, bar.red.popc, bar.warp.sync,
shfl.sync (bfly, idx, up, down), vote.sync.ballot, and mma.sync (ops_mma.py).

The machine moves program counters for ``bra`` / ``ret`` and synchronises ``bar``; these closures compute
the values. A warp-synchronous instruction's closure carries ``member_mask`` (fn(S, ix) -> the lanes it names):
the machine runs it only once every named lane has arrived (lanes that came first wait, as on the card), and a
named lane that can never arrive is a sync fault.
"""
from __future__ import annotations

import numpy as np

from toolcall.kernels.sim.errors import SimUnsupported
from toolcall.kernels.sim.machine import warp_bits
from toolcall.kernels.sim.ops import CONTROL
from toolcall.kernels.sim.ops_mma import build_mma

U32 = np.dtype(np.uint32)


def build_bra(ins, P):
    if ins.op not in ("bra", "bra.uni") or ins.operands[0][1] not in P.fn.labels:
        raise SimUnsupported(f"{ins.op} {ins.operands}: unknown form or label")
    return "bra", None


def build_ret(ins, P):
    return "ret", None


def build_bar(ins, P):
    if ins.op in ("bar.sync", "barrier.sync", "bar.cta.sync", "barrier.sync.aligned"):
        if len(ins.operands) != 1 or ins.operands[0] != ("imm", "0"):
            raise SimUnsupported(f"{ins.op} {ins.operands}: only barrier 0 of the whole block is supported")
        return "bar", None
    if ins.op == "bar.red.popc.u32":
        if ins.operands[1] != ("imm", "0"):
            raise SimUnsupported(f"{ins.op}: only barrier 0")
        put, pred = P.writer(ins.operands[0], U32), P.reader(ins.operands[2], np.dtype(bool))

        def popc(S, ix):
            lanes = S.lane_ids(ix)
            counts = np.bincount(S.block[lanes], weights=pred(S, ix), minlength=S.n_blocks).astype(U32)
            put(S, ix, counts[S.block[lanes]])
        return "bar", popc
    if ins.op == "bar.warp.sync":
        mask = P.reader(ins.operands[0], U32)
        def warp_barrier(S, ix):
            S.warp_sync(ix, mask(S, ix), "bar.warp.sync")
        warp_barrier.member_mask = mask
        return "op", warp_barrier
    raise SimUnsupported(f"{ins.op} is not in the executor's instruction table")


def _uniform(value) -> bool:
    """A constant, or the same value in every lane (a lane or clamp operand NVRTC keeps in a register)."""
    return np.ndim(value) == 0 or (value == value[0]).all()


def build_shfl(ins, P):
    parts = ins.op.split(".")
    if parts[:2] != ["shfl", "sync"] or parts[-1] != "b32" or parts[2] not in ("bfly", "idx", "up", "down"):
        raise SimUnsupported(f"{ins.op} is not in the executor's instruction table")
    mode = parts[2]
    dst = ins.operands[0]
    d, p = (dst[1][0], dst[1][1]) if dst[0] == "vec" else (dst, ("sink",))
    put, put_p = P.writer(d, U32), P.writer(p, np.dtype(bool))
    a, b, c, mask = (P.reader(op, U32) for op in ins.operands[1:5])
    whole_tables = {}  # whole warps, one lane and clamp for all: (len(lanes), b, c) -> (source position, ok)

    def partners(lane, bval, cval):
        """(source lane id in the warp, in range) per lane, from the lane operand b and the clamp operand c."""
        bval = np.asarray(bval).astype(np.int64) & 31
        cval = np.asarray(cval).astype(np.int64)
        segmask, clamp = (cval >> 8) & 31, cval & 31
        max_lane = (lane & segmask) | (clamp & ~segmask)
        min_lane = lane & segmask
        j = {"bfly": lambda: lane ^ bval, "idx": lambda: min_lane | (bval & ~segmask),
             "up": lambda: lane - bval, "down": lambda: lane + bval}[mode]()
        ok = (j >= max_lane) if mode == "up" else (j <= max_lane)
        return np.where(ok, j, lane), ok

    def shfl(S, ix):
        lanes = S.lane_ids(ix)
        m = mask(S, ix)
        whole = S.whole_warps(lanes, m)
        bval, cval = b(S, ix), c(S, ix)
        if whole and _uniform(bval) and _uniform(cval):  # the k-th lane is lane k % 32 of its warp: one table
            key = (len(lanes), int(np.ravel(bval)[0]), int(np.ravel(cval)[0]))
            if key not in whole_tables:
                lane = np.arange(len(lanes)) % 32
                j, ok = partners(lane, key[1], key[2])
                whole_tables[key] = (np.arange(len(lanes)) - lane + j, ok)
            source, ok = whole_tables[key]
            put(S, ix, np.broadcast_to(a(S, ix), lanes.shape)[source])
            put_p(S, ix, ok)
            return
        if not whole:
            m = np.broadcast_to(m, lanes.shape)
            S.warp_sync(ix, m, ins.op)
        lane = S.laneid[lanes].astype(np.int64)
        j, ok = partners(lane, bval, cval)
        if whole:  # whole warps, ascending: the source lane is that far from this one in `lanes` too
            values = np.broadcast_to(a(S, ix), lanes.shape)
            source = np.arange(len(lanes)) - lane + j
        else:
            source = lanes - lane + j  # the source lane's index in the batch (same warp)
            S.check_shfl_sources(ix, source, m, ins.op)
            values = np.zeros(S.n, U32)
            values[lanes] = np.broadcast_to(a(S, ix), lanes.shape)
        put(S, ix, values[source])
        put_p(S, ix, ok)
    shfl.member_mask = mask
    return "op", shfl


def build_vote(ins, P):
    if ins.op in ("vote.sync.any.pred", "vote.sync.all.pred", "vote.sync.uni.pred"):
        return "op", _vote_pred(ins, P, ins.op.split(".")[2])
    if ins.op != "vote.sync.ballot.b32":
        raise SimUnsupported(f"{ins.op} is not in the executor's instruction table")
    put = P.writer(ins.operands[0], U32)
    pred, mask = P.reader(ins.operands[1], np.dtype(bool)), P.reader(ins.operands[2], U32)

    def ballot(S, ix):
        lanes = S.lane_ids(ix)
        S.warp_sync(ix, np.broadcast_to(mask(S, ix), lanes.shape), ins.op)
        bits = np.where(pred(S, ix), np.uint64(1) << S.laneid[lanes].astype(np.uint64), np.uint64(0))
        per_warp = warp_bits(S.warp[lanes], bits, S.n_warps)
        put(S, ix, per_warp[S.warp[lanes]].astype(U32))
    ballot.member_mask = mask
    return "op", ballot


def _vote_pred(ins, P, mode):
    """vote.sync.{any,all,uni}.pred d, p, membermask: over the lanes of the warp that execute it."""
    put = P.writer(ins.operands[0], np.dtype(bool))
    pred, mask = P.reader(ins.operands[1], np.dtype(bool)), P.reader(ins.operands[2], U32)

    def vote(S, ix):
        lanes = S.lane_ids(ix)
        S.warp_sync(ix, np.broadcast_to(mask(S, ix), lanes.shape), ins.op)
        p = np.broadcast_to(pred(S, ix), lanes.shape)
        trues = np.bincount(S.warp[lanes], weights=p, minlength=S.n_warps)
        members = np.bincount(S.warp[lanes], minlength=S.n_warps)
        w = S.warp[lanes]
        result = {"any": trues[w] > 0, "all": trues[w] == members[w],
                  "uni": (trues[w] == 0) | (trues[w] == members[w])}[mode]
        put(S, ix, result)
    vote.member_mask = mask
    return vote


def _mma(ins, P):
    mma = build_mma(ins, P)
    mma.member_mask = lambda S, ix: np.uint32(0xFFFFFFFF)  # .aligned: the whole warp, converged
    return "op", mma


CONTROL.update({"bra": build_bra, "ret": build_ret, "exit": build_ret, "bar": build_bar, "barrier": build_bar,
                "shfl": build_shfl, "vote": build_vote, "mma": _mma})
