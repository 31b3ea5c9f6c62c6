"""Compiling kernels/*.cu to cubin with NVRTC (no nvcc, no GPU needed).

Options are fixed (``compile_options``) and carry no path or time, the program is named by
its file name, and headers (kernels/*.cuh) are passed in memory, so the same source and arch
give the same cubin bytes on any machine with the same NVRTC. ``--ptxas-options=-v`` puts
ptxas' resource report into the program log; ``parse_resources`` reads it per kernel.
"""
from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from toolcall.common.errors import BuildError
from toolcall.kernels.cubin import instructions
from toolcall.kernels.cuda_source import KERNEL_DIR, kernel_headers, kernel_sources
from toolcall.kernels.declarations import declarations
from toolcall.kernels.targets import check_arch

_cache: dict[tuple[str, str], "CompiledKernel"] = {}
_cache_lock = threading.Lock()


@dataclass(frozen=True)
class CompiledKernel:
    """One .cu file compiled for one arch. ``resources``: kernel function -> {registers,
    spill_stores, spill_loads, stack_bytes, shared_bytes} (bytes, per thread / per block)."""

    name: str
    arch: str
    cubin: bytes
    log: str
    resources: dict[str, dict[str, int]] = field(default_factory=dict)
    source_sha256: str = ""

    @property
    def file_name(self) -> str:
        return f"{self.name}.cubin"


def include_dir() -> str:
    """The CUDA headers of the nvidia-cuda-runtime wheel (cuda_fp8.h, cuda_fp4.h, ...)."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory
        found = find_nvidia_header_directory("cudart")
    except Exception as e:  # pathfinder raises its own types for a broken install
        found, why = None, f"{type(e).__name__}: {e}"
    else:
        why = "cuda.pathfinder found no cudart headers"
    if not found or not (Path(found) / "cuda_fp8.h").is_file():
        raise BuildError("kernel_compile_failed", f"CUDA headers (cuda_fp8.h) not found ({why}); "
                         "GPU targets need the gpu extra: pip install 'toolcall-engine[gpu]'", reason=why)
    return str(found)


def compile_options(arch: str) -> list[bytes]:
    """The fixed NVRTC options for ``arch``: no debug info, no line info, no paths but -I."""
    return [f"--gpu-architecture={check_arch(arch)}".encode(), b"-std=c++17", b"-default-device",
            b"--ptxas-options=-v", f"-I{include_dir()}".encode()]


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except Exception as e:  # ImportError, or the NVRTC library missing when first loaded
        raise BuildError("kernel_compile_failed", f"NVRTC unavailable ({type(e).__name__}: {e}); "
                         "GPU targets need the gpu extra: pip install 'toolcall-engine[gpu]'") from None
    return nvrtc


def _check(nvrtc, result, call: str, name: str, log: str = ""):
    """Unpacks an NVRTC result tuple; BuildError naming the call if it failed."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise BuildError("kernel_compile_failed", f"{call} failed for {name}: {err!r}"
                         + (f"\n{log}" if log else ""), call=call, kernel=name, result=int(err), log=log)
    return values[0] if len(values) == 1 else values


def compute_target(arch: str) -> str:
    """The virtual architecture NVRTC writes PTX for, for ``arch`` (sm_100a -> compute_100a)."""
    return "compute_" + check_arch(arch)[3:]


def _run_nvrtc(source: bytes, name: str, arch: str, opts: list[bytes], headers: dict[str, bytes],
               output: str) -> tuple[bytes, str]:
    """(the program's ``output``, ``PTX`` or ``CUBIN``, and the compiler log) of ``source`` compiled as program
    ``name``.cu with ``opts``; ``BuildError`` with the log if NVRTC refuses it."""
    nvrtc = _nvrtc()
    prog = _check(nvrtc, nvrtc.nvrtcCreateProgram(source, f"{name}.cu".encode(), len(headers),
                                                  list(headers.values()), [h.encode() for h in headers]),
                  "nvrtcCreateProgram", name)
    try:
        result = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize", name)
        buf = bytearray(size)  # NVRTC writes into it: never an immutable bytes (b" " * 1 is the shared b" ")
        _check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog", name)
        log = bytes(buf).rstrip(b"\x00").decode(errors="replace")
        if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise BuildError("kernel_compile_failed", f"{name}.cu does not compile for {arch}:\n{log}",
                             kernel=name, arch=arch, log=log, result=int(result[0]))
        size = _check(nvrtc, getattr(nvrtc, f"nvrtcGet{output}Size")(prog), f"nvrtcGet{output}Size", name)
        out = bytearray(size)
        _check(nvrtc, getattr(nvrtc, f"nvrtcGet{output}")(prog, out), f"nvrtcGet{output}", name)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return bytes(out), log


