"""kernels/graph_nodes.py without a GPU: the driver calls and node parameters it makes, recorded by
a stand-in for cuda.bindings.driver (the real call results come only on a device: gpu_check)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from toolcall.kernels.graph_nodes import add_kernel_node, add_node, add_while_node

drv_real = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is a project dependency")
OK = drv_real.CUresult.CUDA_SUCCESS


class FakeDriver:
    """Records (call name, arguments); returns fresh node names. ``old_add_node``: the 12.x
    cuGraphAddNode signature, without edge data."""

    CUgraphNodeType = drv_real.CUgraphNodeType
    CUgraphConditionalNodeType = drv_real.CUgraphConditionalNodeType
    CU_GRAPH_COND_ASSIGN_DEFAULT = drv_real.CU_GRAPH_COND_ASSIGN_DEFAULT

    def __init__(self, old_add_node=False):
        self.calls, self.old_add_node, self.body = [], old_add_node, object()

    def _node(self, name, *args):
        self.calls.append((name, args))
        return OK, f"node{len(self.calls)}"

    def cuGraphAddNode(self, graph, deps, *rest):
        if self.old_add_node and len(rest) == 3:
            raise TypeError("cuGraphAddNode() takes 4 positional arguments")
        rest[-1].conditional.phGraph_out = [self.body]  # the driver creates the body graph with the node
        return self._node("cuGraphAddNode", graph, deps, *rest)

    def cuGraphAddKernelNode(self, graph, deps, count, params):
        return self._node("cuGraphAddKernelNode", graph, deps, count, params)

    def cuGraphConditionalHandleCreate(self, graph, ctx, default, flags):
        self.calls.append(("cuGraphConditionalHandleCreate", (graph, ctx, default, flags)))
        return OK, 77

    @staticmethod
    def CUDA_KERNEL_NODE_PARAMS():
        return SimpleNamespace()

    def CUgraphNodeParams(self):
        return SimpleNamespace(conditional=SimpleNamespace(phGraph_out=[]))


@pytest.mark.parametrize("old_add_node", [False, True], ids=["bindings-13", "bindings-12"])
def test_while_node_defaults_to_one_and_follows_its_dependencies(old_add_node):
    drv = FakeDriver(old_add_node)
    handle, body = add_while_node(drv, "graph", "ctx", ["k1", "k2"])
    assert (handle, body) == (77, drv.body)
    assert drv.calls[0] == ("cuGraphConditionalHandleCreate", ("graph", "ctx", 1, drv.CU_GRAPH_COND_ASSIGN_DEFAULT))
    name, args = drv.calls[-1]
    assert name == "cuGraphAddNode" and args[:2] == ("graph", ["k1", "k2"])
    assert args[-2] == 2 and len(args) == (4 if old_add_node else 5)
    if not old_add_node:
        assert args[2] is None  # 13.x: no edge data
    params = args[-1]
    assert params.type == drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    c = params.conditional
    assert (c.handle, c.type, c.size, c.ctx) == (77, drv.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE, 1, "ctx")


@pytest.mark.parametrize("deps, want_deps", [([], None), (["a"], ["a"]), (["a", "b"], ["a", "b"])])
def test_kernel_node_carries_the_launch_shape_and_arguments(deps, want_deps):
    drv = FakeDriver()
    node = add_kernel_node(drv, "g", deps, "fn", (3, 2, 1), (128, 1, 1), 4096, "rmsnorm")
    name, (graph, got_deps, count, p) = drv.calls[-1]
    assert node == "node1" and (name, graph, got_deps, count) == ("cuGraphAddKernelNode", "g", want_deps, len(deps))
    assert (p.func, p.gridDimX, p.gridDimY, p.gridDimZ) == ("fn", 3, 2, 1)
    assert (p.blockDimX, p.blockDimY, p.blockDimZ) == (128, 1, 1)
    assert (p.sharedMemBytes, p.kernelParams, p.extra) == (0, 4096, 0)


def test_a_failed_driver_call_names_the_call(monkeypatch):
    from toolcall.common.errors import CudaError

    class Failing(FakeDriver):
        CUresult = drv_real.CUresult

        def cuGraphAddNode(self, *args):
            return (drv_real.CUresult.CUDA_ERROR_INVALID_VALUE, None)

        @staticmethod
        def cuGetErrorName(err):  # the real one needs the driver library
            return OK, err.name.encode()

    monkeypatch.setattr("toolcall.kernels.launch._driver", Failing)
    with pytest.raises(CudaError, match="cuGraphAddNode failed: CUDA_ERROR_INVALID_VALUE"):
        add_node(Failing(), "g", [], SimpleNamespace())
