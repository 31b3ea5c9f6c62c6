"""The memory plan: device bytes of a bundle by use, computed from shapes without allocating.

Terms (all bytes):
- weights: tensor data of weights.safetensors (runtime/bundle/layout.py ``weights_bytes``).
- KV pool: num_pages * page_size * num_layers * 2 (K and V) * num_kv_heads * head_dim * 2 (bf16);
  num_pages includes the prompt prefix's pinned pages (``prefix_pages``), shared by all sequences.
- workspace: float32 buffers for one step of max_tokens_per_step rows; ``workspace_breakdown``
  lists them one by one, so the backends' allocations can be checked against it. On cpu the
  fast backend (runtime/cpu/fast_model.py) holds exactly these buffers, with attention scores
  [T, heads, max context] in place of the GPU's split-K partials; its weights are the
  bundle's stored arrays (memory-mapped), so a CPU load's resident memory is this total.
- graphs: captured CUDA graphs, a fixed estimate (GRAPHS_BYTES_GPU; 0 on cpu).
- context reserve: CUDA context and driver (CONTEXT_RESERVE_BYTES_GPU by default; 0 on cpu).
"""
from __future__ import annotations

import dataclasses
import math
import re
from decimal import Decimal, InvalidOperation

from toolcall.builder.quantize import weight_format
from toolcall.common.errors import BuildError
from toolcall.common.formats import KV_BF16, KvFormat
from toolcall.runtime.bundle.contract import CPU_TARGET, Limits, Memory

# The KV and workspace formulas are the runtime's (it re-checks the memory section at load with them).
from toolcall.runtime.bundle.layout import (  # noqa: F401 (re-exported)
    F32,
    attention_splits,
    kv_bytes_per_token,
    kv_pool_bytes,
    weights_bytes,
    workspace_breakdown,
)
from toolcall.runtime.bundle.model_config import ModelConfig

MIB = 1 << 20
GIB = 1 << 30
# A CUDA context costs 0.3-0.55 GiB of device memory in published measurements (driver and
# module images, cuBLAS-free); 512 MiB covers the usual case, --context-reserve overrides it.
CONTEXT_RESERVE_BYTES_GPU = 512 * MIB
# Graph nodes, kernel parameters and the conditional-node state of the captured decode loop:
# a few MiB in practice; 64 MiB is a fixed upper estimate so the total never falls short.
GRAPHS_BYTES_GPU = 64 * MIB

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")
# Binary with "i" (KiB, Gi), decimal without (KB, G), as Kubernetes and Docker read them.
_UNITS = {"": 1, "b": 1,
          "k": 10**3, "kb": 10**3, "ki": 2**10, "kib": 2**10,
          "m": 10**6, "mb": 10**6, "mi": 2**20, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gi": 2**30, "gib": 2**30,
          "t": 10**12, "tb": 10**12, "ti": 2**40, "tib": 2**40}


def format_size(n: int) -> str:
    """A byte count for people, rounded up at one decimal: "512B", "604.0KiB", "1.9MiB", "2.25GiB"."""
    for unit, scale, digits in (("GiB", 2**30, 2), ("MiB", 2**20, 1), ("KiB", 2**10, 1)):
        if n >= scale:
            step = 10**digits
            return f"{math.ceil(n * step / scale) / step:.{digits}f}{unit}"
    return f"{n}B"


