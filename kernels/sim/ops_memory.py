"""Memory opcodes: ld / st (global, shared, local, param; plain, .nc, .cg, .v2 / .v4), atom.global
(add.u32, or.b32), prefetch, membar / fence, and the call slots of ``call.uni``.

The batch (machine.Batch) owns the address spaces and their sanitizer checks; these closures only decode
operands. ``ld.param`` of a kernel parameter reads the launch's parameter block (the same value on every
lane); ``st.param`` to a call slot keeps one value per lane until the ``call.uni`` that reads it.
"""
from __future__ import annotations

import numpy as np

from toolcall.kernels.sim.errors import SimUnsupported
from toolcall.kernels.sim.numerics import TYPES
from toolcall.kernels.sim.ops import CONTROL

_CACHE_HINTS = {"nc", "cg", "ca", "cs", "lu", "cv", "wb", "wt", "weak", "volatile"}
_SPACES = ("global", "shared", "local", "param")


def _decode(op: str):
    base, *parts = op.split(".")
    ty = TYPES.get(parts[-1]) if parts else None
    spaces = [p for p in parts[:-1] if p in _SPACES]
    vec = [int(p[1:]) for p in parts[:-1] if p in ("v2", "v4")]
    rest = [p for p in parts[:-1] if p not in _SPACES and p not in ("v2", "v4") and p not in _CACHE_HINTS]
    if ty is None or len(spaces) != 1 or rest:
        raise SimUnsupported(f"{op} is not in the executor's instruction table")
    return base, spaces[0], (vec[0] if vec else 1), ty


def build_ld(ins, P):
    _, space, count, ty = _decode(ins.op)
    dst, src = ins.operands
    targets = dst[1] if dst[0] == "vec" else (dst,)
    if len(targets) != count:
        raise SimUnsupported(f"{ins.op}: {len(targets)} destinations for a .v{count} load")
    puts = [P.writer(t, ty) for t in targets]
    if space == "param":
        name, offset = src[1], src[2]
        if name not in P.param_offsets:
            raise SimUnsupported(f"ld.param from {name!r}, not a parameter of {P.name}")
        at = P.param_offsets[name] + offset

        def ld_param(S, ix):
            puts[0](S, ix, S.param_block[at:at + ty.itemsize].view(ty)[0])
        return "op", ld_param
    address = P.address(src)

    def ld(S, ix):
        values = S.load(space, address(S, ix), ty, count, ix)  # [n, count]
        for j, put in enumerate(puts):
            put(S, ix, values[:, j])
    return "op", ld


def build_st(ins, P):
    _, space, count, ty = _decode(ins.op)
    dst, src = ins.operands
    sources = src[1] if src[0] == "vec" else (src,)
    gets = [P.reader(s, ty) for s in sources]
    if space == "param":
        name = dst[1]
        if name not in P.call_params or dst[2] != 0:
            raise SimUnsupported(f"st.param to {dst}, not a call slot")

        def st_param(S, ix):
            S.call_args.setdefault(name, np.zeros(S.n, ty))[ix] = gets[0](S, ix)
        return "op", st_param
    address = P.address(dst)

    def st(S, ix):
        addr = address(S, ix)
        n = len(S.lane_ids(ix))
        values = np.stack([np.broadcast_to(np.asarray(g(S, ix), ty), (n,)) for g in gets], axis=1)
        S.store(space, addr, values, ix)
    return "op", st


def build_atom(ins, P):
    parts = ins.op.split(".")
    known = [p for p in parts[1:-2] if p not in ("relaxed", "gpu", "global")]
    op, ty = parts[-2], TYPES.get(parts[-1])
    if known or "global" not in parts or (op, parts[-1]) not in (("add", "u32"), ("or", "b32"), ("add", "s32")):
        raise SimUnsupported(f"{ins.op} is not in the executor's instruction table")
    put = P.writer(ins.operands[0], ty)
    address, value = P.address(ins.operands[1]), P.reader(ins.operands[2], ty)

    def atom(S, ix):
        put(S, ix, S.atomic(op, address(S, ix), value(S, ix), ty, ix))
    return "op", atom


def build_call(ins, P):
    callee = ins.operands[0][1]
    if callee != "cudaGraphSetConditional" or len(ins.operands) != 3:
        raise SimUnsupported(f"call of {callee!r}: only cudaGraphSetConditional(handle, value) is known")
    handle_slot, value_slot = ins.operands[1][1], ins.operands[2][1]

    def call(S, ix):
        lanes = S.lane_ids(ix)
        S.set_conditional(S.call_args[handle_slot].view(np.uint64)[lanes],
                          S.call_args[value_slot].view(np.uint32)[lanes])
    return "op", call


def _no_op(ins, P):
    return "op", None


CONTROL.update({"ld": build_ld, "st": build_st, "atom": build_atom, "call.uni": build_call, "call": build_call,
                "prefetch.global.L2": _no_op, "membar.gl": _no_op, "membar.cta": _no_op, "fence.acq_rel.gpu": _no_op,
                "fence.sc.gpu": _no_op, "griddepcontrol.wait": _no_op, "griddepcontrol.launch_dependents": _no_op})
