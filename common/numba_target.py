"""The process-wide numba compile target, set on import, before numba's first compile.

numba makes its LLVM target machine at the first compile of a process and keys its on-disk cache by
that target's CPU name and features. Every module that compiles with numba (the CPU kernels, the
sampling draw, the PTX executor's loops) imports this one first, so whichever compiles first, every function is built for the
same target and every cached entry matches: a process that compiled the draw first would otherwise
key the CPU kernels differently and compile them all again at load (seconds, and ~25 MB of compiler
memory that ``tests/test_cpu_fast.py::test_load_holds_what_the_contract_states`` caught).
"""
from __future__ import annotations

import os

import llvmlite.binding as llvm
import numba


def use_512_bit_vectors() -> None:
    """Compile for this CPU with 512-bit vectors where it has AVX-512.

    LLVM tunes recent Xeons to "prefer 256-bit" vectors; these kernels (integer decode plus a float32
    multiply-add per weight, no frequency-heavy FMA storms) are written for 16-lane float32 vectors
    (runtime/cpu/simd_ir.py), which that preference splits in two. Set before numba's first compile
    (its target machine is made then; the cache key includes the features, so cached code always
    matches). An explicit
    NUMBA_CPU_NAME / NUMBA_CPU_FEATURES in the environment wins. Only speed depends on it: the
    kernels' bits are batch-independent either way.
    """
    if os.environ.get("NUMBA_CPU_NAME") or os.environ.get("NUMBA_CPU_FEATURES"):
        return
    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" not in features.split(","):
        return
    os.environ["NUMBA_CPU_NAME"] = "generic"  # generic tuning with the host features; a named Xeon re-imposes 256-bit
    os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"
    numba.config.reload_config()


use_512_bit_vectors()