def parse_size(text: str | int) -> int:
    """Bytes of "24GiB", "512MB", "1.5G", "4096" or an int (binary units with "i", decimal without)."""
    if isinstance(text, bool):
        raise BuildError("usage", f"memory size: expected a byte count or text like '24GiB', found {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise BuildError("usage", f"memory size: expected a non-negative byte count, found {text}", found=text)
        return text
    m = _SIZE.match(str(text))
    unit = m and _UNITS.get(m.group(2).lower())
    if not m or unit is None:
        raise BuildError("usage", f"memory size: expected a number with an optional unit (B, KB, MB, GB, TB or "
                         f"KiB, MiB, GiB, TiB), e.g. '24GiB' or '512MB'; found {text!r}", found=str(text))
    try:
        value = Decimal(m.group(1)) * unit  # exact: "1.5G" is 1500000000, not a float's rounding
    except InvalidOperation:  # pragma: no cover - the regex admits only decimal numbers
        raise BuildError("usage", f"memory size: cannot read the number in {text!r}", found=str(text)) from None
    return int(value)  # fractional bytes round down


def prefix_pages(prefix_tokens: int, page_size: int) -> int:
    """Pinned KV pages of a fixed prompt prefix: its whole pages (shared) plus a partial last one (copied)."""
    return -(-prefix_tokens // page_size)


def graphs_bytes(target_name: str) -> int:
    return 0 if target_name == CPU_TARGET else GRAPHS_BYTES_GPU


CPU_PREFILL_CHUNK, CPU_STEP_TOKENS = 128, 256  # `builder compile`'s defaults for the cpu target
# GPU targets' prefill chunks, tried in order under a memory budget: the largest whose workspace leaves room for a
# sequence (512 prompt tokens a step keep the matrix units busy; the workspace grows with the step's rows)
GPU_PREFILL_CHUNKS = (512, 256, 128)


def default_prefill_chunks(target_name: str, max_input_tokens: int) -> tuple[int, ...]:
    """The prefill chunks `builder compile` tries when none is given, largest first (a GPU's: no longer than a
    prompt may be)."""
    if target_name == CPU_TARGET:
        return (CPU_PREFILL_CHUNK,)
    return tuple(sorted({min(c, max_input_tokens) for c in GPU_PREFILL_CHUNKS}, reverse=True))


def default_step_tokens(target_name: str, prefill_chunk: int, max_sequences: int) -> int:
    """Rows of a step when none is given: 256 on the cpu; on a GPU a prefill chunk beside one decode row for every
    sequence (at least 256)."""
    return CPU_STEP_TOKENS if target_name == CPU_TARGET else max(CPU_STEP_TOKENS, prefill_chunk + max_sequences)


def default_context_reserve(target_name: str) -> int:
    """CUDA context reserve of a target: 0 on cpu, CONTEXT_RESERVE_BYTES_GPU on a GPU."""
    return 0 if target_name == CPU_TARGET else CONTEXT_RESERVE_BYTES_GPU


def plan_memory(config: ModelConfig, precision: str, limits: Limits, target_name: str,
                context_reserve_bytes: int | None = None, max_edges_per_node: int | None = None,
                kv: KvFormat = KV_BF16) -> Memory:
    """The contract's memory section for these limits and KV format (context reserve defaults per target)."""
    reserve = default_context_reserve(target_name) if context_reserve_bytes is None else context_reserve_bytes
    if reserve < 0:
        raise BuildError("usage", f"context reserve: expected a non-negative byte count, found {reserve}",
                         found=reserve)
    return Memory.from_parts(
        weights_bytes=weights_bytes(config, weight_format(precision)),
        kv_pool_bytes=kv_pool_bytes(config, limits.num_pages, limits.page_size, kv),
        workspace_bytes=sum(workspace_breakdown(config, limits, max_edges_per_node, target_name).values()),
        graphs_bytes=graphs_bytes(target_name),
        context_reserve_bytes=reserve)


def size_pool_for_budget(config: ModelConfig, precision: str, limits: Limits, budget_bytes: int, target_name: str,
                         context_reserve_bytes: int | None = None, max_edges_per_node: int | None = None,
                         pinned_pages: int = 0, kv: KvFormat = KV_BF16) -> int:
    """KV pages that fit ``budget_bytes`` beside everything else (``limits.num_pages`` is ignored).

    Never more than max_sequences full-length sequences need, plus ``pinned_pages`` (the prompt
    prefix's, see ``prefix_pages``), which the pool always holds. Raises BuildError("budget_too_small")
    with the numbers when not even one max_input + max_output sequence fits.
    """
    fixed = plan_memory(config, precision, dataclasses.replace(limits, num_pages=0), target_name,
                        context_reserve_bytes, max_edges_per_node, kv)  # a scaled pool's scales included
    page_bytes = limits.page_size * kv_bytes_per_token(config, kv)
    per_sequence = limits.pages_per_sequence
    available = budget_bytes - fixed.total_bytes
    pages = max(available, 0) // page_bytes
    if pages < per_sequence + pinned_pages:
        needed = fixed.total_bytes + (per_sequence + pinned_pages) * page_bytes
        raise BuildError(
            "budget_too_small",
            f"memory budget {budget_bytes} bytes ({budget_bytes / GIB:.2f} GiB) is too small: weights "
            f"{fixed.weights_bytes}, workspace {fixed.workspace_bytes}, graphs {fixed.graphs_bytes} and context "
            f"reserve {fixed.context_reserve_bytes} bytes leave {available} bytes, but one sequence of "
            f"{limits.max_input_tokens}+{limits.max_output_tokens} tokens needs {per_sequence} pages of {page_bytes} "
            f"bytes ({per_sequence * page_bytes} bytes) beside {pinned_pages} pinned prompt-prefix pages; needed at least {needed} bytes ({needed / GIB:.2f} GiB). "
            f"Raise --memory-budget or lower --max-input-tokens / --max-tokens-per-step.",
            budget_bytes=budget_bytes, needed_bytes=needed, available_for_kv_bytes=available,
            one_sequence_kv_bytes=per_sequence * page_bytes, fixed_bytes=fixed.total_bytes)
    return min(pages, limits.max_sequences * per_sequence + pinned_pages)
