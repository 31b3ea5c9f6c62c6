"""The executor's instructions, table-driven and exact where the hardware is exact.

Each row runs through a tiny PTX kernel (ld.global the operands by thread index, the instruction, st.global the
result), so the parser, operand access and the op itself are exercised. Expected bits come from an independent
oracle: ``fractions.Fraction`` arithmetic rounded here to float32, ``struct``, ml_dtypes for the narrow formats,
and bit patterns written from the PTX ISA (section names cited; docs.nvidia.com/cuda/parallel-thread-execution).
"""
from __future__ import annotations

import functools
import math
import struct
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from toolcall.kernels.sim.errors import SimUnsupported
from toolcall.kernels.sim.executor import LaunchSpec, run_launch
from toolcall.kernels.sim.memory import GlobalMemory
from toolcall.kernels.sim.numerics import TYPES, UNSIGNED
from toolcall.kernels.sim.ops_mma import warp_mma
from toolcall.kernels.sim.program import Program
from toolcall.kernels.sim.ptx_parse import parse_module

NAN, QNAN, PNAN = 0x7FFFFFFF, 0x7FC00000, 0xFFC00001  # canonical, the usual quiet NaN, a negative payload NaN
INF, NINF, MAXF, NEG0 = 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x80000000


# ---- the harness: one instruction (or a few) between loads and a store ----
def _kernel_text(body: str, ins: tuple[str, ...], out: str) -> str:
    names = [*"abc"[:len(ins)], "d"]
    params = ", ".join(f".param .u64 p{i}" for i in range(len(names)))
    decl = [".reg .b32 %tid, %t1, %t2, %r, %q;", ".reg .b64 %off, %ptr<4>;", ".reg .pred %p<3>;"]
    code = ["mov.u32 %t1, %ctaid.x;", "mov.u32 %t2, %ntid.x;", "mov.u32 %tid, %tid.x;",
            "mad.lo.u32 %tid, %t1, %t2, %tid;"]
    for i, (name, ty) in enumerate(zip(names, (*ins, out))):
        size = TYPES[ty].itemsize
        mem_ty = {"f16": "b16", "bf16": "b16", "f16x2": "b32"}.get(ty, ty)
        decl.append(f".reg .{'b32' if size == 1 else mem_ty} %{name};")
        code += [f"ld.param.u64 %ptr{i}, [p{i}];", f"mul.wide.u32 %off, %tid, {size};",
                 f"add.s64 %ptr{i}, %ptr{i}, %off;"]
        if name != "d":
            code.append(f"ld.global.{mem_ty} %{name}, [%ptr{i}];")
    code += [*body.split("\n"), f"st.global.{ {'f16': 'b16', 'bf16': 'b16'}.get(out, out)} [%ptr{len(ins)}], %d;",
             "ret;"]
    lines = "\n".join(f"    {s.strip()}" for s in decl + code if s.strip())
    return (".version 8.0\n.target sm_80\n.address_size 64\n\n"
            f".visible .entry k({params})\n{{\n{lines}\n}}\n")


@functools.lru_cache(maxsize=None)
def _program(body: str, ins: tuple[str, ...], out: str) -> Program:
    module = parse_module(_kernel_text(body, ins, out))
    return Program(module.functions["k"], module)


