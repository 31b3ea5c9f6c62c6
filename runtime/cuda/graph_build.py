"""Building CUDA graphs from launch lists: kernel nodes with fork/join dependencies, and an
optional conditional WHILE node whose body is another launch list.

The nodes come from kernels/graph_nodes.py, as in kernels/runner.py's ``run_while_graph``,
with kernel nodes before the WHILE node, and the result kept instantiated for relaunching
instead of run once. The graph itself is destroyed right after instantiation: the
executable graph owns a copy.
"""
from __future__ import annotations

import time

from toolcall.common.errors import CudaError
from toolcall.kernels.graph_nodes import add_kernel_node, add_while_node
from toolcall.kernels.launch import check, first_error


def dependencies(launches) -> tuple[list[list[int]], list[int]]:
    """(deps per launch, the last stage's indices). A launch marked ``parallel`` shares the
    dependencies of the one before it; any other launch waits for the whole previous stage."""
    deps, stage = [], []
    for i, ln in enumerate(launches):
        if ln.parallel and deps:
            deps.append(deps[-1])
            stage.append(i)
        else:
            deps.append(stage)
            stage = [i]
    return deps, stage


class GraphBuilder:
    """Instantiates launch lists of one CudaModel as graphs on its stream; owns two timing events."""

    def __init__(self, model, programmatic: bool = False):
        from cuda.bindings import driver as drv
        self.m, self.drv = model, drv
        self.events = [check(drv.cuEventCreate(0), "cuEventCreate") for _ in range(2)]
        # Programmatic edges between consecutive kernels (sm_90+: the next kernel's launch and
        # weight loads overlap the previous one's tail). Off by default: on an H200 (2026-12-04)
        # they saved nothing in fp8 and cost 6 % in nvfp4.
        self.programmatic = bool(programmatic) and tuple(getattr(model.gpu, "compute_capability", (0, 0))) >= (9, 0)
        self.programmatic_error: str | None = None  # why a graph fell back to full edges

    def _add_kernels(self, graph, launches, programmatic: bool) -> list:
        """Kernel nodes of ``launches`` in ``graph``; returns the last stage's nodes."""
        from toolcall.runtime.cuda.program import Program
        drv, program = self.drv, Program(self.m, launches)
        deps, last = dependencies(launches)
        nodes = []
        for (kernel, grid, block, params, _holders), dep in zip(program.items, deps):
            nodes.append(add_kernel_node(drv, graph, [nodes[j] for j in dep], kernel.function, grid, block,
                                         params.ctypes.data, kernel.name, programmatic))
        return [nodes[j] for j in last]

    def instantiate(self, launches, body=None):
        """An executable graph: ``launches``, then (``body`` given) a WHILE node whose body is
        ``body(handle)``'s launches; the condition defaults to 1 at every launch. If the driver
        refuses programmatic edges, the graph is built again with full edges (and stays so)."""
        if self.programmatic:
            try:
                return self._instantiate(launches, body, True)
            except TypeError as e:  # bindings whose cuGraphAddDependencies takes no edge data (12.x)
                self.programmatic, self.programmatic_error = False, f"TypeError: {e}"
            except CudaError as e:  # only what the edges can cause: adding them, or instantiating with them
                call = str(e.details.get("call", ""))
                if not (call.startswith("cuGraphAddDependencies") or call == "cuGraphInstantiate"):
                    raise
                self.programmatic, self.programmatic_error = False, str(e)
        return self._instantiate(launches, body, False)

    def _instantiate(self, launches, body, programmatic: bool):
        drv = self.drv
        graph = check(drv.cuGraphCreate(0), "cuGraphCreate")
        try:
            last = self._add_kernels(graph, launches, programmatic)
            if body is not None:
                handle, body_graph = add_while_node(drv, graph, self.m.gpu.context, last)
                self._add_kernels(body_graph, body(handle), programmatic)
            exe = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        finally:
            check(drv.cuGraphDestroy(graph), "cuGraphDestroy")
        try:
            check(drv.cuGraphUpload(exe, self.m.stream), "cuGraphUpload")
        except CudaError:
            check(drv.cuGraphExecDestroy(exe), "cuGraphExecDestroy")
            raise
        return exe

    def launch(self, exe, timeout_s: float) -> float:
        """Launches ``exe`` on the model's stream between the two events; polls (bounded) for
        the end; returns the device milliseconds. A loop that never ends raises CudaError."""
        drv, stream = self.drv, self.m.stream
        check(drv.cuEventRecord(self.events[0], stream), "cuEventRecord")
        check(drv.cuGraphLaunch(exe, stream), "cuGraphLaunch")
        check(drv.cuEventRecord(self.events[1], stream), "cuEventRecord")
        deadline = time.monotonic() + timeout_s
        while True:
            err = drv.cuEventQuery(self.events[1])[0]
            if err == drv.CUresult.CUDA_SUCCESS:
                break
            if err != drv.CUresult.CUDA_ERROR_NOT_READY:
                check((err,), "cuEventQuery")
            if time.monotonic() > deadline:
                raise CudaError("graph_stuck", f"the decode graph still runs after {timeout_s:.0f} s: its WHILE "
                                "condition was never cleared; the context is unusable, end the process",
                                call="cuGraphLaunch", timeout_s=timeout_s)
        return float(check(drv.cuEventElapsedTime(self.events[0], self.events[1]), "cuEventElapsedTime"))

    def destroy(self, exe) -> None:
        check(self.drv.cuGraphExecDestroy(exe), "cuGraphExecDestroy")

    def close(self) -> None:
        events, self.events = self.events, []
        first_error([lambda e=ev: check(self.drv.cuEventDestroy(e), "cuEventDestroy") for ev in events])
