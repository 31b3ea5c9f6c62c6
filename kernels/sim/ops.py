"""The instruction table: each PTX opcode the kernels use, compiled into a closure ``fn(S, ix)``.

``compile_instruction(ins, program)`` returns (kind, fn); ``kind`` tells the machine how the step moves the
lanes' program counters (``op``: to the next instruction; ``bra``, ``ret``, ``bar``: see machine.py). An
opcode or modifier not in the table is a ``SimUnsupported`` naming it (never skipped). Integer arithmetic
wraps in the type's width; float semantics are in numerics.py. Memory and warp-level opcodes live in
ops_memory.py and ops_warp.py, conversions in ops_convert.py.
"""
from __future__ import annotations

import numpy as np

from toolcall.kernels.sim import numerics as nm
from toolcall.kernels.sim.errors import SimUnsupported
from toolcall.kernels.sim.numerics import F32, F64, SIGNED, TYPES, UNSIGNED

U32, U64, I64 = np.dtype(np.uint32), np.dtype(np.uint64), np.dtype(np.int64)
BOOL = np.dtype(bool)


def _parts(op: str, allowed: set[str]) -> tuple[str, list[str], np.dtype]:
    """(base, modifiers, type): the last suffix is the type; every other suffix must be in ``allowed``."""
    base, *mods = op.split(".")
    ty = mods.pop() if mods else ""
    if ty not in TYPES:
        raise SimUnsupported(f"{op}: no operand type")
    unknown = [m for m in mods if m not in allowed]
    if unknown:
        raise SimUnsupported(f"{op}: modifier(s) {', '.join(unknown)} not supported")
    return base, mods, TYPES[ty]


def _unary(ins, P, ty, f, out_ty=None):
    get, put = P.reader(ins.operands[1], ty), P.writer(ins.operands[0], out_ty or ty)
    return lambda S, ix: put(S, ix, f(get(S, ix)))


def _binary(ins, P, ty, f, out_ty=None, b_ty=None):
    a, b = P.reader(ins.operands[1], ty), P.reader(ins.operands[2], b_ty or ty)
    put = P.writer(ins.operands[0], out_ty or ty)
    return lambda S, ix: put(S, ix, f(a(S, ix), b(S, ix)))


def _ternary(ins, P, ty, f, out_ty=None, c_ty=None, b_ty=None):
    a, b = P.reader(ins.operands[1], ty), P.reader(ins.operands[2], b_ty or ty)
    c, put = P.reader(ins.operands[3], c_ty or ty), P.writer(ins.operands[0], out_ty or ty)
    return lambda S, ix: put(S, ix, f(a(S, ix), b(S, ix), c(S, ix)))


def _float_rounding(mods, op):
    if any(m in ("rz", "rm", "rp", "ftz", "sat") for m in mods):
        raise SimUnsupported(f"{op}: only round-to-nearest without ftz/sat is supported here")


def _shift_left(a, n, bits):
    n = np.asarray(n).astype(np.uint64)
    return np.where(n >= bits, 0, a << np.minimum(n, bits - 1).astype(a.dtype)).astype(a.dtype)


def _shift_right(a, n, bits):
    n = np.minimum(np.asarray(n).astype(np.uint64), bits - 1 if a.dtype.kind == "i" else bits)
    out = a >> np.minimum(n, bits - 1).astype(a.dtype)
    return out if a.dtype.kind == "i" else np.where(n >= bits, 0, out).astype(a.dtype)


def _div(a, b, ty):
    a64, b64 = np.asarray(a).astype(I64), np.asarray(b).astype(I64)
    safe = np.where(b64 == 0, 1, b64)
    q = np.abs(a64) // np.abs(safe) * np.sign(a64) * np.sign(safe)  # C: toward zero
    return np.where(b64 == 0, -1, q).astype(ty), np.where(b64 == 0, a64, a64 - q * safe).astype(ty)


