"""Running kernels by name with numpy in and out: parity tests and host-driven cross-checks.

``KernelRunner(gpu)`` compiles each kernels/*.cu once for the device's arch, launches with the
shape its declaration gives (toolcall.kernels.declarations), uploads numpy arguments and downloads
the ``Out`` ones. Arguments are named as the kernel's parameters. ``DryRunGpu`` stands in for a
device on machines without one: launches only pack their arguments (names and kinds checked
against the declaration), downloads are zeros, so a launch sequence can be checked in CPU-only
CI. ``run_while_graph`` builds and runs a graph whose single WHILE conditional node loops over a
body of kernel launches.
"""
from __future__ import annotations

import time

import numpy as np

from toolcall.common.errors import CudaError
from toolcall.kernels.declarations import Launch, declaration
from toolcall.kernels.graph_nodes import add_kernel_node, add_while_node
from toolcall.kernels.launch import DeviceArray, Kernel, check

WHILE_TIMEOUT_S = 30.0  # run_while_graph's default wait for the loop to end


class Out:
    """A kernel argument uploaded before the launch and downloaded after it."""

    def __init__(self, init: np.ndarray):
        self.init = np.ascontiguousarray(init)


class KernelRunner:
    """Kernels by name on ``gpu`` (a launch.Gpu or a DryRunGpu). ``close``/``same`` assert
    agreement, and do nothing on a dry run (its results are zeros)."""

    def __init__(self, gpu):
        self.gpu = gpu
        self.dry = isinstance(gpu, DryRunGpu)
        self.modules: dict = {}

    def kernel(self, fn: str) -> Kernel:
        file = declaration(fn).file
        if file not in self.modules:
            self.modules[file] = self.gpu.load_kernel_file(file)
        return self.modules[file].kernel(fn)

    def launch(self, ln: Launch) -> None:
        """Launches ``ln`` (device arguments: DeviceArray / None / scalars), no sync."""
        self.gpu.launch(self.kernel(ln.fn), *ln.shape, ln.args)

    def run(self, fn: str, /, **args) -> dict[str, np.ndarray]:
        """Launches ``fn`` with arguments by parameter name (numpy / Out arrays uploaded first),
        synchronizes; returns the Out arrays downloaded, by parameter name."""
        temps, outs, dev_args = [], {}, {}
        for name, a in args.items():
            if isinstance(a, (np.ndarray, Out)):
                host = a.init if isinstance(a, Out) else np.ascontiguousarray(a)
                d = self.gpu.upload(host)
                temps.append(d)
                if isinstance(a, Out):
                    outs[name] = (d, host)
                a = d
            dev_args[name] = a
        self.launch(Launch(fn, dev_args))
        self.gpu.synchronize()
        result = {name: self.gpu.download(d, h.shape, h.dtype) for name, (d, h) in outs.items()}
        for d in temps:
            self.gpu.free(d)
        return result

    def close(self, got, want, atol, rtol=0.0, label: str = "") -> None:
        """Asserts |got - want| <= atol + rtol |want| elementwise (equal infinities pass)."""
        if self.dry:
            return
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        bad = ~(np.abs(got - want) <= atol + rtol * np.abs(want))
        bad &= ~(np.isinf(got) & (got == want))
        assert not bad.any(), (f"{label}: {bad.sum()} of {bad.size} differ; worst "
                               f"{np.nanmax(np.abs(got - want))} at {np.argwhere(bad)[:3].tolist()}")

    def same(self, got, want, label: str = "") -> None:
        """Asserts bit-for-bit equality (NaN == NaN)."""
        if not self.dry:
            assert np.array_equal(np.asarray(got), np.asarray(want), equal_nan=True), label


class _DryModule:
    def kernel(self, name: str) -> Kernel:
        return Kernel(None, declaration(name))


class DryRunGpu:
    """A host stand-in for launch.Gpu: fake addresses, launches that only pack arguments."""

    arch, context = "sm_90", None
    host_launches = True  # a CUDA backend launches through ``launch`` (no driver calls), as on the SimGpu

    def __init__(self):
        self.next, self.launches = 1 << 30, []

    def upload(self, host: np.ndarray) -> DeviceArray:
        arr = DeviceArray(self.next, host.nbytes)
        self.next += host.nbytes + 256
        return arr

    def download(self, arr, shape, dtype) -> np.ndarray:
        return np.zeros(shape, dtype)

    def copy_device(self, dst, src, nbytes: int) -> None:
        pass

    def free(self, arr) -> None:
        pass

    def load(self, cubin: bytes) -> _DryModule:
        return _DryModule()

    def load_kernel_file(self, file: str) -> _DryModule:
        return _DryModule()

    def launch(self, kernel: Kernel, grid, block, args, shared_bytes: int = 0, stream=0) -> None:
        kernel.pack(args)
        if min(grid) < 1 or not 32 <= block[0] <= 1024:
            raise ValueError(f"{kernel.name}: bad launch shape {grid} x {block}")
        self.launches.append(kernel.name)

    def synchronize(self) -> None:
        pass


def run_while_graph(runner: KernelRunner, body_for_handle, timeout_s: float | None = None) -> None:
    """Runs a graph made of one WHILE node (condition default 1, reset at each launch) whose
    body is ``body_for_handle(handle)``: a list of Launches (device arguments) run in order.
    A body kernel must clear the condition (cudaGraphSetConditional); a loop still running
    after ``timeout_s`` (default WHILE_TIMEOUT_S) raises CudaError("graph_stuck") instead of
    hanging the caller, without touching the graph or stream again (that would wait on the
    loop): the context is unusable, so the process should end. A device that brings its own graphs (the
    simulated one's ``graph_builder``) runs the same WHILE node there."""
    timeout_s = WHILE_TIMEOUT_S if timeout_s is None else timeout_s
    own_graphs = getattr(runner.gpu, "graph_builder", None)
    if own_graphs is not None:
        graphs = own_graphs(runner)
        graphs.launch(graphs.instantiate([], body_for_handle), timeout_s)
        return
    from cuda.bindings import driver as drv
    graph = check(drv.cuGraphCreate(0), "cuGraphCreate")
    handle, body = add_while_node(drv, graph, runner.gpu.context, [])
    prev, keep = [], []
    for ln in body_for_handle(handle):
        kernel = runner.kernel(ln.fn)
        kparams, holders = kernel.pack(ln.args)
        keep.append((kparams, holders))  # alive until the node has copied them
        prev = [add_kernel_node(drv, body, prev, kernel.function, *ln.shape, kparams.ctypes.data, ln.fn)]
    exe = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    stream = check(drv.cuStreamCreate(0), "cuStreamCreate")
    stuck = False
    try:
        check(drv.cuGraphLaunch(exe, stream), "cuGraphLaunch")
        deadline = time.monotonic() + timeout_s
        while True:
            err = drv.cuStreamQuery(stream)[0]
            if err == drv.CUresult.CUDA_SUCCESS:
                break
            if err != drv.CUresult.CUDA_ERROR_NOT_READY:
                check((err,), "cuStreamQuery")
            if time.monotonic() > deadline:
                stuck = True
                raise CudaError("graph_stuck", f"WHILE loop still running after {timeout_s:g} s: its condition was "
                                "never cleared; the context is unusable, end the process", timeout_s=timeout_s)
            time.sleep(0.001)
    finally:
        if not stuck:
            check(drv.cuGraphExecDestroy(exe), "cuGraphExecDestroy")
            check(drv.cuGraphDestroy(graph), "cuGraphDestroy")
            check(drv.cuStreamDestroy(stream), "cuStreamDestroy")
