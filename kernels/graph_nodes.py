"""CUDA graph nodes shared by the kernel tests (kernels/runner.py) and the runtime's decode graph
(runtime/cuda/graph_build.py): kernel nodes, and the WHILE conditional node whose body graph
loops until a body kernel clears its condition through cudaGraphSetConditional.

Every call is checked (toolcall.kernels.launch.check) with the driver call's name in the error.
"""
from __future__ import annotations

from toolcall.kernels.launch import check


def add_node(drv, graph, deps: list, params):
    """cuGraphAddNode across binding versions: 13.x takes edge data (None), 12.x does not."""
    try:
        return check(drv.cuGraphAddNode(graph, deps or None, None, len(deps), params), "cuGraphAddNode")
    except TypeError:
        return check(drv.cuGraphAddNode(graph, deps or None, len(deps), params), "cuGraphAddNode")


def add_kernel_node(drv, graph, deps: list, function, grid: tuple[int, int, int], block: tuple[int, int, int],
                    params_ptr: int, name: str, programmatic: bool = False):
    """A kernel node of ``function`` after ``deps``; ``params_ptr`` is the address of the packed
    argument pointers (toolcall.kernels.launch.Kernel.pack), which must stay alive until the node is added.

    ``programmatic`` with exactly one dependency (a kernel node): the edge is a programmatic one
    (programmatic dependent launch, sm_90+): this kernel may start once every block of the one
    before has called pdl_trigger, and its pdl_wait returns when that kernel has completed
    (kernels/common.cuh). Every kernel in kernels/ follows that protocol."""
    p = drv.CUDA_KERNEL_NODE_PARAMS()
    p.func, (p.gridDimX, p.gridDimY, p.gridDimZ), (p.blockDimX, p.blockDimY, p.blockDimZ) = function, grid, block
    p.sharedMemBytes, p.kernelParams, p.extra = 0, params_ptr, 0
    if not programmatic or len(deps) != 1:
        return check(drv.cuGraphAddKernelNode(graph, deps or None, len(deps), p), f"cuGraphAddKernelNode({name})")
    node = check(drv.cuGraphAddKernelNode(graph, None, 0, p), f"cuGraphAddKernelNode({name})")
    edge = drv.CUgraphEdgeData()
    edge.from_port = int(drv.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC)
    edge.type = int(drv.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC)
    check(drv.cuGraphAddDependencies(graph, [deps[0]], [node], [edge], 1), f"cuGraphAddDependencies({name}, programmatic)")
    return node


def add_while_node(drv, graph, context, deps: list) -> tuple[int, object]:
    """A WHILE conditional node after ``deps`` whose condition is 1 at every launch of the graph;
    returns (the condition handle, as the body kernels take it, and the empty body graph)."""
    handle = check(drv.cuGraphConditionalHandleCreate(graph, context, 1, drv.CU_GRAPH_COND_ASSIGN_DEFAULT),
                   "cuGraphConditionalHandleCreate")
    params = drv.CUgraphNodeParams()
    params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle = handle
    params.conditional.type = drv.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
    params.conditional.size = 1
    params.conditional.ctx = context
    add_node(drv, graph, deps, params)
    return int(handle), params.conditional.phGraph_out[0]
