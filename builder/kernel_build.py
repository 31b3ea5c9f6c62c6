"""Kernels for a bundle: the contract's target section, and the cubins compiled for its architecture."""
from __future__ import annotations

from pathlib import Path

from toolcall.builder.quantize import weight_format
from toolcall.common.errors import BuildError
from toolcall.kernels.declarations import DRAW_MAX_CANDIDATES
from toolcall.kernels.geometry import shape_problems
from toolcall.kernels.nvrtc_build import compile_all
from toolcall.kernels.targets import resolve_target
from toolcall.runtime.bundle.contract import Target
from toolcall.runtime.bundle.model_config import ModelConfig


def contract_target(name: str) -> Target:
    """The contract's target section for ``--target NAME`` (a BuildError lists the known names)."""
    t = resolve_target(name)
    if not t.is_gpu:
        return Target(name=t.name, gpu_names=(), compute_capability=None, sm_arch=None, min_driver_version=None)
    major, minor = t.compute_capability
    return Target(name=t.name, gpu_names=tuple(g.lower() for g in t.gpu_names),
                  compute_capability=f"{major}.{minor}", sm_arch=t.sm_arch, min_driver_version=t.min_driver_version)


def compile_kernels(target: Target, out_dir: Path) -> dict[str, dict]:
    """Writes ``<out_dir>/<kernel>.cubin`` for a GPU target; returns the per-function resource report."""
    if target.sm_arch is None:
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {}
    for kernel in compile_all(target.sm_arch):
        (out_dir / kernel.file_name).write_bytes(kernel.cubin)
        report[kernel.name] = kernel.resources
    return report


def check_kernel_shapes(target: Target, cfg: ModelConfig, precision: str) -> None:
    """BuildError before any work when a GPU target's kernels cannot run this model's sizes."""
    if target.sm_arch is None:
        return
    problems = shape_problems(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                              cfg.head_dim, weight_format(precision))
    if problems:
        raise BuildError("build_failed", f"the {target.name} kernels cannot run this model: {'; '.join(problems)}; "
                         "build for --target cpu, or use a model with supported sizes", problems=problems)


def check_candidate_columns(target: Target, max_edges_per_node: int, max_request_tools: int | None) -> None:
    """BuildError before any work when a GPU target's sampled draw (kernels/sample_draw.cu, at most
    DRAW_MAX_CANDIDATES candidates a row) could meet a wider row: the catalog's trie has a node with more
    edges, or a request may bring more tools (T tools: T + 1 edges at its root). The contract's candidate
    columns then never exceed it, which loads check again (runtime/cuda/backend.py)."""
    if target.sm_arch is None:
        return
    if max_edges_per_node > DRAW_MAX_CANDIDATES:
        raise BuildError("build_failed", f"the catalog's tool trie has a node with {max_edges_per_node} allowed "
                         f"tokens (tool names starting with that many different tokens); the {target.name} kernels "
                         f"draw among at most {DRAW_MAX_CANDIDATES}: build for --target cpu, or give the tools "
                         "names that share their first tokens", max_edges_per_node=max_edges_per_node,
                         limit=DRAW_MAX_CANDIDATES)
    if max_request_tools is not None and max_request_tools + 1 > DRAW_MAX_CANDIDATES:
        raise BuildError("usage", f"--max-request-tools {max_request_tools} gives a request's grammar "
                         f"{max_request_tools + 1} allowed tokens at its root; the {target.name} kernels draw among "
                         f"at most {DRAW_MAX_CANDIDATES}: pass --max-request-tools {DRAW_MAX_CANDIDATES - 1} or less",
                         option="max_request_tools", found=max_request_tools, limit=DRAW_MAX_CANDIDATES - 1)
