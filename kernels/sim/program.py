"""One PTX entry function compiled into steps the machine runs: each instruction a closure over the
batch's lane state, its operands resolved to register slots, constants and addresses once.

A step's closure is ``fn(S, ix)``: ``S`` the batch (toolcall.kernels.sim.machine.Batch), ``ix`` the lanes that
execute it (an index array, or ``slice(None)`` for all lanes), guard already applied. Registers are numpy
arrays over the batch's lanes, one per PTX register, in the declared type's width (a ``.f32`` register holds
float32, a ``.b32`` register uint32 bits, a ``.pred`` bool); an instruction reads a register as its own
type by a view (same width), a truncation (narrower, as ld/st allow) or a zero extension.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from toolcall.kernels.sim.errors import SimUnsupported
from toolcall.kernels.sim.numerics import APPROXIMATE, SIGNED, TYPES, UNSIGNED
from toolcall.kernels.sim.ptx_parse import Function, Instr, Module

REGISTER_DTYPES = {**TYPES, "f16": np.dtype(np.uint16), "bf16": np.dtype(np.uint16)}
SHARED_GENERIC_BASE = 0x7E00_0000_0000  # cvta.shared: generic addresses of the shared window (non-null)
LOCAL_GENERIC_BASE = 0x7D00_0000_0000


@dataclass
class Step:
    """One instruction ready to run: ``kind`` (op, bra, ret, bar), ``fn``, the guard's register slot and negation,
    the branch target, the instruction itself (for messages) and, for a warp-synchronous one, ``member_mask``."""

    kind: str
    fn: Callable | None
    guard: int | None
    negated: bool
    target: int
    instr: Instr
    member_mask: Callable | None = None

    def __post_init__(self):
        # an op that every lane at its pc runs, with no partners to wait for (executor.run_batch's short path)
        self.plain = self.kind == "op" and self.fn is not None and self.guard is None and self.member_mask is None


class Program:
    """A compiled entry function: ``steps``, register slots and dtypes, the parameter block layout, and the
    shared / local variables' offsets (static shared first; dynamic shared after, 16-byte aligned)."""

    def __init__(self, fn: Function, module: Module):
        self.name, self.fn, self.module = fn.name, fn, module
        self.slots: dict[str, int] = {}
        self.reg_dtypes: list[np.dtype] = []
        for name, ty in fn.registers.items():
            self.slots[name] = len(self.reg_dtypes)
            self.reg_dtypes.append(REGISTER_DTYPES[ty])
        self.register_bytes = sum(dt.itemsize for dt in self.reg_dtypes)  # a lane's
        self.param_offsets: dict[str, int] = {}
        offset = 0
        for name, size in fn.params:
            offset = -(-offset // min(size, 8)) * min(size, 8)
            self.param_offsets[name] = offset
            offset += size
        self.param_bytes = offset
        self.shared_offsets, self.shared_static, self.dynamic_shared = self._layout_shared(module, fn)
        self.local_offsets, self.local_bytes = self._layout("local", fn.variables)
        self.call_params = {v.name: v.size for v in fn.variables if v.space == "param"}
        # racecheck granule: the narrowest shared access this function makes (2 or 4 bytes)
        narrow = any(i.op.startswith(("ld.shared", "st.shared")) and TYPES[i.op.rsplit(".", 1)[1]].itemsize < 4
                     for i in fn.instructions)
        self.shared_granule = 2 if narrow else 4
        self.has_atomics = any(i.op.startswith("atom.") for i in fn.instructions)
        # instructions whose bits PTX does not specify (numerics.APPROXIMATE): the executor's model, not the card's
        self.approximate = sorted({i.op for i in fn.instructions if i.op in APPROXIMATE})
        self.global_names = {v.name for v in module.variables if v.space in ("global", "const")}
        from toolcall.kernels.sim.ops import compile_instruction  # the op table imports this module's helpers
        self.steps = []
        for ins in fn.instructions:
            try:
                kind, run = compile_instruction(ins, self)
            except SimUnsupported as e:
                raise SimUnsupported(f"{self.name}: PTX line {ins.line} ({ins.loc}): {e.message}",
                                     kernel=self.name, line=ins.line, op=ins.op) from None
            target = fn.labels.get(ins.operands[0][1], -1) if kind == "bra" else -1
            guard = self.slots[ins.guard[0]] if ins.guard else None
            self.steps.append(Step(kind, run, guard, bool(ins.guard and ins.guard[1]), target, ins,
                                   getattr(run, "member_mask", None)))
        self.exit_pc = len(self.steps)

    @staticmethod
    def _layout(space, variables):
        offsets, offset = {}, 0
        for v in variables:
            if v.space == space and not v.extern:
                offset = -(-offset // v.align) * v.align
                offsets[v.name] = offset
                offset += v.size
        return offsets, offset

    def _layout_shared(self, module, fn):
        variables = [v for v in module.variables + fn.variables if v.space == "shared"]
        offsets, static = self._layout("shared", variables)
        dynamic = [v.name for v in variables if v.extern]
        start = -(-static // 16) * 16
        for name in dynamic:
            offsets[name] = start
        return offsets, static, start if dynamic else static

    # ---- operand access ----
    def slot(self, op) -> int:
        if op[0] != "reg" or op[1] not in self.slots:
            raise SimUnsupported(f"expected a declared register, found {op}")
        return self.slots[op[1]]

    def symbol_address(self, name: str) -> Callable:
        """fn(S) -> the address of a shared / local variable (its offset in the window) or of a module ``.global``
        variable (where the device placed it: the batch's ``globals``), so a Program serves every device."""
        if name in self.shared_offsets:
            return lambda S, at=self.shared_offsets[name]: at
        if name in self.local_offsets:
            return lambda S, at=self.local_offsets[name]: at
        if name in self.global_names:
            return lambda S: S.launch.globals[name]
        raise SimUnsupported(f"unknown symbol {name!r}")

    def reader(self, op, ty: np.dtype) -> Callable:
        """fn(S, ix) -> the operand's value for lanes ``ix`` as ``ty`` (an array, or a 0-d constant)."""
        kind = op[0]
        if kind == "reg":
            slot, rdt = self.slot(op), self.reg_dtypes[self.slot(op)]
            if rdt == ty:
                return lambda S, ix: S.regs[slot][ix]
            if rdt.itemsize == ty.itemsize:
                return lambda S, ix: S.regs[slot][ix].view(ty)
            if ty == np.dtype(bool):
                return lambda S, ix: S.regs[slot][ix] != 0
            unsigned = UNSIGNED[ty.itemsize]
            return lambda S, ix: S.regs[slot][ix].astype(unsigned).view(ty)
        if kind == "imm":
            value = immediate(op[1], ty)
            return lambda S, ix: value
        if kind == "sreg":
            name = op[1]
            return lambda S, ix: S.special[name][ix].astype(ty)
        if kind == "sym":
            where = self.symbol_address(op[1])
            return lambda S, ix: np.array(where(S)).astype(ty)
        raise SimUnsupported(f"operand {op} cannot be read as a value")

    def writer(self, op, ty: np.dtype) -> Callable:
        """fn(S, ix, value): stores ``value`` (of ``ty``) into the operand's register for lanes ``ix``; a
        narrower type is sign- or zero-extended to the register by the type's signedness."""
        if op[0] == "sink":
            return lambda S, ix, value: None
        slot = self.slot(op)
        rdt = self.reg_dtypes[slot]
        if rdt == ty:  # numpy's assignment casts as np.asarray(value, ty) would (unsafe, the same bits)
            def put_same(S, ix, value):
                S.regs[slot][ix] = value
            return put_same
        if rdt.itemsize == ty.itemsize and ty != np.dtype(bool):
            def put(S, ix, value):
                S.regs[slot][ix] = np.asarray(value, ty).view(rdt)
            return put
        if rdt == np.dtype(bool) or ty == np.dtype(bool):
            raise SimUnsupported(f"a predicate and a {rdt} register mixed in {op}")
        wide = (SIGNED if ty.kind == "i" else UNSIGNED)[rdt.itemsize]

        def put_resized(S, ix, value):
            S.regs[slot][ix] = np.asarray(value, ty).astype(wide).view(rdt)
        return put_resized

    def address(self, op) -> Callable:
        """fn(S, ix) -> uint64 addresses of a ``[base+offset]`` operand (base a register or a symbol)."""
        if op[0] != "mem":
            raise SimUnsupported(f"expected an address operand, found {op}")
        base, offset = op[1], np.uint64(op[2] & 0xFFFFFFFFFFFFFFFF)
        if base in self.slots:
            get = self.reader(("reg", base), np.dtype(np.uint64))
            return lambda S, ix: get(S, ix) + offset
        if base in self.param_offsets or base in self.call_params:
            raise SimUnsupported(f"parameter {base!r} as a memory address")
        where = self.symbol_address(base)
        return lambda S, ix: np.uint64(where(S)) + offset


def immediate(text: str, ty: np.dtype):
    """A PTX immediate as a 0-d array of ``ty``: decimal / hex integers (wrapped to the type), and float bit
    patterns: ``0f`` then 8 hex digits (f32), ``0d`` then 16 (f64)."""
    t = text.rstrip("U")
    if t[:2] in ("0f", "0F"):
        bits = np.array(int(t[2:], 16), np.uint32)
        value = bits.view(np.float32)
        return value.astype(ty) if ty.kind == "f" else bits.astype(ty)
    if t[:2] in ("0d", "0D"):
        bits = np.array(int(t[2:], 16), np.uint64)
        return bits.view(np.float64).astype(ty)
    v = int(t, 0)
    if ty.kind == "f":
        return np.array(v, ty)
    if ty == np.dtype(bool):
        return np.array(bool(v))
    return np.array(v & ((1 << 8 * ty.itemsize) - 1), UNSIGNED[ty.itemsize]).view(ty)
