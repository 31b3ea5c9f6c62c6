"""Building CUDA graphs from launch lists: kernel nodes with fork/join dependencies, and an
optional conditional WHILE node whose body is another launch list.

The driver calls follow kernels/runner.py's ``run_while_graph`` (cuGraphConditionalHandleCreate,
a CU_GRAPH_NODE_TYPE_CONDITIONAL node added with cuGraphAddNode, kernels added to
``phGraph_out[0]``), with kernel nodes before the WHILE node, and the result kept
instantiated for relaunching instead of run once. The graph itself is destroyed right after
instantiation: the executable graph owns a copy.
"""
from __future__ import annotations

import time

from kernels.launch import check

from .errors import CudaError


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


def _add_node(drv, graph, deps: list, params):
    """cuGraphAddNode across binding versions: 13.x takes edge data (None), 12.x does not."""
    try:
        return check(drv.cuGraphAddNode(graph, deps or None, None, len(deps), params), "cuGraphAddNode")
    except TypeError:
        return check(drv.cuGraphAddNode(graph, deps or None, len(deps), params), "cuGraphAddNode")


class GraphBuilder:
    """Instantiates launch lists of one CudaModel as graphs on its stream; owns two timing events."""

    def __init__(self, model):
        from cuda.bindings import driver as drv
        self.m, self.drv = model, drv
        self.events = [check(drv.cuEventCreate(0), "cuEventCreate") for _ in range(2)]

    def _add_kernels(self, graph, launches) -> list:
        """Kernel nodes of ``launches`` in ``graph``; returns the last stage's nodes."""
        from .cuda_backend import Program
        drv, program = self.drv, Program(self.m, launches)
        deps, last = dependencies(launches)
        nodes = []
        for (kernel, (gx, gy, gz), (bx, by, bz), params, _holders), dep in zip(program.items, deps):
            p = drv.CUDA_KERNEL_NODE_PARAMS()
            p.func, p.gridDimX, p.gridDimY, p.gridDimZ = kernel.function, gx, gy, gz
            p.blockDimX, p.blockDimY, p.blockDimZ = bx, by, bz
            p.sharedMemBytes, p.kernelParams, p.extra = 0, params.ctypes.data, 0
            d = [nodes[j] for j in dep]
            nodes.append(check(drv.cuGraphAddKernelNode(graph, d or None, len(d), p),
                               f"cuGraphAddKernelNode({kernel.signature.name})"))
        return [nodes[j] for j in last]

    def instantiate(self, launches, body=None):
        """An executable graph: ``launches``, then (``body`` given) a WHILE node whose body is
        ``body(handle)``'s launches; the condition defaults to 1 at every launch."""
        drv = self.drv
        graph = check(drv.cuGraphCreate(0), "cuGraphCreate")
        try:
            last = self._add_kernels(graph, launches)
            if body is not None:
                ctx = self.m.gpu.context
                handle = check(drv.cuGraphConditionalHandleCreate(graph, ctx, 1, drv.CU_GRAPH_COND_ASSIGN_DEFAULT),
                               "cuGraphConditionalHandleCreate")
                params = drv.CUgraphNodeParams()
                params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
                params.conditional.handle = handle
                params.conditional.type = drv.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
                params.conditional.size = 1
                params.conditional.ctx = ctx
                _add_node(drv, graph, last, params)
                self._add_kernels(params.conditional.phGraph_out[0], body(int(handle)))
            exe = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        finally:
            check(drv.cuGraphDestroy(graph), "cuGraphDestroy")
        check(drv.cuGraphUpload(exe, self.m.stream), "cuGraphUpload")
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
                raise CudaError("cuda_error", f"the decode graph still runs after {timeout_s:.0f} s: its WHILE "
                                "condition was never cleared; the context is unusable, end the process",
                                call="cuGraphLaunch", timeout_s=timeout_s)
        return float(check(drv.cuEventElapsedTime(self.events[0], self.events[1]), "cuEventElapsedTime"))

    def destroy(self, exe) -> None:
        check(self.drv.cuGraphExecDestroy(exe), "cuGraphExecDestroy")

    def close(self) -> None:
        for ev in self.events:
            check(self.drv.cuEventDestroy(ev), "cuEventDestroy")
        self.events = []
