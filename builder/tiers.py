"""The tier planner behind ``builder plan``: which limits fit a GPU's memory. Writes nothing.

Throughput tiers start at START_STEP_TOKENS tokens per step and double until the total no
longer fits. In each, half a step holds one decode row for every sequence (max_sequences =
T / 2) and the other half prefill (prefill_chunk = T / 2, at most max_input_tokens and the GPU targets'
largest default chunk, GPU_PREFILL_CHUNKS[0] = 512), and the
KV pool holds every sequence at full length (input + output), so admission never waits on
pages. A long-sequence tier follows: LONG_SEQUENCES sequences with the longest input that fits.
"""
from __future__ import annotations

from dataclasses import dataclass

from toolcall.builder.memory_plan import GPU_PREFILL_CHUNKS, MIB, format_size, plan_memory
from toolcall.common.errors import BuildError
from toolcall.runtime.bundle.contract import Limits, Memory
from toolcall.runtime.bundle.model_config import ModelConfig

START_STEP_TOKENS = 32
MAX_STEP_TOKENS = 1 << 16  # stop doubling here even when memory is left (cpu, huge budgets)
DEFAULT_MAX_INPUT_TOKENS = 1024  # a request; the catalog lives in the trie, not the prompt
DEFAULT_MAX_OUTPUT_TOKENS = 64  # a few tool names with separators and END
LONG_SEQUENCES = 4
LONG_STEP_TOKENS = 512

# Plain-table headers (plan's --json output uses the Limits/Memory field names instead).
TIER_COLUMNS = ("tier", "sequences", "step", "chunk", "input", "output", "pages", "weights", "kv_pool", "workspace",
                "total")


@dataclass(frozen=True)
class Tier:
    name: str  # "batch-<max_sequences>" or "long"
    limits: Limits
    memory: Memory


def _limits(step_tokens: int, sequences: int, max_input: int, max_output: int, page_size: int) -> Limits:
    per_sequence = -(-(max_input + max_output) // page_size)
    return Limits(page_size=page_size, num_pages=sequences * per_sequence, max_sequences=sequences,
                  max_tokens_per_step=step_tokens,
                  prefill_chunk=min(step_tokens // 2, max_input, GPU_PREFILL_CHUNKS[0]),
                  max_input_tokens=max_input, max_output_tokens=max_output)


def plan_tiers(config: ModelConfig, precision: str, gpu_memory_bytes: int, target_name: str, page_size: int = 32,
               *, max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS, max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
               context_reserve_bytes: int | None = None) -> list[Tier]:
    """Throughput tiers (doubling tokens per step) then a long-sequence tier, all within gpu_memory_bytes.

    Raises BuildError("budget_too_small") with the numbers when not even the smallest tier fits.
    """
    def memory(limits: Limits) -> Memory:
        return plan_memory(config, precision, limits, target_name, context_reserve_bytes)

    tiers: list[Tier] = []
    step = START_STEP_TOKENS
    while step <= MAX_STEP_TOKENS:
        limits = _limits(step, step // 2, max_input_tokens, max_output_tokens, page_size)
        mem = memory(limits)
        if mem.total_bytes > gpu_memory_bytes:
            if not tiers:
                raise BuildError(
                    "budget_too_small",
                    f"{gpu_memory_bytes} bytes ({gpu_memory_bytes / MIB:.0f} MiB) cannot hold the smallest tier "
                    f"({limits.max_sequences} sequences of {max_input_tokens}+{max_output_tokens} tokens): it needs "
                    f"{mem.total_bytes} bytes ({mem.total_bytes / MIB:.0f} MiB), of which weights {mem.weights_bytes} "
                    f"bytes. Plan for a larger memory or shorter --max-input-tokens.",
                    needed_bytes=mem.total_bytes, available_bytes=gpu_memory_bytes, weights_bytes=mem.weights_bytes)
            break
        tiers.append(Tier(f"batch-{limits.max_sequences}", limits, mem))
        step *= 2

    # Long tier: the largest input (whole pages, within the model's positions) that still fits.
    longest = config.max_position_embeddings - max_output_tokens
    lo, hi = 0, longest // page_size  # lo pages fit (0: none found yet), hi pages is the ceiling
    while lo < hi:
        mid = (lo + hi + 1) // 2
        limits = _limits(LONG_STEP_TOKENS, LONG_SEQUENCES, mid * page_size, max_output_tokens, page_size)
        if memory(limits).total_bytes <= gpu_memory_bytes:
            lo = mid
        else:
            hi = mid - 1
    if lo * page_size > max_input_tokens:
        limits = _limits(LONG_STEP_TOKENS, LONG_SEQUENCES, lo * page_size, max_output_tokens, page_size)
        tiers.append(Tier("long", limits, memory(limits)))
    return tiers


def tier_rows(tiers: list[Tier]) -> list[tuple]:
    """One row per tier in TIER_COLUMNS order: counts as ints, sizes as format_size text (rounded up)."""
    return [(t.name, t.limits.max_sequences, t.limits.max_tokens_per_step, t.limits.prefill_chunk,
             t.limits.max_input_tokens, t.limits.max_output_tokens, t.limits.num_pages,
             format_size(t.memory.weights_bytes), format_size(t.memory.kv_pool_bytes),
             format_size(t.memory.workspace_bytes), format_size(t.memory.total_bytes)) for t in tiers]