def run(body: str, ins: list[tuple[str, list]], out: str, block: int = 256) -> list[int]:
    """Bits of %d per thread; ``ins`` is [(type, bits per thread)] bound to %a, %b, %c."""
    prog = _program(body, tuple(t for t, _ in ins), out)
    n = len(ins[0][1]) if ins else block
    block = min(block, n)
    assert n % block == 0
    memory = GlobalMemory(1 << 16)
    params = np.zeros(prog.param_bytes, np.uint8)
    buffers = []
    for i, (ty, *values) in enumerate([*ins, (out,)]):
        dt = UNSIGNED[TYPES[ty].itemsize]
        address = memory.alloc(n * dt.itemsize)
        if values:
            memory.host_view(address, n * dt.itemsize)[:] = np.array(
                [v & ((1 << 8 * dt.itemsize) - 1) for v in values[0]], dt).view(np.uint8)
        params[prog.param_offsets[f"p{i}"]:][:8] = np.array([address], np.uint64).view(np.uint8)
        buffers.append((address, dt))
    run_launch(prog, LaunchSpec((n // block, 1, 1), (block, 1, 1), params, memory))
    address, dt = buffers[-1]
    return [int(v) for v in memory.host_view(address, n * dt.itemsize).view(dt)]


def run_rows(op: str, types: tuple[str, ...], out: str, rows, tail: str = "") -> None:
    """Each row (inputs..., expected bits) of one instruction ``op d, a[, b[, c]]{tail}``, all in one launch."""
    body = f"{op} %d, {', '.join('%' + x for x in 'abc'[:len(types)])}{tail};"
    got = run(body, [(t, [r[i] for r in rows]) for i, t in enumerate(types)], out)
    mask = (1 << 8 * TYPES[out].itemsize) - 1
    bad = [(tuple(map(hex, r[:-1])), hex(r[-1] & mask), hex(g)) for r, g in zip(rows, got) if g != r[-1] & mask]
    assert not bad, f"{op}: (inputs, expected, got): {bad}"


# ---- the oracle ----
def f32(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f64(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def fl(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def val(bits: int) -> Fraction:
    return Fraction(fl(bits))


def round_f32(x: Fraction, mode: str = "rn") -> int:
    """Bits of the float32 nearest ``x`` (``rn``, ties to even) or below it (``rm``); subnormals, overflow.
    An exact zero is +0 (rows needing -0 write it)."""
    if x == 0:
        return 0
    sign, m = (NEG0 if x < 0 else 0), abs(x)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    e = max(e - (Fraction(2) ** e > m), -126)  # 2^e <= m < 2^(e+1), or the subnormal exponent
    q = m / Fraction(2) ** (e - 23)
    n, rest = divmod(q.numerator, q.denominator)
    rest = Fraction(rest, q.denominator)
    if mode == "rn":
        n += rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1)
    else:
        n += bool(sign and rest)  # toward -inf: a negative value's magnitude rounds up
    v = n * Fraction(2) ** (e - 23)
    if v >= 2 ** 128:
        return sign | (INF if (mode == "rn" or sign) else MAXF)
    return sign | f32(float(v))


def rn(x) -> int:
    return round_f32(Fraction(x))


# ---- Floating Point Instructions: add, sub, mul, fma, div, sqrt (IEEE 754 rounding, .rn / .rm) ----
P16 = f32(2.0 ** -16 * (1 - 2.0 ** -23))
BINARY = [("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
          ("div", lambda a, b: a / b)]
BINARY_ROWS = [
    (f32(1.0), f32(2.0 ** -24)), (f32(1 + 2.0 ** -23), f32(2.0 ** -24)), (f32(1.0), f32(3 * 2.0 ** -24)),
    (1, 1), (0x00800000, 0x80000001), (MAXF, MAXF), (MAXF, f32(2.0 ** 103)), (f32(2.0 ** -75), f32(2.0 ** -75)),
    (f32(1.5 * 2.0 ** -75), f32(2.0 ** -75)), (f32(1 + 2.0 ** -23), f32(1 + 2.0 ** -23)), (f32(1.0), f32(3.0)),
    (f32(2.0 ** -100), f32(3 * 2.0 ** 30)), (f32(2.0 ** 64), f32(2.0 ** 64)), (f32(-7.25), f32(0.1)),
    (f32(2.0 ** 126), f32(0.75)),
]


@pytest.mark.parametrize("name,exact", BINARY, ids=[b[0] for b in BINARY])
def test_f32_binary_round_to_nearest_even(name, exact):
    rows = [(a, b, round_f32(exact(val(a), val(b)))) for a, b in BINARY_ROWS]
    specials = {  # IEEE 754 / PTX: NaN results are the canonical NaN 0x7FFFFFFF; exact zeros' signs
        "add": [(INF, NINF, NAN), (QNAN, f32(1.0), NAN), (f32(1.0), PNAN, NAN), (f32(1.0), f32(-1.0), 0),
                (NEG0, NEG0, NEG0), (NEG0, 0, 0), (f32(-3.0e38), f32(-3.0e38), NINF)],
        "sub": [(INF, INF, NAN), (QNAN, QNAN, NAN), (f32(1.0), f32(1.0), 0), (NEG0, 0, NEG0)],
        "mul": [(0, INF, NAN), (PNAN, f32(2.0), NAN), (NEG0, f32(5.0), NEG0), (f32(-2.0 ** 64), f32(2.0 ** 64), NINF)],
        "div": [(0, 0, NAN), (INF, INF, NAN), (f32(1.0), 0, INF), (f32(-1.0), 0, NINF), (f32(1.0), NEG0, NINF),
                (QNAN, f32(1.0), NAN)],
    }[name]
    rows = [r for r in rows if name != "div" or r[1]] + specials
    for op in (f"{name}.rn.f32", f"{name}.f32") if name != "div" else ("div.rn.f32",):  # no modifier: .rn
        run_rows(op, ("f32", "f32"), "f32", rows)


def _sqrt_rn(bits: int) -> int:
    """The float32 r with (r - ulp/2)^2 < x < (r + ulp/2)^2 (sqrt has no ties)."""
    x = val(bits)
    r = np.float32(math.sqrt(float(x)))
    for cand in (np.nextafter(r, np.float32(0)), r, np.nextafter(r, np.float32(np.inf))):
        lo, hi = np.nextafter(cand, np.float32(0)), np.nextafter(cand, np.float32(np.inf))
        c, lo, hi = (Fraction(float(v)) for v in (cand, lo, hi))
        if ((c + lo) / 2) ** 2 < x < ((c + hi) / 2) ** 2:
            return f32(float(cand))
    raise AssertionError(hex(bits))


def test_sqrt_rn():
    normal = [f32(2.0), f32(3.0), f32(0.1), 1, 0x007FFFFF, f32(1e38), f32(1 + 2.0 ** -23), f32(4.0)]
    specials = [(f32(-1.0), NAN), (NINF, NAN), (QNAN, NAN), (NEG0, NEG0), (INF, INF)]  # sqrt(-0) = -0
    run_rows("sqrt.rn.f32", ("f32",), "f32", [(a, _sqrt_rn(a)) for a in normal] + specials)


def fma_rows(mode):
    h = 2.0 ** -16
    rows = [  # (a, b, c): a*b+c in f64 lands exactly on an f32 midpoint (257 + 3*2^-16), the exact value is
        # 2^-62 below it: one rounding gives 257 + 2^-15, rounding via f64 would give 257 + 2^-14 (even)
        (f32(1 + 2.0 ** -23), P16, f32(257 + 2 * h)), (f32(-1 - 2.0 ** -23), P16, f32(-257 - 2 * h)),
        (f32(1 + 2.0 ** -23), f32(1 - 2.0 ** -23), f32(-1.0)), (f32(2.0 ** -70), f32(2.0 ** -70), 1),
        (f32(2.0 ** -75), f32(2.0 ** -75), f32(-(2.0 ** -149))), (f32(1.5 * 2.0 ** -75), f32(2.0 ** -75), 0),
        (MAXF, f32(2.0), f32(-3.0e38)), (MAXF, f32(2.0), 0), (f32(-3.0e38), f32(2.0), 0),
        (f32(1.0), f32(1.0), f32(-(2.0 ** -30))), (f32(-1.0), f32(1.0), f32(2.0 ** -30)),
        (f32(0.1), f32(0.7), f32(-0.07)), (f32(3.0), f32(1 / 3), f32(-1.0)), (0x00800001, f32(0.5), 0),
    ]
    return [(a, b, c, round_f32(val(a) * val(b) + val(c), mode)) for a, b, c in rows]


def test_fma_rn_single_rounding():
    assert fma_rows("rn")[0][3] == f32(257 + 2.0 ** -15)  # the oracle itself on the midpoint row
    specials = [(INF, 0, f32(1.0), NAN), (INF, f32(1.0), NINF, NAN), (f32(1.0), f32(1.0), QNAN, NAN),
                (PNAN, f32(0.0), f32(1.0), NAN), (f32(1.0), f32(1.0), f32(-1.0), 0), (NEG0, f32(1.0), NEG0, NEG0)]
    run_rows("fma.rn.f32", ("f32",) * 3, "f32", fma_rows("rn") + specials)


def test_fma_rm_rounds_toward_minus_infinity():
    rows = fma_rows("rm")
    assert rows[9][3] == 0x3F7FFFFF and rows[10][3] == f32(-1.0)  # just below 1: the next float down
    # IEEE 754 6.3: an exact zero sum of opposite signs is -0 under roundTowardNegative; overflow: +max, -inf
    specials = [(f32(1.0), f32(1.0), f32(-1.0), NEG0), (0, f32(1.0), 0, 0), (MAXF, f32(2.0), 0, MAXF),
                (MAXF, f32(-2.0), 0, NINF), (INF, 0, 0, NAN)]
    run_rows("fma.rm.f32", ("f32",) * 3, "f32", rows + specials)


@pytest.mark.parametrize("mode", ["rn", "rm"])
def test_fma_random_near_cancellation_and_midpoints(mode):
    rng = np.random.default_rng(7)
    n = 1024
    a = (rng.standard_normal(n) * 2.0 ** rng.integers(-80, 20, n)).astype(np.float32)  # products down to
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-80, 20, n)).astype(np.float32)  # f32 subnormals
    # c cancels most of a*b (its f32 rounding nudged by a few ulp), or is far larger than it
    near = -(a.astype(np.float64) * b).astype(np.float32) * (1 + rng.integers(-3, 4, n) * 2.0 ** -23)
    far = (rng.standard_normal(n) * 2.0 ** rng.integers(-150, 40, n)).astype(np.float32)
    c = np.where(rng.random(n) < 0.5, near, far).astype(np.float32)
    # or (a third of the rows) c is odd and a*b = +-(ulp(c)/2)(1 - j^2 2^-46), j < 2^8: the sum rounded to f64
    # is the f32 midpoint beside c (rounding it again gives the even neighbour), the exact value is not
    mid = rng.random(n) < 1 / 3
    cm = (rng.integers(0x0D000000, 0x7E000000, n).astype(np.uint32) | 1).view(np.float32)
    cm = np.where(rng.random(n) < 0.5, -cm, cm)
    x = rng.integers(1, 256, n) * 2.0 ** -23
    a = np.where(mid, (1 + x) * np.spacing(np.abs(cm)) / 2 * rng.choice([-1, 1], n), a).astype(np.float32)
    b, c = np.where(mid, 1 - x, b).astype(np.float32), np.where(mid, cm, c).astype(np.float32)
    rows = [(f32(x), f32(y), f32(z), round_f32(val(f32(x)) * val(f32(y)) + val(f32(z)), mode))
            for x, y, z in zip(a, b, c)]
    run_rows(f"fma.{mode}.f32", ("f32",) * 3, "f32", rows)


# ---- Floating Point Instructions: ex2. The model: 2^x rounded once, ftz; the ISA: within 2 ulp of that ----
def test_ex2_approx_ftz_special_values_and_accuracy():
    # the ISA's table: -Inf -> +0.0, -0.0 / +0.0 -> +1.0, +Inf -> +Inf, NaN -> NaN; .ftz flushes subnormal
    # inputs (so they give 1.0) and results
    rows = [(0, f32(1.0)), (NEG0, f32(1.0)), (1, f32(1.0)), (0x80000001, f32(1.0)), (NINF, 0), (INF, INF),
            (f32(128.0), INF), (f32(-127.0), 0), (f32(-150.0), 0)]  # 2^-127: a subnormal result, flushed
    run_rows("ex2.approx.ftz.f32", ("f32",), "f32", rows)
    assert run("ex2.approx.ftz.f32 %d, %a;", [("f32", [QNAN])], "f32")[0] & 0x7FFFFFFF > INF
    xs = [0.3, 1 / 3, -10.7, 5.5, -0.001, 100.25, -120.5, 3.0, -126.0]
    got = run("ex2.approx.ftz.f32 %d, %a;", [("f32", [f32(x) for x in xs])], "f32")
    for x, g in zip(xs, got):
        true = 2.0 ** float(np.float32(x))
        ulp = math.ulp(float(np.float32(true))) * 2.0 ** 29  # the f32 ulp at the result
        assert abs(float(val(g)) - true) <= 2 * ulp, (x, hex(g))


# ---- Floating Point Instructions: min / max (ISA semantics: a NaN operand gives the other operand, two NaNs
# NaN (canonical on the hardware), and "+0.0 > -0.0") ----
MINMAX = [(QNAN, f32(1.0), f32(1.0), f32(1.0)), (f32(-1.0), PNAN, f32(-1.0), f32(-1.0)), (QNAN, PNAN, NAN, NAN),
          (0, NEG0, 0, NEG0), (NEG0, 0, 0, NEG0), (NINF, f32(-3.0e38), f32(-3.0e38), NINF),
          (1, 0, 1, 0), (0x80000001, NEG0, NEG0, 0x80000001), (INF, QNAN, INF, INF),
          (f32(2.0), f32(3.0), f32(3.0), f32(2.0))]


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_f32(op):
    run_rows(f"{op}.f32", ("f32", "f32"), "f32", [(a, b, mx if op == "max" else mn) for a, b, mx, mn in MINMAX])


# ---- Comparison and Selection Instructions: setp (ordered forms false on NaN, unordered true; num / nan) ----
PAIRS = [(1.0, 2.0), (2.0, 1.0), (1.0, 1.0), (math.nan, 1.0), (1.0, math.nan), (0.0, -0.0), (math.inf, math.nan)]
ORDERED = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
           "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}


def setp_oracle(cmp, a, b):
    unordered = math.isnan(a) or math.isnan(b)
    if cmp in ("num", "nan"):
        return unordered == (cmp == "nan")
    if cmp.endswith("u"):
        return unordered or ORDERED[cmp[:-1]](a, b)
    return not unordered and ORDERED[cmp](a, b)


@pytest.mark.parametrize("cmp", [*ORDERED, "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"])
def test_setp_f32_ordered_unordered(cmp):
    got = run(f"setp.{cmp}.f32 %p1, %a, %b;\nselp.u32 %d, 1, 0, %p1;",
              [("f32", [f32(a) for a, _ in PAIRS]), ("f32", [f32(b) for _, b in PAIRS])], "u32")
    assert got == [int(setp_oracle(cmp, a, b)) for a, b in PAIRS], cmp


@pytest.mark.parametrize("cmp,ty,expected", [
    ("lt", "s32", [1, 0, 0, 1]), ("lt", "u32", [0, 1, 0, 1]), ("lo", "u32", [0, 1, 0, 1]),
    ("hi", "u32", [1, 0, 0, 0]), ("ge", "s32", [0, 1, 1, 0]), ("hs", "u32", [1, 0, 1, 0]),
    ("le", "s32", [1, 0, 1, 1])])
def test_setp_integer_signed_vs_unsigned(cmp, ty, expected):  # pairs: (-1, 1), (1, -2), (5, 5), (-3, -2)
    a, b = [-1, 1, 5, -3], [1, -2, 5, -2]
    assert run(f"setp.{cmp}.{ty} %p1, %a, %b;\nselp.u32 %d, 1, 0, %p1;", [(ty, a), (ty, b)], "u32") == expected


# ---- Data Movement and Conversion Instructions: cvt (rounding, saturation, NaN, integer widths) ----
BF16 = lambda x: int(np.array(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16))  # noqa: E731


def F16(x) -> int:
    with np.errstate(over="ignore"):
        return int(np.array(x, np.float32).astype(np.float16).view(np.uint16))

TO_BF16 = [0x3F808000, 0x3F818000, 0x3F808001, 0x3F7FFFFF, MAXF, 0x7F7F7FFF, 0x7F7F8000, 1, 0x00008000, 0x00018000,
           f32(-1e-40), NINF, f32(3.14159)]
TO_F16 = [f32(1 + 2.0 ** -11), f32(1 + 3 * 2.0 ** -11), f32(65504.0), f32(65519.99), f32(65520.0), f32(2.0 ** -24),
          f32(2.0 ** -25), f32(3 * 2.0 ** -26), f32(2.0 ** -14), f32(-(2.0 ** -25)), f32(1e10), NINF, f32(0.1)]
HI, LO = 2 ** 31 - 1, -2 ** 31  # float -> s32 saturates to [-2^31, 2^31 - 1]; NaN -> 0
I32 = [(2.5, 2, 2, 2), (3.5, 4, 3, 3), (-2.5, -2, -2, -3), (-2.7, -3, -2, -3), (2.7, 3, 2, 2), (-0.1, 0, 0, -1),
       (2.0 ** 31, HI, HI, HI), (-(2.0 ** 31), LO, LO, LO), (3e9, HI, HI, HI), (-3e9, LO, LO, LO),
       (math.inf, HI, HI, HI), (-math.inf, LO, LO, LO), (math.nan, 0, 0, 0)]  # (x, rni, rzi, rmi)
CVT = {  # op: (source type, destination type, [(input bits, expected bits)])
    "cvt.rn.bf16.f32": ("f32", "bf16", [(x, BF16(fl(x))) for x in TO_BF16] + [  # hand-written: ties, NaN
        (0x3F808000, 0x3F80), (0x3F818000, 0x3F82), (MAXF, 0x7F80), (QNAN, 0x7FFF), (PNAN, 0x7FFF)]),
    "cvt.rn.f16.f32": ("f32", "f16", [(x, F16(fl(x))) for x in TO_F16] + [
        (f32(2.0 ** -25), 0), (f32(65520.0), 0x7C00), (f32(2.0 ** -24), 1), (QNAN, 0x7FFF)]),
    "cvt.f32.bf16": ("bf16", "f32", [(0x3F80, f32(1.0)), (0x0001, 0x00010000), (0xFF80, NINF), (0x8000, NEG0)]),
    "cvt.f32.f16": ("f16", "f32", [(0x0001, f32(2.0 ** -24)), (0x7BFF, f32(65504.0)), (0xFC00, NINF),
                                   (0x8000, NEG0), (0x3555, f32(float(np.uint16(0x3555).view(np.float16))))]),
    **{f"cvt.{m}.s32.f32": ("f32", "s32", [(f32(r[0]), r[k]) for r in I32]) for k, m in
       ((1, "rni"), (2, "rzi"), (3, "rmi"))},
    "cvt.rzi.u32.f32": ("f32", "u32", [(f32(-1.5), 0), (f32(4.5e9), 0xFFFFFFFF), (QNAN, 0), (f32(3.9), 3),
                                       (NINF, 0), (f32(2.0 ** 31), 2 ** 31)]),
    "cvt.rmi.f32.f32": ("f32", "f32", [(f32(-0.5), f32(-1.0)), (f32(0.5), 0), (NEG0, NEG0), (f32(-0.25), f32(-1.0)),
                                       (f32(2.0 ** 23 + 0.5), f32(2.0 ** 23)), (QNAN, NAN), (NINF, NINF)]),
    # .sat clamps to [0.0, 1.0]; "NaN results are flushed to positive zero"
    "cvt.sat.f32.f32": ("f32", "f32", [(f32(1.5), f32(1.0)), (f32(-0.5), 0), (QNAN, 0), (PNAN, 0),
                                       (f32(0.25), f32(0.25)), (INF, f32(1.0)), (NINF, 0)]),
    "cvt.rn.f32.s32": ("s32", "f32", [(x, rn(x)) for x in (2 ** 24 + 1, 2 ** 24 + 3, -(2 ** 24) - 1, 2 ** 31 - 1,
                                                               -2 ** 31, 2 ** 24 + 5, 7)]),
    "cvt.rn.f32.u32": ("u32", "f32", [(x, rn(x)) for x in (2 ** 32 - 1, 2 ** 24 + 1, 2 ** 24 + 5, 2 ** 31 + 128)]),
    "cvt.rn.f64.s64": ("s64", "f64", [(x, f64(float(x))) for x in
                                      (2 ** 53 + 1, 2 ** 53 + 3, -2 ** 63, 2 ** 63 - 1, -(2 ** 53) - 1)]),
    "cvt.rn.f32.f64": ("f64", "f32", [(f64(x), rn(x) if x == x else NAN) for x in (
        1 + 2.0 ** -24, 1 + 2.0 ** -24 + 2.0 ** -52, 1e300, 2.0 ** -150, 2.0 ** -150 * (1 + 2.0 ** -52), -1e-300, 0.1,
        math.nan)]),
    # integer conversions: narrowing chops, a narrow result is sign- / zero-extended into the wider register
    "cvt.s16.s8": ("u8", "s16", [(0x80, 0xFF80), (0x7F, 0x7F), (0xFF, 0xFFFF)]),
    "cvt.s32.s16": ("u16", "s32", [(0x8001, 0xFFFF8001), (0x7FFF, 0x7FFF)]),
    "cvt.u8.u32": ("u32", "u32", [(0x1FF, 0xFF), (0x12345680, 0x80)]),
    "cvt.s8.s32": ("s32", "s32", [(0x17F, 0x7F), (0x180, 0xFFFFFF80), (-129, 0x7F), (-1, 0xFFFFFFFF)]),
}


@pytest.mark.parametrize("op", list(CVT))
def test_cvt(op):
    src, dst, rows = CVT[op]
    run_rows(op, (src,), dst, rows)


def test_cvt_e4m3x2_to_f16x2_all_codes():
    codes = list(range(256))
    f16 = np.array(codes, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float16).view(np.uint16).astype(int)
    f16[[0x7F, 0xFF]] = 0x7FFF  # the two E4M3 NaN codes give the canonical f16 NaN
    rows = [(lo | (255 - lo) << 8, int(f16[lo]) | int(f16[255 - lo]) << 16) for lo in codes]  # low byte -> low half
    run_rows("cvt.rn.f16x2.e4m3x2", ("b16",), "b32", rows)


def test_cvt_e2m1x2_to_f16x2_all_codes():
    f16 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float16).view(np.uint16).astype(int)
    assert list(f16[:8]) == [F16(v) for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)]
    rows = [(x, int(f16[x & 15]) | int(f16[x >> 4]) << 16) for x in range(256)]  # low nibble -> low half
    run_rows("cvt.rn.f16x2.e2m1x2", ("u8",), "b32", rows)


# ---- Integer Arithmetic Instructions (div, rem, mul.hi / .wide, mad.wide, bfind, brev, popc, bfi), Logic and
# Shift Instructions (shl, shr, shf), Comparison and Selection Instructions (selp) ----
def trunc_div(a, b):  # C semantics: the quotient toward zero, the remainder takes the dividend's sign
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    return q, a - q * b


def bfi(a, b, pos, length):  # the ISA's bfi semantics: f = b; f[pos + i] = a[i] for i < len while pos + i <= 31
    for i in range(length & 0xFF):
        if (pos & 0xFF) + i <= 31:
            b = (b & ~(1 << ((pos & 0xFF) + i))) | (((a >> i) & 1) << ((pos & 0xFF) + i))
    return b & 0xFFFFFFFF


DIV_PAIRS = [(7, 2), (-7, 2), (7, -2), (-7, -2), (-1, 5), (2 ** 31 - 1, -1), (-2 ** 31, 3)]
INT = [  # (instruction, operand types, destination type, rows)
    ("div.s32", ("s32", "s32"), "s32", [(a, b, trunc_div(a, b)[0]) for a, b in DIV_PAIRS]),
    ("rem.s32", ("s32", "s32"), "s32", [(a, b, trunc_div(a, b)[1]) for a, b in DIV_PAIRS]),
    ("div.u32", ("u32", "u32"), "u32", [(0xFFFFFFFF, 2, 0x7FFFFFFF), (7, 9, 0)]),
    ("rem.u32", ("u32", "u32"), "u32", [(0xFFFFFFFF, 10, 5), (7, 9, 7)]),
    # shl / shr: "shift amounts greater than the register width N are clamped to N"
    ("shl.b32", ("b32", "u32"), "b32", [(1, 31, 0x80000000), (1, 32, 0), (0xFFFFFFFF, 33, 0), (1, 0xFFFFFFFF, 0),
                                        (3, 0, 3)]),
    ("shr.u32", ("u32", "u32"), "u32", [(0x80000000, 31, 1), (0x80000000, 32, 0), (0xFFFFFFFF, 200, 0)]),
    ("shr.b32", ("b32", "u32"), "b32", [(0x80000000, 31, 1), (0x80000000, 40, 0)]),
    ("shr.s32", ("s32", "u32"), "s32", [(-2 ** 31, 31, -1), (-2 ** 31, 100, -1), (2 ** 30, 100, 0), (-8, 1, -4)]),
    ("bfi.b32", ("b32", "b32", "u32"), "b32", [  # %c is pos; len is the immediate 8
        (0xF, 0xFFFF0000, 4, bfi(0xF, 0xFFFF0000, 4, 8)), (0xFF, 0, 28, bfi(0xFF, 0, 28, 8)),
        (0xAB, 0x12345678, 32, 0x12345678), (0xAB, 0x12345678, 0x104, bfi(0xAB, 0x12345678, 4, 8))]),
    ("bfind.u32", ("u32",), "u32", [(0, 0xFFFFFFFF), (1, 0), (0x80000000, 31), (0x00012345, 16)]),
    ("bfind.shiftamt.u32", ("u32",), "u32", [(0, 0xFFFFFFFF), (1, 31), (0x80000000, 0), (0x00010000, 15)]),
    ("brev.b32", ("b32",), "b32", [(1, 0x80000000), (0x12345678, int(f"{0x12345678:032b}"[::-1], 2)), (0, 0)]),
    ("popc.b32", ("b32",), "u32", [(0xFFFFFFFF, 32), (0, 0), (0x12345678, 13)]),
    # shf.l.wrap: the upper 32 bits of (b:a) << (c & 31)
    ("shf.l.wrap.b32", ("b32",) * 3, "b32", [(0x89ABCDEF, 0x01234567, n, (((0x01234567 << 32 | 0x89ABCDEF)
                                                                            << (n & 31)) >> 32) & 0xFFFFFFFF)
                                             for n in (0, 8, 31, 32, 36)]),
    ("mul.hi.u32", ("u32", "u32"), "u32", [(0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFE), (0x80000000, 2, 1)]),
    ("mul.hi.s32", ("s32", "s32"), "s32", [(-1, 1, -1), (2 ** 31 - 1, 2, 0), (-2 ** 31, -2 ** 31, 2 ** 30)]),
    ("mul.wide.s32", ("s32", "s32"), "s64", [(-2, 3, -6), (LO, LO, 2 ** 62), (-1, HI, -HI)]),
    ("mul.wide.u32", ("u32", "u32"), "u64", [(0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFE00000001)]),
    ("mad.wide.u32", ("u32", "u32", "u64"), "u64", [(0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF00000000),
                                                    (3, 4, 2 ** 64 - 12, 0)]),
]


@pytest.mark.parametrize("op,types,out,rows", INT, ids=[r[0] for r in INT])
def test_integer(op, types, out, rows):
    run_rows(op, types, out, rows, ", 8" if op == "bfi.b32" else "")  # bfi d, a, b, pos, len: len = 8


def test_selp():
    got = run("setp.ne.u32 %p1, %c, 0;\nselp.b32 %d, %a, %b, %p1;",
              [("b32", [1, 2, 3]), ("b32", [10, 20, 30]), ("u32", [0, 1, 0xFFFFFFFF])], "b32")
    assert got == [10, 2, 3]


# ---- Data Movement and Conversion Instructions: shfl.sync; Parallel Synchronization and Communication
# Instructions: vote.sync (two warps, 64 threads) ----
def shfl_oracle(mode, a, b, c):
    """The PTX ISA shfl.sync pseudocode, per lane of each warp: (value, predicate)."""
    out = []
    for t in range(len(a)):
        lane, base = t & 31, t & ~31
        bval, cval, segmask = b & 31, c & 31, (c >> 8) & 31
        max_lane, min_lane = (lane & segmask) | (cval & ~segmask), lane & segmask
        j, ok = {"up": (lane - bval, lane - bval >= max_lane), "down": (lane + bval, lane + bval <= max_lane),
                 "bfly": (lane ^ bval, lane ^ bval <= max_lane),
                 "idx": (min_lane | (bval & ~segmask), (min_lane | (bval & ~segmask)) <= max_lane)}[mode]
        out.append((a[base + (j if ok else lane)], ok))
    return out


@pytest.mark.parametrize("mode,b,c", [
    ("bfly", 1, 0x1F), ("bfly", 16, 0x1F), ("bfly", 16, 0x101F), ("bfly", 4, 0x181F), ("bfly", 8, 0x181F),
    ("idx", 5, 0x1F), ("idx", 5, 0x101F), ("idx", 21, 0x101F), ("idx", 37, 0x1F), ("idx", 3, 0x181F),
    ("down", 1, 0x1F), ("down", 4, 0x181F), ("up", 1, 0), ("up", 2, 0x1800)])
def test_shfl_sync_width_and_clamp(mode, b, c):
    a = [100 + 7 * t for t in range(64)]
    got = run(f"shfl.sync.{mode}.b32 %r|%p1, %a, {b}, {c:#x}, 0xffffffff;\nselp.u32 %q, 0x80000000, 0, %p1;\n"
              "or.b32 %d, %r, %q;", [("u32", a)], "u32", block=64)
    assert got == [v | (ok << 31) for v, ok in shfl_oracle(mode, a, b, c)]


def test_vote_sync_ballot_two_warps():
    pred = [int(t % 3 == 0 or t == 63) for t in range(64)]
    got = run("setp.ne.u32 %p1, %a, 0;\nvote.sync.ballot.b32 %d, %p1, 0xffffffff;", [("u32", pred)], "u32", block=64)
    masks = [sum(pred[w * 32 + i] << i for i in range(32)) for w in range(2)]
    assert got == [masks[t // 32] for t in range(64)]


# ---- Warp Level Matrix Multiply-Accumulate Instructions: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ----
def fragments(A, B, C):
    """Registers per lane from the PTX ISA fragment formulas ("Matrix Fragments for mma.m16n8k16 with floating
    point type"): groupID g = lane >> 2, t = lane % 4; element i = 2 * register + half."""
    bits = lambda x: np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)  # noqa
    a, b, c = np.zeros((4, 1, 32), np.uint32), np.zeros((2, 1, 32), np.uint32), np.zeros((4, 1, 32), np.float32)
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):
            a[i // 2, 0, lane] |= bits(A[g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >= 4)]) << 16 * (i & 1)
        for i in range(4):
            b[i // 2, 0, lane] |= bits(B[2 * t + (i & 1) + 8 * (i >= 2), g]) << 16 * (i & 1)
            c[i, 0, lane] = C[g + 8 * (i >= 2), 2 * t + (i & 1)]
    return list(a), list(b), list(c)


def test_mma_m16n8k16_bf16_exact_products_and_layout():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((16, 16)).astype(ml_dtypes.bfloat16).astype(np.float64)
    B = rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16).astype(np.float64)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    a, b, c = fragments(A, B, C)
    d = warp_mma(a, b, c)
    D = np.zeros((16, 8), np.float32)
    for lane in range(32):
        for i in range(4):
            D[(lane >> 2) + 8 * (i >= 2), 2 * (lane % 4) + (i & 1)] = d[i][0, lane]
    np.testing.assert_array_equal(D, (A @ B + C.astype(np.float64)).astype(np.float32))
    swapped = warp_mma([a[1], a[0], a[2], a[3]], b, c)
    assert not all(np.array_equal(x, y) for x, y in zip(d, swapped))  # the register layout matters


# ---- an opcode outside the table is refused, never skipped ----
def test_unknown_opcode_is_refused_with_its_line():
    text = _kernel_text("tanh.approx.f32 %d, %a;", ("f32",), "f32")
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "tanh" in s)
    module = parse_module(text)
    with pytest.raises(SimUnsupported) as e:
        Program(module.functions["k"], module)
    assert "tanh.approx.f32" in e.value.message and f"PTX line {line}" in e.value.message
