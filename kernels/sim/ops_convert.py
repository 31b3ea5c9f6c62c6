"""Conversion opcodes: cvt (float <-> float with rounding, saturation and the integer-rounding modes; float <->
integer; integer widening / narrowing; e4m3x2 / e2m1x2 -> f16x2) and cvta (generic <-> global / shared / local).
Bit semantics in numerics.py; registered into ops.BUILDERS."""
from __future__ import annotations

import numpy as np

from toolcall.kernels.sim import numerics as nm
from toolcall.kernels.sim.errors import SimUnsupported
from toolcall.kernels.sim.numerics import F32, TYPES
from toolcall.kernels.sim.ops import BUILDERS, I64, U32, U64, _unary
from toolcall.kernels.sim.program import LOCAL_GENERIC_BASE, SHARED_GENERIC_BASE


def build_cvt(ins, P):
    parts = ins.op.split(".")[1:]
    rounding = [p for p in parts if p in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi")]
    sat = "sat" in parts or "satfinite" in parts
    types = [p for p in parts if p not in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi", "sat", "satfinite",
                                           "relu", "ftz")]
    if len(types) != 2 or "ftz" in parts:
        raise SimUnsupported(f"{ins.op} is not in the executor's instruction table")
    dt, st = types
    mode = rounding[0] if rounding else None
    if (dt, st) == ("f16x2", "e4m3x2") and mode == "rn" and not sat:
        return _unary(ins, P, TYPES["b16"], nm.e4m3_pair_to_f16x2, out_ty=U32)
    if (dt, st) == ("f16x2", "e2m1x2") and mode == "rn" and not sat:
        return _unary(ins, P, TYPES["b8"], nm.e2m1_pair_to_f16x2, out_ty=U32)
    if dt not in TYPES or st not in TYPES:
        raise SimUnsupported(f"{ins.op} is not in the executor's instruction table")
    d, s = TYPES[dt], TYPES[st]
    if dt == "f32" and st == "f32":
        if sat and mode is None:
            return _unary(ins, P, F32, lambda a: np.where(np.isnan(a), np.float32(0), np.clip(a, 0, 1)).astype(F32))
        if mode in ("rni", "rzi", "rmi", "rpi") and not sat:
            f = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[mode]
            return _unary(ins, P, F32, lambda a: nm.canonical_f32(f(a)))
    if st == "bf16" and dt == "f32" and mode is None:
        return _unary(ins, P, s, nm.bf16_bits_to_f32, out_ty=F32)
    if st == "f16" and dt == "f32" and mode is None:
        return _unary(ins, P, s, nm.f16_bits_to_f32, out_ty=F32)
    if dt == "bf16" and st == "f32" and mode == "rn" and not sat:
        return _unary(ins, P, F32, nm.to_bf16_bits, out_ty=d)
    if dt == "f16" and st == "f32" and mode == "rn" and not sat:
        return _unary(ins, P, F32, nm.to_f16_bits, out_ty=d)
    if d.kind == "f" and s.kind in "iu" and mode == "rn" and not sat:
        return _unary(ins, P, s, lambda a: np.asarray(a).astype(d), out_ty=d)
    if (dt, st) == ("f32", "f64") and mode == "rn" and not sat:
        return _unary(ins, P, s, lambda a: nm.canonical_f32(np.asarray(a).astype(F32)), out_ty=F32)
    if d.kind in "iu" and st == "f32" and mode in ("rni", "rzi", "rmi", "rpi"):
        return _unary(ins, P, F32, lambda a: nm.float_to_int(a, d, mode), out_ty=d)
    if d.kind in "iu" and s.kind in "iu" and mode is None and not sat:
        return _unary(ins, P, s, lambda a: np.asarray(a).astype(I64 if s.kind == "i" else U64).astype(d), out_ty=d)
    raise SimUnsupported(f"{ins.op} is not in the executor's instruction table")


def build_cvta(ins, P):
    parts = ins.op.split(".")
    offsets = {("to", "global"): 0, ("global",): 0, ("shared",): SHARED_GENERIC_BASE,
               ("to", "shared"): -SHARED_GENERIC_BASE, ("local",): LOCAL_GENERIC_BASE,
               ("to", "local"): -LOCAL_GENERIC_BASE}
    key = tuple(parts[1:-1])
    if key not in offsets or parts[-1] not in ("u64", "u32"):
        raise SimUnsupported(f"{ins.op} is not in the executor's instruction table")
    delta = np.uint64(offsets[key] & 0xFFFFFFFFFFFFFFFF)
    return _unary(ins, P, U64, lambda a: a + delta)


BUILDERS.update({"cvt": build_cvt, "cvta": build_cvta})
