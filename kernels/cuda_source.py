"""What the CUDA sources declare, read once: entry points with typed parameters, and integer constants.

kernels/*.cu hold the ``extern "C" __global__`` entry points (one cubin per file); kernels/*.cu and
*.cuh hold the ``#define NAME <integer>`` constants (block sizes, tiles, split lengths) the launch
geometry and the layout limits use. Python reads both here instead of mirroring them, so a kernel's
parameters and its launch constants are written once, in its source.

Parameter kinds: ``ptr`` (device pointer; 8 bytes), or the numpy dtype of a scalar: ``int32``, ``float32``,
``uint64`` (a graph conditional handle).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

KERNEL_DIR = Path(__file__).resolve().parent

_ENTRY = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\(([^)]*)\)\s*)?'
                    r"(\w+)\s*\(([^)]*)\)", re.S)
_DEFINE = re.compile(r"^#define\s+(\w+)\s+(\d+)\s*$", re.M)  # integer constants only (not FULL_MASK 0x..u)
_SCALARS = {"int": "int32", "float": "float32", "cudaGraphConditionalHandle": "uint64", "u64": "uint64",
            "unsigned long long": "uint64"}


class Param(NamedTuple):
    """One kernel parameter: its name in the source and its kind (ptr, int32, float32, uint64)."""

    name: str
    kind: str


@dataclass(frozen=True)
class EntryPoint:
    """One ``extern "C"`` kernel: function name, source file stem, parameters, and the first argument of its
    ``__launch_bounds__`` (the block size: a #define name or a number; None without one)."""

    name: str
    file: str
    params: tuple[Param, ...]
    launch_bounds: str | None


def kernel_sources() -> list[Path]:
    """Every kernels/*.cu, sorted by name."""
    return sorted(KERNEL_DIR.glob("*.cu"))


def kernel_headers() -> dict[str, bytes]:
    """kernels/*.cuh by file name: passed to NVRTC in memory for ``#include "x.cuh"``."""
    return {p.name: p.read_bytes() for p in sorted(KERNEL_DIR.glob("*.cuh"))}


def _strip_comments(src: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", src, flags=re.S)


def _param(decl: str, where: str) -> Param:
    decl = " ".join(decl.split())
    m = re.fullmatch(r"(?:const\s+)?([\w\s]+?)\s*(\*?)\s*(\w+)", decl)
    if not m:
        raise ValueError(f"{where}: cannot read kernel parameter {decl!r}")
    ctype, star, name = m.groups()
    if star:
        return Param(name, "ptr")
    if ctype not in _SCALARS:
        raise ValueError(f"{where}: parameter {name!r} has unsupported type {ctype!r}")
    return Param(name, _SCALARS[ctype])


def parse_entry_points(source: str, file: str = "<source>") -> dict[str, EntryPoint]:
    """Every ``extern "C" __global__`` function of one CUDA source."""
    out = {}
    for m in _ENTRY.finditer(_strip_comments(source)):
        bounds, name, params = m.group(1), m.group(2), m.group(3).strip()
        decls = [p for p in params.split(",") if p.strip()] if params else []
        # __launch_bounds__(threads[, min blocks an SM]): the block size is the first argument
        out[name] = EntryPoint(name, file, tuple(_param(d, f"{file}:{name}") for d in decls),
                               bounds.split(",")[0].strip() if bounds else None)
    return out


def parse_defines(sources: dict[str, str]) -> dict[str, int]:
    """``#define NAME <integer>`` of every source (file name -> text); a name defined twice must agree."""
    out: dict[str, int] = {}
    where: dict[str, str] = {}
    for file, text in sources.items():
        for name, value in _DEFINE.findall(text):
            if out.setdefault(name, int(value)) != int(value):
                raise ValueError(f"#define {name} is {out[name]} in {where[name]} but {value} in {file}")
            where.setdefault(name, file)
    return out


@lru_cache(maxsize=1)
def entry_points() -> dict[str, EntryPoint]:
    """Every kernel of every kernels/*.cu, by function name (a name in two files is an error)."""
    out: dict[str, EntryPoint] = {}
    for path in kernel_sources():
        for name, entry in parse_entry_points(path.read_text(), path.stem).items():
            if name in out:
                raise ValueError(f"kernel {name} is defined in {out[name].file}.cu and {path.name}")
            out[name] = entry
    return out


@lru_cache(maxsize=1)
def defines() -> dict[str, int]:
    """The integer #define constants of kernels/*.cu and *.cuh, by name."""
    paths = kernel_sources() + sorted(KERNEL_DIR.glob("*.cuh"))
    return parse_defines({p.name: p.read_text() for p in paths})