def _bfi(a, b, pos, length, ty):
    bits = 8 * ty.itemsize
    a, b = np.asarray(a).astype(U64), np.asarray(b).astype(U64)
    pos, length = np.asarray(pos).astype(U64) & 0xFF, np.asarray(length).astype(U64) & 0xFF
    length = np.minimum(length, np.where(pos >= bits, 0, bits - np.minimum(pos, bits)))
    ones = np.where(length >= 64, np.uint64(~0 & 0xFFFFFFFFFFFFFFFF),
                    (np.uint64(1) << np.minimum(length, 63)) - np.uint64(1))
    mask = (ones << np.minimum(pos, 63)) & np.uint64((1 << bits) - 1 if bits < 64 else 0xFFFFFFFFFFFFFFFF)
    mask = np.where(length == 0, np.uint64(0), mask)
    return ((b & ~mask) | ((a << np.minimum(pos, 63)) & mask)).astype(ty)


_BREV8 = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], np.uint32)


def _brev32(a):
    a = np.asarray(a, U32)
    return (_BREV8[a & 0xFF] << 24) | (_BREV8[(a >> 8) & 0xFF] << 16) | (_BREV8[(a >> 16) & 0xFF] << 8) | \
        _BREV8[a >> 24]


def _msb(a):
    """Index of the most significant set bit of uint32 values (-1 for 0)."""
    a = np.asarray(a, U32).astype(F64)
    return np.where(a == 0, -1, np.frexp(a)[1] - 1)


_INT = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "min": np.minimum, "max": np.maximum,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
}
_F32_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
        "ge": np.greater_equal, "lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}


