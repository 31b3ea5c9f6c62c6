"""PTX text (what NVRTC emits for kernels/*.cu) parsed into entry functions of instructions.

Only the subset NVRTC writes for this project is read: module-level ``.shared`` / ``.global`` /
``.const`` variables, ``.entry`` functions with ``.param`` lists, ``.reg`` / ``.local`` / ``.shared``
declarations, labels, ``.loc`` line info and instructions (optionally guarded, ``@%p`` / ``@!%p``).
Inline-asm scopes ``{ .reg .b64 %tmp; ... }`` get their registers renamed apart. Anything else is a
``SimUnsupported`` naming the PTX line, never skipped.

Operands are small tuples: ``("reg", name)``, ``("imm", text)``, ``("sreg", "%tid.x")``, ``("sym", name)``,
``("vec", (operand, ...))``, ``("mem", base, offset)`` (base a register or a symbol), ``("label", name)``,
``("sink",)`` for ``_``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from toolcall.kernels.sim.errors import SimUnsupported

_DTYPE_BYTES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2, "b32": 4, "u32": 4,
                "s32": 4, "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8, "pred": 1, "f16x2": 4, "bf16x2": 4}
SPECIAL_REGISTERS = re.compile(r"%(tid|ntid|ctaid|nctaid)\.[xyz]$|%laneid$|%warpid$")


@dataclass(frozen=True)
class Instr:
    """One instruction: ``op`` (``fma.rn.f32``), ``operands``, ``guard`` ((predicate register, negated) or None),
    ``line`` (PTX line number) and ``loc`` (the ``.loc`` text: source file, line, inlined-at chain)."""

    op: str
    operands: tuple
    guard: tuple[str, bool] | None
    line: int
    loc: str


@dataclass(frozen=True)
class Variable:
    """A ``.shared`` / ``.global`` / ``.const`` / ``.local`` array: bytes, alignment, initial bytes (or None),
    ``extern`` for dynamic shared memory (size 0 here, the launch gives it)."""

    name: str
    space: str
    size: int
    align: int
    init: bytes | None = None
    extern: bool = False


@dataclass
class Function:
    """An ``.entry``: parameters in order (name, bytes), registers by name (PTX type), local/shared variables,
    instructions, labels -> instruction index, and ``.maxntid``."""

    name: str
    params: list[tuple[str, int]] = field(default_factory=list)
    registers: dict[str, str] = field(default_factory=dict)
    variables: list[Variable] = field(default_factory=list)
    instructions: list[Instr] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)
    max_threads: int | None = None


@dataclass
class Module:
    """A parsed PTX module: its ``.target``, module-level variables and entry functions by name."""

    target: str
    files: dict[int, str]
    variables: list[Variable]
    functions: dict[str, Function]


_VAR = re.compile(r"^(?:\.(extern|visible|weak)\s+)*\.(shared|global|const|local)\s+(?:\.align\s+(\d+)\s+)?"
                  r"\.(\w+)\s+([\w$]+)\s*(?:\[(\d*)\])?\s*(?:=\s*(.*))?$", re.S)
_REG_DECL = re.compile(r"^\.reg\s+\.(\w+)\s+(.+)$")
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+(?:\.ptr\s+(?:\.(?:global|shared|const|local)\s+)?"
                    r"(?:\.align\s+\d+\s+)?)?([\w$]+)(?:\[(\d+)\])?")


def _statements(text: str):
    """(line number, statement) pairs: comments dropped, ``;``-terminated statements joined across lines,
    braces, labels and directives as their own statements."""
    buf, start, header = [], 0, None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("//", 1)[0].strip()
        if header is None and re.match(r"^(\.visible\s+|\.weak\s+)?\.entry\b", line):
            header = (number, [])
        if header is not None:  # an entry's header, up to its closing parenthesis
            header[1].append(line)
            if ")" in line:
                yield header[0], " ".join(header[1])
                header = None
            continue
        while line:
            if not buf and line[0] in "{}":
                yield number, line[0]
                line = line[1:].strip()
                continue
            if not buf and (m := re.match(r"^([\w$]+):", line)):
                yield number, m.group(0)
                line = line[m.end():].strip()
                continue
            if not buf and re.match(r"\.(loc|file|pragma|maxntid|reqntid|minnctapersm|maxnreg|version|target|"
                                    r"address_size|section)\b", line):
                yield number, line.rstrip(";")
                break
            if not buf:
                start = number
            semi = line.find(";")
            if semi < 0:
                buf.append(line)
                break
            buf.append(line[:semi])
            yield start, " ".join(buf).strip()
            buf = []
            line = line[semi + 1:].strip()
    if buf:
        yield start, " ".join(buf)


def _split_operands(text: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def operand(text: str, rename: dict[str, str]) -> tuple:
    """One operand's tuple (see the module docstring)."""
    t = text.strip()
    if t in rename:  # an inline-asm scope's register (NVRTC names some without %: `low`, `high`)
        return ("reg", rename[t])
    if t.startswith("{"):
        return ("vec", tuple(operand(x, rename) for x in _split_operands(t[1:-1])))
    if t.startswith("["):
        inner = t[1:-1].replace(" ", "")
        m = re.fullmatch(r"([%\w$.]+?)(?:\+(-?(?:0x[0-9a-fA-F]+|\d+)))?", inner)
        if not m:
            raise SimUnsupported(f"address operand {t!r}")
        base = rename.get(m.group(1), m.group(1))
        return ("mem", base, int(m.group(2), 0) if m.group(2) else 0)
    if t == "_":
        return ("sink",)
    if "|" in t:  # shfl's d|p
        a, b = t.split("|")
        return ("vec", (operand(a, rename), operand(b, rename)))
    if SPECIAL_REGISTERS.match(t):
        return ("sreg", t)
    if t.startswith("%"):
        return ("reg", rename.get(t, t))
    if re.fullmatch(r"-?(?:0[xX][0-9a-fA-F]+|\d+)U?|0[fF][0-9a-fA-F]{8}|0[dD][0-9a-fA-F]{16}", t):
        return ("imm", t)
    if re.fullmatch(r"[\w$]+", t):
        return ("sym", t)
    raise SimUnsupported(f"operand {t!r}")


