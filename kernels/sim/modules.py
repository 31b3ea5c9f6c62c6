"""PTX modules for the executor: kernels/*.cu (or a copy of them in another folder) compiled by NVRTC to
PTX for a target's virtual architecture, parsed once and cached by (source and headers hash, arch).

Each entry function compiles to a ``Program`` once (``program``); a module's ``.global`` variables are placed in a
device's memory when the module is loaded on it, and a Program finds them through its launch.
"""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from toolcall.kernels.cuda_source import KERNEL_DIR
from toolcall.kernels.nvrtc_build import compile_ptx
from toolcall.kernels.sim.program import Program
from toolcall.kernels.sim.ptx_parse import Module, parse_module

_cache: dict[tuple[str, str], Module] = {}
_lock = threading.Lock()


def kernel_folder_sources(kernels_dir: Path | None) -> tuple[Path, dict[str, bytes]]:
    """(folder, its *.cuh by name): kernels/ itself, or a changed copy of it."""
    folder = Path(kernels_dir) if kernels_dir else KERNEL_DIR
    return folder, {p.name: p.read_bytes() for p in sorted(folder.glob("*.cuh"))}


def ptx_module(file: str, arch: str, kernels_dir: Path | None = None) -> Module:
    """The parsed PTX of ``file``.cu (a kernels/ file stem) for ``arch``, from ``kernels_dir`` if given."""
    folder, headers = kernel_folder_sources(kernels_dir)
    source = (folder / f"{file}.cu").read_bytes()
    key = (hashlib.sha256(source + b"".join(headers.values())).hexdigest(), arch)
    with _lock:
        if key in _cache:
            return _cache[key]
    module = parse_module(compile_ptx(source, file, arch, headers))
    with _lock:
        _cache[key] = module
    return module


_programs: dict[tuple[int, str], Program] = {}


def program(module: Module, name: str) -> Program:
    """The compiled entry function ``name`` of ``module`` (a cached module: compiled once a process)."""
    key = (id(module), name)
    with _lock:
        if key not in _programs:
            _programs[key] = Program(module.functions[name], module)
        return _programs[key]