def build_arith(ins, P):
    base, mods, ty = _parts(ins.op, {"rn", "rm", "lo", "hi", "wide", "approx", "ftz", "shiftamt", "l", "wrap", "full"})
    op = ins.op
    if ty.kind == "f" or ins.op.endswith(("f16x2",)):
        return _float_op(ins, P, base, mods, ty)
    if base in _INT and not mods:
        if ty == BOOL:
            f = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[base]
            return _binary(ins, P, ty, f)
        return _binary(ins, P, ty, _INT[base])
    if base == "not":
        return _unary(ins, P, ty, np.logical_not if ty == BOOL else np.invert)
    if base == "neg":
        return _unary(ins, P, ty, np.negative)
    if base == "abs":
        return _unary(ins, P, ty, np.abs)
    if base in ("mul", "mad") and mods == ["lo"]:
        if base == "mul":
            return _binary(ins, P, ty, lambda a, b: a * b)
        return _ternary(ins, P, ty, lambda a, b, c: a * b + c)
    if base in ("mul", "mad") and mods == ["wide"]:
        wide = (SIGNED if ty.kind == "i" else UNSIGNED)[2 * ty.itemsize]
        if base == "mul":
            return _binary(ins, P, ty, lambda a, b: a.astype(wide) * np.asarray(b).astype(wide), out_ty=wide)
        return _ternary(ins, P, ty, lambda a, b, c: a.astype(wide) * np.asarray(b).astype(wide) + c,
                        out_ty=wide, c_ty=wide)
    if base == "mul" and mods == ["hi"]:
        wide = (SIGNED if ty.kind == "i" else UNSIGNED)[2 * ty.itemsize]
        shift = 8 * ty.itemsize
        return _binary(ins, P, ty, lambda a, b: ((np.asarray(a).astype(wide) * np.asarray(b).astype(wide))
                                                 >> shift).astype(ty))
    if base in ("div", "rem") and not mods:
        which = 0 if base == "div" else 1
        if ty.kind == "u":
            return _binary(ins, P, ty, lambda a, b: (np.where(b == 0, ~np.zeros_like(a), a // np.where(b == 0, 1, b))
                                                     if which == 0 else np.where(b == 0, a, a % np.where(b == 0, 1, b))))
        return _binary(ins, P, ty, lambda a, b: _div(a, b, ty)[which])
    if base == "shl" and not mods:
        return _binary(ins, P, UNSIGNED[ty.itemsize], lambda a, n: _shift_left(a, n, 8 * ty.itemsize), b_ty=U32)
    if base == "shr" and not mods:
        return _binary(ins, P, ty, lambda a, n: _shift_right(a, n, 8 * ty.itemsize), b_ty=U32)
    if base == "popc" and not mods:
        return _unary(ins, P, ty, lambda a: np.bitwise_count(a).astype(U32), out_ty=U32)
    if base == "brev" and not mods and ty.itemsize == 4:
        return _unary(ins, P, U32, _brev32)
    if base == "bfind" and ty == U32:
        if mods == ["shiftamt"]:
            return _unary(ins, P, ty, lambda a: np.where(a == 0, 0xFFFFFFFF, 31 - _msb(a)).astype(U32))
        if not mods:
            return _unary(ins, P, ty, lambda a: _msb(a).astype(np.int64).astype(U32))
    if base == "bfi" and not mods:
        a, b = P.reader(ins.operands[1], ty), P.reader(ins.operands[2], ty)
        c, e = P.reader(ins.operands[3], U32), P.reader(ins.operands[4], U32)
        put = P.writer(ins.operands[0], ty)
        return lambda S, ix: put(S, ix, _bfi(a(S, ix), b(S, ix), c(S, ix), e(S, ix), ty))
    if base == "shf" and mods == ["l", "wrap"] and ty.itemsize == 4:
        def funnel(a, b, c):
            n = np.asarray(c).astype(U64) & 31
            v = (np.asarray(b).astype(U64) << 32) | np.asarray(a).astype(U64)
            return ((v << n) >> 32).astype(U32)
        return _ternary(ins, P, U32, funnel)
    raise SimUnsupported(f"{op} is not in the executor's instruction table")


def _float_op(ins, P, base, mods, ty):
    op = ins.op
    if ins.op.endswith("f16x2"):
        if base == "mul" and mods in ([], ["rn"]):
            def mul_f16x2(a, b):
                lo = nm.to_f16_bits(nm.f16_bits_to_f32(a & 0xFFFF) * nm.f16_bits_to_f32(b & 0xFFFF))
                hi = nm.to_f16_bits(nm.f16_bits_to_f32(a >> 16) * nm.f16_bits_to_f32(b >> 16))
                return (hi.astype(U32) << 16) | lo
            return _binary(ins, P, U32, mul_f16x2)
        raise SimUnsupported(f"{op} is not in the executor's instruction table")
    if ty == F32:
        if base in _F32_BINARY and mods in ([], ["rn"]):
            f = _F32_BINARY[base]
            return _binary(ins, P, ty, lambda a, b: nm.canonical_f32(np.asarray(f(a, b), F32)))
        if base == "fma" and mods in (["rn"], ["rm"]):
            mode = mods[0]
            return _ternary(ins, P, ty, lambda a, b, c: nm.fma_f32(a, b, c, mode))
        if base == "sqrt" and mods == ["rn"]:
            return _unary(ins, P, ty, lambda a: nm.canonical_f32(np.sqrt(a)))
        if base == "ex2" and mods == ["approx", "ftz"]:
            return _unary(ins, P, ty, nm.ex2_approx_ftz)
        if base in ("max", "min") and not mods:
            return _binary(ins, P, ty, lambda a, b: nm.max_f32(a, b, base == "max"))
        if base == "abs" and not mods:
            return _unary(ins, P, U32, lambda a: a & np.uint32(0x7FFFFFFF))
        if base == "neg" and not mods:
            return _unary(ins, P, U32, lambda a: a ^ np.uint32(0x80000000))
    if ty == F64 and base in ("add", "sub", "mul") and mods in ([], ["rn"]):
        f = _F32_BINARY[base]
        return _binary(ins, P, ty, lambda a, b: np.asarray(f(a, b), F64))
    raise SimUnsupported(f"{op} is not in the executor's instruction table")


def build_setp(ins, P):
    base, mods, ty = _parts(ins.op, set(_CMP) | {"equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"})
    if len(mods) != 1 or len(ins.operands) != 3:
        raise SimUnsupported(f"{ins.op} with {len(ins.operands)} operands")
    cmp = mods[0]
    if ty.kind == "f":
        if cmp in ("num", "nan"):
            f = (lambda a, b: ~(np.isnan(a) | np.isnan(b))) if cmp == "num" else \
                (lambda a, b: np.isnan(a) | np.isnan(b))
        elif cmp.endswith("u"):
            ordered = _CMP[cmp[:-1]]
            f = lambda a, b: ordered(a, b) | np.isnan(a) | np.isnan(b)  # noqa: E731
        else:
            ordered = _CMP[cmp]
            f = (lambda a, b: ordered(a, b) & ~np.isnan(a) & ~np.isnan(b)) if cmp == "ne" else ordered
    elif cmp in _CMP:
        f = _CMP[cmp]
    else:
        raise SimUnsupported(f"{ins.op}: comparison {cmp} on integers")
    return _binary(ins, P, ty, lambda a, b: np.asarray(f(a, b), bool), out_ty=BOOL)


def build_selp(ins, P):
    _, _, ty = _parts(ins.op, set())
    a, b, c = (P.reader(ins.operands[i], ty if i < 3 else BOOL) for i in (1, 2, 3))
    put = P.writer(ins.operands[0], ty)
    return lambda S, ix: put(S, ix, np.where(c(S, ix), a(S, ix), b(S, ix)).astype(ty))


def build_mov(ins, P):
    _, _, ty = _parts(ins.op, set())
    dst, src = ins.operands
    if dst[0] == "vec" or src[0] == "vec":  # pack / unpack equal-width pieces, low piece first
        vec, whole = (dst, src) if dst[0] == "vec" else (src, dst)
        n = len(vec[1])
        piece = UNSIGNED[ty.itemsize // n]
        shift = [np.uint64(8 * piece.itemsize * i) for i in range(n)]
        if dst[0] == "vec":
            get = P.reader(src, UNSIGNED[ty.itemsize])
            puts = [P.writer(e, piece) for e in vec[1]]

            def unpack(S, ix):
                v = np.asarray(get(S, ix)).astype(U64)
                for p, s in zip(puts, shift):
                    p(S, ix, (v >> s).astype(piece))
            return unpack
        gets = [P.reader(e, piece) for e in vec[1]]
        put = P.writer(dst, UNSIGNED[ty.itemsize])

        def pack(S, ix):
            v = sum((np.asarray(g(S, ix)).astype(U64) << s) for g, s in zip(gets, shift))
            put(S, ix, np.asarray(v).astype(UNSIGNED[ty.itemsize]))
        return pack
    return _unary(ins, P, ty, lambda a: a)


_BUILDERS = {
    **{b: build_arith for b in ("add", "sub", "mul", "mad", "div", "rem", "neg", "abs", "min", "max", "and", "or",
                                "xor", "not", "shl", "shr", "popc", "brev", "bfind", "bfi", "shf", "fma", "sqrt",
                                "ex2")},
    "setp": build_setp, "selp": build_selp, "mov": build_mov,
}


def compile_instruction(ins, program):
    """(kind, fn) for one instruction; ``SimUnsupported`` naming the opcode if the table lacks it."""
    from toolcall.kernels.sim import ops_convert, ops_memory, ops_warp  # noqa: F401 (they register themselves)
    base = ins.op.split(".")[0]
    if ins.op in CONTROL or base in CONTROL:
        return CONTROL.get(ins.op, CONTROL.get(base))(ins, program)
    if base not in _BUILDERS:
        raise SimUnsupported(f"{ins.op} is not in the executor's instruction table")
    return "op", _BUILDERS[base](ins, program)


CONTROL: dict = {}  # opcodes with their own (kind, fn) builders: memory, warp, barrier, control flow
BUILDERS = _BUILDERS  # the "op"-kind opcodes by base name (ops_convert.py adds cvt and cvta)
