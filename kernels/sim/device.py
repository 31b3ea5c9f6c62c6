"""``SimGpu``: the Gpu interface of toolcall.kernels.launch on the PTX executor, for kernels/ tests and for a CUDA
backend (``runtime ... --device sim``, runtime/cuda/devices.py).

Memory is the executor's GlobalMemory (allocations bounds-checked on every access), a module is the PTX NVRTC
writes for the device's arch, and a launch runs on the executor at once (a stream is always idle). Options:
``seed`` (block and atomic order; a later launch gets the next seed), ``sanitize`` (racecheck and initcheck,
and every kernel with atomics run under two block orders, its memory after each compared: the cross-block
protocols must not depend on which block came last), ``stats`` (a LaunchStats every launch adds to), ``name``
(what the device reports), ``capacity`` (bytes the allocations may hold, None: unbounded; past it an allocation
is refused as a card refuses it), ``faults`` (kernels/sim/faults.py: errors injected on chosen calls) and
``order_every_launch`` (False: the two-order run only on the first launch of each kernel and launch shape, as a
bundle's serving loop repeats a few shapes thousands of times; each such run copies the heap twice).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from toolcall.kernels.cubin import instructions
from toolcall.kernels.declarations import declaration, declarations
from toolcall.common.errors import CudaError
from toolcall.kernels.launch import DeviceArray, DeviceMemory, Kernel
from toolcall.kernels.nvrtc_build import compile_kernel
from toolcall.kernels.sim.errors import SimFault, SimUnsupported
from toolcall.kernels.sim.faults import Fault, FaultPlan
from toolcall.kernels.sim.executor import LaunchSpec, run_launch
from toolcall.kernels.sim.stats import LaunchStats
from toolcall.kernels.sim.memory import BASE, GlobalMemory
from toolcall.kernels.sim.modules import program, ptx_module
from toolcall.kernels.sim.program import Program
from toolcall.kernels.targets import arch_capability


class SimModule:
    """A PTX module loaded on a SimGpu: its entry functions compiled on first use."""

    def __init__(self, gpu: "SimGpu", file: str):
        self.gpu, self.file = gpu, file
        self.ptx = ptx_module(file, gpu.arch, gpu.kernels_dir)
        for var in self.ptx.variables:
            if var.space in ("global", "const"):
                address = gpu.memory.alloc(max(var.size, 1), f"{file}:{var.name}")
                if var.init:
                    gpu.memory.host_view(address, len(var.init))[:] = np.frombuffer(var.init, np.uint8)
                gpu.module_globals[var.name] = address

    def kernel(self, name: str) -> Kernel:
        if name not in self.ptx.functions:
            raise SimUnsupported(f"{self.file}: no entry function {name!r} in its PTX", kernel=name)
        return Kernel(program(self.ptx, name), declaration(name))


class SimGpu(DeviceMemory):
    """A simulated device of architecture ``arch`` (sm_80, sm_90, sm_100a, sm_120a, ...). ``host_launches``: a
    CUDA backend launches through ``launch`` (no driver calls) and builds graphs with ``graph_builder``."""

    context = None
    host_launches = True

    def __init__(self, arch: str = "sm_90", *, seed: int = 0, sanitize: bool = True, kernels_dir=None,
                 stats: LaunchStats | None = None, name: str | None = None, capacity: int | None = None,
                 faults: tuple[Fault, ...] = (), order_every_launch: bool = True):
        self.arch, self.seed, self.sanitize, self.kernels_dir, self.stats = arch, seed, sanitize, kernels_dir, stats
        self.compute_capability = arch_capability(arch)
        self.name = name or f"simulated {arch}"
        self.capacity = capacity
        self.faults = FaultPlan(faults)
        self.order_every_launch = order_every_launch
        self.order_checked: set[tuple] = set()  # (kernel, grid, block) run under two orders
        self.memory = GlobalMemory()
        self._allocs: dict[int, DeviceArray] = {}
        self.launches = []  # kernels launched to completion, in order
        self.current = None  # the kernel launched last (the one a fault names)
        self.conditionals: dict[int, int] = {}
        self.module_globals: dict[str, int] = {}  # .global variables of the loaded modules -> their addresses
        self.approximate: dict[str, set[str]] = {}  # kernel -> approximate instructions it holds (see Program)

    # ---- memory ----
    @property
    def allocated_bytes(self) -> int:
        """Bytes of the allocations made through ``alloc`` and not freed (modules' own variables aside)."""
        return sum(a.nbytes for a in self._allocs.values())

    def alloc(self, nbytes: int, label: str = "") -> DeviceArray:
        self.faults.call("alloc", f"{nbytes:,} bytes")
        if self.capacity is not None and self.allocated_bytes + nbytes > self.capacity:
            raise CudaError("cuda_error", f"cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY ({nbytes:,} bytes asked with "
                            f"{self.allocated_bytes:,} of the simulated device's {self.capacity:,} in use)",
                            call="cuMemAlloc", error="CUDA_ERROR_OUT_OF_MEMORY", needed=int(nbytes),
                            in_use=self.allocated_bytes, capacity=self.capacity)
        arr = DeviceArray(self.memory.alloc(nbytes, label), int(nbytes))
        self._allocs[arr.ptr] = arr
        return arr

    def zeros(self, nbytes: int) -> DeviceArray:
        return self.alloc(nbytes)

    def copy_in(self, arr: DeviceArray, host: np.ndarray) -> None:
        raw = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        self.faults.call("copy", f"{raw.nbytes:,} bytes in")
        self.check_copy_in(arr, raw.nbytes)
        self.memory.host_view(arr.ptr, raw.nbytes)[:] = raw

    def download(self, arr: DeviceArray, shape, dtype) -> np.ndarray:
        out = np.empty(shape, dtype)
        self.faults.call("copy", f"{out.nbytes:,} bytes out")
        self.check_download(arr, out.nbytes)
        out.reshape(-1).view(np.uint8)[:] = self.memory.host_view(arr.ptr, out.nbytes)
        return out

    def copy_device(self, dst: DeviceArray, src: DeviceArray, nbytes: int) -> None:
        self.faults.call("copy", f"{nbytes:,} bytes on the device")
        self.check_copy_device(dst, src, nbytes)
        self.memory.host_view(dst.ptr, nbytes)[:] = self.memory.host_view(src.ptr, nbytes).copy()

    def free(self, arr: DeviceArray) -> None:
        if self._allocs.pop(arr.ptr, None) is not None:
            self.memory.free(arr.ptr)

    # ---- modules and launches ----
    def load_kernel_file(self, file: str) -> SimModule:
        return SimModule(self, file)

    def load(self, cubin: bytes) -> SimModule:
        """The module of a bundle's cubin: the kernels/*.cu file whose entry points it holds, run as that file's PTX
        for this device's arch (the executor runs PTX, not SASS). That file must compile to this very cubin (NVRTC is
        deterministic): the PTX run is then the bundle's own kernels', not a later checkout's."""
        names = sorted(instructions(cubin))
        files = {declaration(n).file for n in names if n in declarations()}
        if len(files) != 1:
            raise SimUnsupported(f"a cubin with entry points {names} is no single kernels/*.cu file")
        file = files.pop()
        if self.kernels_dir is None and compile_kernel(file, self.arch).cubin != cubin:
            raise SimUnsupported(f"the bundle's kernels/{file}.cubin is not what this checkout's kernels/{file}.cu "
                                 f"compiles to for {self.arch}: the simulated device runs this checkout's PTX, so it "
                                 "checks bundles built from the same kernels; rebuild the bundle with this builder",
                                 kernel_file=file, arch=self.arch)
        return SimModule(self, file)

    def graph_builder(self, model) -> "SimGraphs":
        return SimGraphs(model, self)

    def launch(self, kernel: Kernel, grid, block, args: Mapping[str, object], shared_bytes: int = 0,
               stream=0) -> None:
        _, holders = kernel.pack(args)
        self.faults.call("launch", kernel.name)
        prog: Program = kernel.function
        self.current = kernel.name
        block_params = np.zeros(max(prog.param_bytes, 8), np.uint8)
        for (name, size), h in zip(prog.fn.params, holders):
            at = prog.param_offsets[name]
            block_params[at:at + size] = h.view(np.uint8)[:size]
        grid = (tuple(int(g) for g in grid) + (1, 1))[:3]
        block = (tuple(int(b) for b in block) + (1, 1))[:3]
        def run(seed):
            spec = LaunchSpec(grid, block, block_params, self.memory, shared_bytes, seed, self.sanitize, self.stats,
                              self.module_globals)
            run_launch(prog, spec)
            return spec

        shape = (kernel.name, grid, block)
        if self.sanitize and prog.has_atomics and (self.order_every_launch or shape not in self.order_checked):
            self.order_checked.add(shape)
            before = self.memory.heap.copy()
            first = run(self.seed + 1)
            after = self.memory.heap.copy()
            self.memory.heap[:len(before)] = before
            spec = run(self.seed + 2)
            differ = np.flatnonzero(self.memory.heap[:len(after)] != after)
            if len(differ) or first.conditionals != spec.conditionals:
                where = self.memory.owner(int(differ[0]) + BASE) if len(differ) else "the graph condition"
                raise SimFault("order", f"{kernel.name}: two block / atomic orders left different memory "
                                        f"({len(differ)} bytes; first at {where})", kernel=kernel.name)
        else:
            spec = run(self.seed)
        if self.seed:
            self.seed += 1
        self.conditionals.update(spec.conditionals)
        self.launches.append(kernel.name)
        for op in prog.approximate:
            self.approximate.setdefault(kernel.name, set()).add(op)

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        for arr in list(self._allocs.values()):
            self.free(arr)


class SimGraphs:
    """Graphs on a SimGpu, for a CUDA backend's decode loop: an executable graph is its launch lists; a launch runs
    the top list, then the WHILE body while the condition its kernels set (cudaGraphSetConditional; 1 at each graph
    launch) is non-zero, as the card's conditional node does."""

    HANDLE = 0x5100
    MAX_ITERATIONS = 100_000

    def __init__(self, model, gpu: SimGpu):
        self.m, self.gpu = model, gpu

    def instantiate(self, launches, body=None):
        return list(launches), None if body is None else list(body(self.HANDLE))

    def _run(self, launches) -> None:
        for ln in launches:
            self.gpu.launch(self.m.kernel(ln.fn), *ln.shape, ln.args)

    def launch(self, exe, timeout_s: float) -> float:
        top, body = exe
        self._run(top)
        self.gpu.conditionals[self.HANDLE] = 1
        for _ in range(self.MAX_ITERATIONS):
            if body is None or not self.gpu.conditionals[self.HANDLE]:
                return 0.0
            self._run(body)
        raise SimFault("hang", f"a graph's WHILE loop ran {self.MAX_ITERATIONS} times without its condition cleared")

    def destroy(self, exe) -> None:
        pass

    def close(self) -> None:
        pass
