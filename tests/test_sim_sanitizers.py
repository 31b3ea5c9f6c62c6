"""The executor's sanitizers on small CUDA kernels written to break one rule each (compiled by NVRTC with line info):
every finding names its kind, the kernel, the source line, the block and the thread; the same kernels written
correctly pass. The project's own kernels broken on purpose: tests/test_sim_mutations.py."""
from __future__ import annotations

import numpy as np
import pytest

from toolcall.kernels.nvrtc_build import compile_ptx
from toolcall.kernels.sim.errors import SimFault
from toolcall.kernels.sim.executor import LaunchSpec, run_launch
from toolcall.kernels.sim.memory import GlobalMemory
from toolcall.kernels.sim.program import Program
from toolcall.kernels.sim.ptx_parse import parse_module

HEADER = 'extern "C" __global__ void k(float* a, int n, int* flag) {\n'
# (name, body, grid, block, the finding, its source line in the body (1-based, after the header))
BROKEN = [
    ("read past the allocation", "a[threadIdx.x + n] = 1.f;", 1, 64, "out_of_bounds", 1),
    ("misaligned vector load", "float4 v = *reinterpret_cast<float4*>(a + 1 + threadIdx.x * 4);\n"
     "a[threadIdx.x] = v.x + v.y + v.z + v.w;", 1, 4, "misaligned", 1),
    ("shared read before any write", "__shared__ float s[64];\nif (threadIdx.x < 32) s[threadIdx.x] = 1.f;\n"
     "__syncthreads();\na[threadIdx.x] = s[63 - threadIdx.x];", 1, 64, "uninitialized", 4),
    ("shared written and read with no barrier", "__shared__ float s[64];\ns[threadIdx.x] = a[threadIdx.x];\n"
     "a[threadIdx.x] = s[(threadIdx.x + 32) % 64];", 1, 64, "race", 3),
    ("a barrier half the block skips", "__shared__ float s[64];\ns[threadIdx.x] = 1.f;\n"
     "if (threadIdx.x < 32) __syncthreads();\na[threadIdx.x] = s[threadIdx.x];", 1, 64, "sync", 3),
    ("a shuffle whose mask names lanes that do not run it", "float v = a[threadIdx.x];\n"
     "if (threadIdx.x < 16) v += __shfl_xor_sync(0xffffffffu, v, 1);\na[threadIdx.x] = v;", 1, 32, "sync", 2),
    ("the block that counts last decides the result", "__shared__ int last;\nif (threadIdx.x == 0) "
     "last = atomicAdd(flag, 1);\n__syncthreads();\nif (threadIdx.x == 0 && last == gridDim.x - 1) a[0] = blockIdx.x;",
     8, 32, "order", 0),
]
CORRECT = [
    ("in bounds", "if (threadIdx.x < n) a[threadIdx.x] = 1.f;", 1, 64),
    ("barrier between shared write and read", "__shared__ float s[64];\ns[threadIdx.x] = a[threadIdx.x];\n"
     "__syncthreads();\na[threadIdx.x] = s[(threadIdx.x + 32) % 64];", 1, 64),
    ("syncwarp between a warp's shared write and read", "__shared__ float s[32];\ns[threadIdx.x] = a[threadIdx.x];\n"
     "__syncwarp();\na[threadIdx.x] = s[31 - threadIdx.x];", 1, 32),
    ("a full-warp shuffle", "float v = a[threadIdx.x];\nv += __shfl_xor_sync(0xffffffffu, v, 1);\na[threadIdx.x] = v;",
     1, 32),
    ("the last block merges what every block wrote", "__shared__ int last;\na[1 + blockIdx.x] = blockIdx.x;\n"
     "__threadfence();\nif (threadIdx.x == 0) last = atomicAdd(flag, 1);\n__syncthreads();\n"
     "if (threadIdx.x == 0 && last == gridDim.x - 1) { float t = 0; for (int b = 0; b < gridDim.x; ++b) "
     "t += ((volatile float*)a)[1 + b]; a[0] = t; }", 8, 32),
]


def launch(body: str, grid: int, block: int, seed: int = 0) -> np.ndarray:
    module = parse_module(compile_ptx((HEADER + body + "\n}\n").encode(), "probe", "sm_90"))
    prog = Program(module.functions["k"], module)
    memory = GlobalMemory()
    a = memory.alloc(64 * 4, "a")
    memory.host_view(a, 256).view(np.float32)[:] = np.arange(64, dtype=np.float32)
    flag = memory.alloc(4, "flag")
    params = np.zeros(prog.param_bytes, np.uint8)
    for (name, _), value in zip(prog.fn.params, (np.uint64(a), np.int32(64), np.uint64(flag))):
        at = prog.param_offsets[name]
        params[at:at + value.nbytes] = np.array([value]).view(np.uint8)
    run_launch(prog, LaunchSpec((grid, 1, 1), (block, 1, 1), params, memory, seed=seed))
    return memory.host_view(a, 256).view(np.float32).copy()


@pytest.mark.parametrize("name,body,grid,block,kind,line", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_kernel_is_named_with_its_finding(name, body, grid, block, kind, line):
    if kind == "order":  # two seeds (block and atomic order), two results
        assert not np.array_equal(launch(body, grid, block, seed=1), launch(body, grid, block, seed=2))
        return
    with pytest.raises(SimFault) as e:
        launch(body, grid, block)
    assert e.value.kind == kind
    assert e.value.details["kernel"] == "k" and e.value.details["loc"] == f"probe.cu:{line + 1}"
    assert "block (" in e.value.what and " thread " in e.value.what


@pytest.mark.parametrize("name,body,grid,block", CORRECT, ids=[c[0] for c in CORRECT])
def test_the_same_kernels_written_correctly_pass(name, body, grid, block):
    assert np.array_equal(launch(body, grid, block, seed=1), launch(body, grid, block, seed=2))