def _register_names(spec: str) -> list[str]:
    names = []
    for part in (p.strip() for p in spec.split(",")):
        m = re.fullmatch(r"(%[\w$]+)<(\d+)>", part)
        names.extend([f"{m.group(1)}{i}" for i in range(int(m.group(2)))] if m else [part])
    return names


def _variable(stmt: str) -> Variable | None:
    m = _VAR.match(stmt)
    if not m:
        return None
    ext, space, align, ty, name, count, init = m.groups()
    size = _DTYPE_BYTES[ty] * (int(count) if count else (0 if count == "" else 1))
    data = None
    if init is not None:
        values = [int(v, 0) for v in re.findall(r"-?(?:0x[0-9a-fA-F]+|\d+)", init)]
        width = _DTYPE_BYTES[ty]
        data = b"".join((v & ((1 << 8 * width) - 1)).to_bytes(width, "little") for v in values)
        data = data.ljust(size, b"\0")
    return Variable(name, space, size, int(align or _DTYPE_BYTES[ty]), data, ext == "extern" or count == "")


def parse_module(text: str) -> Module:
    """The module's entry functions and variables; ``SimUnsupported`` naming the line of anything unread."""
    text = re.split(r"^\s*\.section\b", text, maxsplit=1, flags=re.M)[0]  # debug sections: line info only
    files = {int(n): path.rsplit("/", 1)[-1] for n, path in re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', text, re.M)}
    target, variables, functions = "", [], {}
    fn: Function | None = None
    loc, depth, scopes, header = "", 0, [], None
    for number, stmt in _statements(text):
        try:
            if header is not None:  # inside `.entry name( ... )`, until the body's `{`
                if stmt == "{":
                    fn = _header(header)
                    functions[fn.name] = fn
                    header, depth, scopes = None, 1, [{}]
                else:
                    header += " " + stmt
                    if m := re.search(r"\.maxntid\s+(\d+)", stmt):
                        header += f" @maxntid {m.group(1)}"
                continue
            if fn is None:
                if stmt.startswith(".target"):
                    target = stmt.split()[1].rstrip(",")
                elif stmt.startswith(".file"):
                    pass
                elif re.match(r"^(\.visible\s+|\.weak\s+)?\.entry\b", stmt):
                    header = stmt
                elif stmt.startswith(".extern .func") or stmt.startswith((".version", ".address_size")):
                    pass
                elif (var := _variable(stmt)) is not None:
                    variables.append(var)
                elif stmt in ("{", "}"):
                    raise SimUnsupported("a brace outside a function")
                else:
                    raise SimUnsupported(f"module-level statement {stmt[:60]!r}")
                continue
            if stmt == "{":
                depth += 1
                scopes.append({})
            elif stmt == "}":
                depth -= 1
                scopes.pop()
                if depth == 0:
                    fn = None
            elif re.match(r"\.loc\b", stmt):
                loc = _loc(stmt, files)
            elif stmt.startswith((".pragma", ".maxntid", ".reqntid", ".minnctapersm", ".maxnreg")):
                pass
            elif stmt.endswith(":"):
                fn.labels[stmt[:-1]] = len(fn.instructions)
            elif m := _REG_DECL.match(stmt):
                for name in _register_names(m.group(2)):
                    unique = name if depth == 1 else f"{name}@{number}"
                    if depth > 1:
                        scopes[-1][name] = unique
                    fn.registers[unique] = m.group(1)
            elif stmt.startswith(".param"):  # a call's argument slot
                m = _PARAM.match(stmt)
                fn.variables.append(Variable(m.group(2), "param", _DTYPE_BYTES[m.group(1)], 8))
            elif (var := _variable(stmt)) is not None:
                fn.variables.append(var)
            else:
                rename = {k: v for s in scopes[1:] for k, v in s.items()}  # the entry's own scope keeps its names
                fn.instructions.append(_instruction(stmt, number, loc, rename))
        except SimUnsupported as e:
            raise SimUnsupported(f"PTX line {number}: {e.message}", line=number) from None
    return Module(target, files, variables, functions)


def _header(header: str) -> Function:
    m = re.match(r"^(?:\.\w+\s+)*\.entry\s+([\w$]+)\s*\((.*)\)", header, re.S)
    if not m:
        raise SimUnsupported(f"entry header {header[:60]!r}")
    fn = Function(m.group(1))
    for pm in _PARAM.finditer(m.group(2)):
        fn.params.append((pm.group(2), _DTYPE_BYTES[pm.group(1)] * int(pm.group(3) or 1)))
    if mt := re.search(r"@maxntid (\d+)", header):
        fn.max_threads = int(mt.group(1))
    return fn


def _loc(stmt: str, files: dict[int, str]) -> str:
    """``.loc 2 121 5, function_name ..., inlined_at 1 29 5`` -> ``matvec.cuh:121 (inlined at rmsnorm.cu:29)``."""
    m = re.match(r"\.loc\s+(\d+)\s+(\d+)", stmt)
    where = f"{files.get(int(m.group(1)), m.group(1))}:{m.group(2)}"
    if at := re.search(r"inlined_at\s+(\d+)\s+(\d+)", stmt):
        where += f" (inlined at {files.get(int(at.group(1)), at.group(1))}:{at.group(2)})"
    return where


def _instruction(stmt: str, number: int, loc: str, rename: dict[str, str]) -> Instr:
    guard = None
    if m := re.match(r"^@(!?)(%[\w$]+)\s+", stmt):
        guard = (rename.get(m.group(2), m.group(2)), m.group(1) == "!")
        stmt = stmt[m.end():]
    parts = stmt.split(None, 1)
    op = parts[0]
    rest = parts[1] if len(parts) > 1 else ""
    if op == "call.uni" or op == "call":
        m = re.match(r"^(?:\(([^)]*)\)\s*,\s*)?([\w$]+)\s*,?\s*(?:\((.*)\))?$", rest.strip(), re.S)
        args = tuple(("sym", a.strip()) for a in (m.group(3) or "").split(",") if a.strip())
        return Instr(op, (("sym", m.group(2)),) + args, guard, number, loc)
    return Instr(op, tuple(operand(t, rename) for t in _split_operands(rest)), guard, number, loc)