def compile_ptx(source: bytes, name: str, arch: str, headers: dict[str, bytes] | None = None) -> str:
    """The PTX of CUDA C++ ``source`` (program ``name``.cu) for ``arch``'s virtual architecture, with line info
    (the PTX executor names source lines); ``headers`` default to kernels/*.cuh. ``BuildError`` with the log."""
    opts = [f"--gpu-architecture={compute_target(arch)}".encode(), b"-std=c++17", b"-default-device", b"-lineinfo",
            f"-I{include_dir()}".encode()]
    ptx, _ = _run_nvrtc(source, name, arch, opts, kernel_headers() if headers is None else headers, "PTX")
    return ptx.rstrip(b"\x00").decode()


def compile_source(source: bytes, name: str, arch: str) -> CompiledKernel:
    """Compiles CUDA C++ ``source`` (program ``name``.cu) for ``arch``; ``BuildError`` with the
    compiler log on failure."""
    cubin, log = _run_nvrtc(source, name, arch, compile_options(arch), kernel_headers(), "CUBIN")
    resources = parse_resources(log)
    for fn, count in instructions(bytes(cubin)).items():
        if fn in resources:
            resources[fn]["instructions"] = count
    return CompiledKernel(name, arch, bytes(cubin), log, resources, hashlib.sha256(source).hexdigest())


def compile_kernel(cu: str | Path, arch: str, *, use_cache: bool = True) -> CompiledKernel:
    """Compiles one kernel file (a path, or a name in kernels/ with or without ``.cu``).

    Results are cached per (source + headers hash, arch) for the process; ``use_cache=False``
    always runs NVRTC.
    """
    path = Path(cu)
    if not path.suffix:
        path = path.with_suffix(".cu")
    if not path.is_absolute() and not path.exists():
        path = KERNEL_DIR / path.name
    try:
        source = path.read_bytes()
    except OSError as e:
        raise BuildError("kernel_compile_failed", f"cannot read kernel source {path}: {e.strerror}",
                         path=str(path)) from None
    digest = hashlib.sha256(source + b"".join(kernel_headers().values())).hexdigest()
    key = (digest, arch)
    if use_cache:
        with _cache_lock:
            if key in _cache:
                return _cache[key]
    compiled = compile_source(source, path.stem, arch)
    if use_cache:
        with _cache_lock:
            _cache[key] = compiled
    return compiled


def compile_all(arch: str) -> list[CompiledKernel]:
    """Every kernels/*.cu compiled for ``arch``, in file-name order, each cubin checked to hold exactly the
    entry points declared for its file (kernels/declarations.py). (Sequential: NVRTC calls hold the GIL,
    and worker processes measured slower than one loop.)"""
    check_arch(arch)
    compiled = [compile_kernel(p, arch) for p in kernel_sources()]
    for k in compiled:
        declared = sorted(d.name for d in declarations().values() if d.file == k.name)
        if sorted(k.resources) != declared:
            raise BuildError("kernel_compile_failed", f"{k.name}.cu for {arch}: the cubin holds {sorted(k.resources)}, "
                             f"the declarations {declared}", kernel=k.name, arch=arch)
    return compiled


# ptxas -v report, per entry function:
#   ptxas info    : Compiling entry function 'fp8_e4m3_matvec' for 'sm_90'
#   ptxas info    : Function properties for fp8_e4m3_matvec
#   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
#   ptxas info    : Used 40 registers, used 1 barriers, 41024 bytes smem, ...
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_resources(log: str) -> dict[str, dict[str, int]]:
    """Per entry function: registers, spill_stores, spill_loads, stack_bytes, shared_bytes."""
    out: dict[str, dict[str, int]] = {}
    entry = props = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            out[entry] = {"registers": 0, "spill_stores": 0, "spill_loads": 0,
                          "stack_bytes": 0, "shared_bytes": 0}
        elif m := _PROPS.search(line):
            props = m.group(1)
        elif (m := _FRAME.search(line)) and entry is not None and props == entry:
            out[entry].update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                              spill_loads=int(m.group(3)))
        elif (m := _USED.search(line)) and entry is not None:
            out[entry]["registers"] = int(m.group(1))
            if s := _SMEM.search(line):
                out[entry]["shared_bytes"] = int(s.group(1))
            entry = props = None
    return out


def resource_table(kernels: list[CompiledKernel]) -> str:
    """A text table: one line per kernel function (registers, spills, stack, shared bytes, instructions)."""
    lines = [f"{'arch':7} {'file':19} {'function':26} {'regs':>4} {'spill st':>8} {'spill ld':>8} "
             f"{'stack':>5} {'smem':>6} {'instr':>6}"]
    for k in kernels:
        for fn, r in sorted(k.resources.items()):
            lines.append(f"{k.arch:7} {k.name:19} {fn:26} {r['registers']:4} {r['spill_stores']:8} "
                         f"{r['spill_loads']:8} {r['stack_bytes']:5} {r['shared_bytes']:6} {r.get('instructions', 0):6}")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m toolcall.kernels.nvrtc_build sm_90 [sm_100 ...]: the table
    import sys
    for a in sys.argv[1:] or ["sm_90"]:
        print(resource_table(compile_all(a)))
