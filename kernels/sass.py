"""SASS statistics of compiled kernels, read with the CUDA disassembler (``nvdisasm`` from the
nvidia-cuda-nvdisasm wheel, in the test extra; found through cuda.pathfinder).

Per kernel function of a cubin: its instruction count, global loads by width (the share that are 128-bit
vectors: how much a lane keeps in flight per load), local-memory instructions (LDL/STL: spills or arrays
the compiler could not keep in registers), tensor-core instructions (HMMA and the other MMA families) and
fused multiply-adds (FFMA: none may appear where a kernel must round every product and sum on its own,
as sample_draw.cu does to draw what the CPU draws).
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from toolcall.common.errors import BuildError

SECTION = re.compile(r"^\s*\.section\s+\.text\.(\w+),")
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")
MMA_PREFIXES = ("HMMA", "IMMA", "QMMA", "OMMA", "HGMMA", "IGMMA", "QGMMA", "UTCHMMA", "UTCQMMA", "UTCOMMA")


@dataclass(frozen=True)
class SassStats:
    """One kernel function's SASS counts."""

    instructions: int
    global_loads: int
    global_loads_128: int
    local_memory: int  # LDL + STL
    mma: int
    ffma: int
    e2m1_cvt: int = 0  # F2FP.F16.E2M1...: hardware e2m1 -> fp16 conversions (sm_100a / sm_120a)

    @property
    def share_128(self) -> float:
        """Share of global loads that are 128-bit (0 where the function loads nothing from global memory)."""
        return self.global_loads_128 / self.global_loads if self.global_loads else 0.0


def nvdisasm() -> Path | None:
    """The disassembler's path, or None where the wheel is not installed."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
    except ImportError:
        return None
    found = find_nvidia_binary_utility("nvdisasm")
    return Path(found) if found else None


def disassemble(cubin: bytes) -> str:
    """nvdisasm's listing of ``cubin``; BuildError("kernel_compile_failed") where it cannot run."""
    tool = nvdisasm()
    if tool is None:
        raise BuildError("kernel_compile_failed", "nvdisasm not found: install the test extra "
                         "(pip install -e '.[test]': nvidia-cuda-nvdisasm)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        done = subprocess.run([str(tool), "-c", fh.name], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise BuildError("kernel_compile_failed", f"nvdisasm failed ({done.returncode}): {done.stderr.strip()[:500]}",
                         returncode=done.returncode)
    return done.stdout


def opcodes(listing: str) -> dict[str, list[str]]:
    """Each function's opcodes (predicates dropped, modifiers kept: "LDG.E.128"), in listing order."""
    out: dict[str, list[str]] = {}
    current = None
    for line in listing.splitlines():
        section = SECTION.match(line)
        if section:
            current = out.setdefault(section.group(1), [])
            continue
        op = INSTRUCTION.match(line)
        if op and current is not None:
            current.append(op.group(1))
    return out


def stats(ops: list[str]) -> SassStats:
    loads = [op for op in ops if op.startswith("LDG")]
    return SassStats(instructions=len(ops), global_loads=len(loads),
                     global_loads_128=sum(".128" in op for op in loads),
                     local_memory=sum(op.startswith(("LDL", "STL")) for op in ops),
                     mma=sum(op.startswith(MMA_PREFIXES) for op in ops), ffma=sum(op.startswith("FFMA") for op in ops),
                     e2m1_cvt=sum(op.startswith("F2FP") and ".E2M1" in op for op in ops))


def sass_stats(cubin: bytes) -> dict[str, SassStats]:
    """SassStats per kernel function of ``cubin``."""
    return {fn: stats(ops) for fn, ops in opcodes(disassemble(cubin)).items()}


def sass_stats_all(cubins: list[bytes]) -> dict[str, SassStats]:
    """SassStats per kernel function of every cubin, the disassembler run on them side by side (one process a
    cubin, as many at once as this process may use CPUs)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
        return {fn: s for found in pool.map(sass_stats, cubins) for fn, s in found.items()}


def sass_table(rows: dict[str, SassStats]) -> str:
    """A text table: one line per function (instructions, global loads, 128-bit share, local, MMA, FFMA, e2m1
    conversions)."""
    lines = [f"{'function':26} {'instr':>6} {'ldg':>5} {'128b':>5} {'local':>5} {'mma':>4} {'ffma':>5} {'e2m1':>5}"]
    for fn, s in sorted(rows.items()):
        lines.append(f"{fn:26} {s.instructions:6} {s.global_loads:5} {s.share_128:5.2f} {s.local_memory:5} "
                     f"{s.mma:4} {s.ffma:5} {s.e2m1_cvt:5}")
    return "\n".join(lines)
