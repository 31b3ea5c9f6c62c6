"""Kernel entry points and their parameter lists, read from the kernels/*.cu sources.

The launcher packs arguments by these kinds, so a call with the wrong number of arguments
or a float where a pointer goes fails on the host with the parameter's name, not on the GPU.
Kinds: ``ptr`` (device pointer; 8 bytes), ``i32``, ``f32``, ``u64`` (a graph conditional handle).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .nvrtc_build import kernel_sources

_ENTRY = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?'
                    r"(\w+)\s*\(([^)]*)\)", re.S)
_SCALARS = {"int": "i32", "float": "f32", "cudaGraphConditionalHandle": "u64", "u64": "u64",
            "unsigned long long": "u64"}


@dataclass(frozen=True)
class KernelSignature:
    """One ``extern "C"`` kernel: its function name, source file stem and (name, kind) params."""

    name: str
    file: str
    params: tuple[tuple[str, str], ...]

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(kind for _, kind in self.params)


def _strip_comments(src: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", src, flags=re.S)


def _param(decl: str, where: str) -> tuple[str, str]:
    decl = " ".join(decl.split())
    m = re.fullmatch(r"(?:const\s+)?([\w\s]+?)\s*(\*?)\s*(\w+)", decl)
    if not m:
        raise ValueError(f"{where}: cannot read kernel parameter {decl!r}")
    ctype, star, name = m.groups()
    if star:
        return name, "ptr"
    if ctype not in _SCALARS:
        raise ValueError(f"{where}: parameter {name!r} has unsupported type {ctype!r}")
    return name, _SCALARS[ctype]


def parse_signatures(source: str, file: str = "<source>") -> dict[str, KernelSignature]:
    """Every ``extern "C" __global__`` function of one CUDA source."""
    out = {}
    for m in _ENTRY.finditer(_strip_comments(source)):
        name, params = m.group(1), m.group(2).strip()
        decls = [p for p in params.split(",") if p.strip()] if params else []
        out[name] = KernelSignature(name, file, tuple(_param(d, f"{file}:{name}") for d in decls))
    return out


@lru_cache(maxsize=1)
def kernel_signatures() -> dict[str, KernelSignature]:
    """Every kernel of every kernels/*.cu, by function name."""
    out: dict[str, KernelSignature] = {}
    for path in kernel_sources():
        out.update(parse_signatures(Path(path).read_text(), Path(path).stem))
    return out
