"""Memory plan, pool sizing, size parsing and tiers, against hand-computed numbers."""
from __future__ import annotations

import dataclasses

import pytest

from toolcall.builder.memory_plan import (
    CONTEXT_RESERVE_BYTES_GPU,
    GRAPHS_BYTES_GPU,
    format_size,
    kv_bytes_per_token,
    parse_size,
    plan_memory,
    prefix_pages,
    size_pool_for_budget,
    weights_bytes,
    workspace_breakdown,
)
from toolcall.builder.tiers import LONG_SEQUENCES, START_STEP_TOKENS, TIER_COLUMNS, plan_tiers, tier_rows
from toolcall.common.errors import BuildError
from toolcall.common.formats import FP8_E4M3, WEIGHT_FORMATS
from toolcall.runtime.bundle import layout
from toolcall.runtime.bundle.contract import Limits
from toolcall.runtime.bundle.model_config import ModelConfig

TINY = ModelConfig(family="qwen3", vocab_size=100, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                   max_position_embeddings=256, tie_word_embeddings=True, qkv_bias=False, qk_norm=True,
                   eos_token_ids=(99,))
QWEN3_06B = ModelConfig(family="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
                        num_heads=16, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                        rope_scaling=None, max_position_embeddings=40960, tie_word_embeddings=True, qkv_bias=False,
                        qk_norm=True, eos_token_ids=(151645, 151643))
TINY_LIMITS = Limits(page_size=16, num_pages=10, max_sequences=4, max_tokens_per_step=8, prefill_chunk=4,
                     max_input_tokens=40, max_output_tokens=8)
# 32 F8 + 4 rows * 4 F32 + 100*32 BF16 + 1 F32 scalar = 32 + 16 + 6400 + 4
STUB_SPECS = [("a.weight", "F8_E4M3", (4, 8)), ("a.weight_scale", "F32", (4,)),
              ("model.embed_tokens.weight", "BF16", (100, 32)), ("a.weight_scale_2", "F32", ())]
STUB_WEIGHTS = 6452


@pytest.fixture
def stub_weights(monkeypatch):
    """Weights independent of the quantizer: the numbers under test here are the other terms."""
    monkeypatch.setattr(layout, "weight_specs", lambda config, fmt: STUB_SPECS)


def test_weights_are_the_sum_of_spec_bytes(stub_weights):
    assert weights_bytes(TINY, FP8_E4M3) == STUB_WEIGHTS


# Qwen3-0.6B per layer: linear elements 2*2048*1024 (q, o) + 2*1024*1024 (k, v) + 3*3072*1024 (mlp) = 15,728,640,
# output rows 12,288; embedding 151936*1024 bf16 = 311,164,928 bytes; norms (2*1024 + 2*128)*28 + 1024 = 65,536 bf16.
@pytest.mark.parametrize("precision,expected", [
    ("fp8_e4m3", 28 * 15_728_640 + 28 * 12_288 * 4 + 311_164_928 + 131_072),  # weights + per-row F32 scales
    ("nvfp4", 28 * 15_728_640 // 2 + 28 * 15_728_640 // 16 + 28 * 7 * 4 + 311_164_928 + 131_072),
    ("bf16", 28 * 15_728_640 * 2 + 311_164_928 + 131_072),
])
def test_qwen3_weights_bytes(precision, expected):
    assert weights_bytes(QWEN3_06B, WEIGHT_FORMATS.get(precision)) == expected


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(QWEN3_06B) == 28 * 2 * 8 * 128 * 2 == 114_688
    assert kv_bytes_per_token(TINY) == 2 * 2 * 2 * 8 * 2 == 128


def test_tiny_workspace_breakdown():
    # T = 8 rows, R = min(8, 4 sequences) = 4 head rows, 1 attention split (48 tokens <= 256).
    assert workspace_breakdown(TINY, TINY_LIMITS, max_edges_per_node=5) == {
        "hidden": 8 * 32 * 4, "normed": 8 * 32 * 4, "q": 8 * 32 * 4, "k": 8 * 16 * 4, "v": 8 * 16 * 4,
        "attn_out": 8 * 32 * 4, "gate": 8 * 64 * 4, "up": 8 * 64 * 4, "attn_partials": 8 * 4 * 1 * (8 + 2) * 4,
        "rope": 8 * 8 * 4, "logits_sparse": 4 * 5 * 4, "logits_dense": 4 * 100 * 4}
    # No catalog yet: the sparse head is bounded by the vocabulary.
    assert workspace_breakdown(TINY, TINY_LIMITS)["logits_sparse"] == 4 * 100 * 4


def test_tiny_memory_plan(stub_weights):
    cpu = plan_memory(TINY, "fp8_e4m3", TINY_LIMITS, "cpu", max_edges_per_node=5)
    assert (cpu.weights_bytes, cpu.kv_pool_bytes, cpu.workspace_bytes, cpu.graphs_bytes,
            cpu.context_reserve_bytes) == (6452, 10 * 16 * 128, 17_040, 0, 0)  # cpu: attn_scores 8*4*48*4 for partials
    assert cpu.total_bytes == 6452 + 20_480 + 17_040
    gpu = plan_memory(TINY, "fp8_e4m3", TINY_LIMITS, "h200", max_edges_per_node=5)
    assert (gpu.graphs_bytes, gpu.context_reserve_bytes) == (GRAPHS_BYTES_GPU, CONTEXT_RESERVE_BYTES_GPU) \
        == (64 << 20, 512 << 20)
    assert gpu.total_bytes == cpu.total_bytes - 6144 + 1280 + 256 + (576 << 20)  # partials and the rope table
    assert plan_memory(TINY, "fp8_e4m3", TINY_LIMITS, "h200", context_reserve_bytes=0,
                       max_edges_per_node=5).context_reserve_bytes == 0
    with pytest.raises(BuildError, match="non-negative"):
        plan_memory(TINY, "fp8_e4m3", TINY_LIMITS, "h200", context_reserve_bytes=-1)


def test_qwen3_kv_pool_and_workspace(stub_weights):
    limits = Limits(page_size=32, num_pages=272, max_sequences=8, max_tokens_per_step=256, prefill_chunk=128,
                    max_input_tokens=1024, max_output_tokens=64)
    mem = plan_memory(QWEN3_06B, "fp8_e4m3", limits, "h200", max_edges_per_node=12)
    assert mem.kv_pool_bytes == 272 * 32 * 114_688 == 998_244_352
    ws = workspace_breakdown(QWEN3_06B, limits, max_edges_per_node=12)
    assert ws["hidden"] == 1_048_576 and ws["q"] == 2_097_152 and ws["gate"] == 3_145_728
    assert ws["attn_partials"] == 256 * 16 * 5 * 130 * 4 == 10_649_600  # ceil(1088 / 256) = 5 splits
    assert ws["logits_sparse"] == 8 * 12 * 4 and ws["logits_dense"] == 8 * 151_936 * 4 == 4_861_952
    assert ws["rope"] == 256 * 128 * 4  # [T, head_dim / 2, 2] (cos, sin)
    assert mem.workspace_bytes == sum(ws.values()) == 2 * 1_048_576 + 2 * 2_097_152 + 2 * 1_048_576 \
        + 2 * 3_145_728 + 10_649_600 + 131_072 + 384 + 4_861_952


def test_size_pool_for_budget(stub_weights):
    # Fixed part on cpu: weights 6452 + workspace 17,040 (edges 5) = 23,492 bytes; a page is 16 * 128 = 2048 bytes;
    # one 40 + 8 token sequence needs 3 pages.
    limits = dataclasses.replace(TINY_LIMITS, num_pages=0)
    kw = dict(target_name="cpu", max_edges_per_node=5)
    assert size_pool_for_budget(TINY, "fp8_e4m3", limits, 23_492 + 5 * 2048 + 100, **kw) == 5
    assert size_pool_for_budget(TINY, "fp8_e4m3", limits, 23_492 + 3 * 2048, **kw) == 3
    assert size_pool_for_budget(TINY, "fp8_e4m3", limits, 1 << 30, **kw) == 4 * 3  # max_sequences full-length
    with pytest.raises(BuildError) as info:
        size_pool_for_budget(TINY, "fp8_e4m3", limits, 23_492 + 3 * 2048 - 1, **kw)
    err = info.value
    assert err.code == "budget_too_small" and err.details["needed_bytes"] == 29_636
    assert err.details["budget_bytes"] == 29_635 and "29636" in err.message and "3 pages" in err.message
    with pytest.raises(BuildError, match="budget_too_small|too small"):
        size_pool_for_budget(TINY, "fp8_e4m3", limits, 10, **kw)


def test_pool_for_budget_holds_the_pinned_prefix_pages(stub_weights):
    limits = dataclasses.replace(TINY_LIMITS, num_pages=0)
    kw = dict(target_name="cpu", max_edges_per_node=5)
    assert prefix_pages(0, 16) == 0 and prefix_pages(16, 16) == 1 and prefix_pages(37, 16) == 3
    assert size_pool_for_budget(TINY, "fp8_e4m3", limits, 1 << 30, pinned_pages=3, **kw) == 4 * 3 + 3
    assert size_pool_for_budget(TINY, "fp8_e4m3", limits, 23_492 + 6 * 2048, pinned_pages=3, **kw) == 6
    with pytest.raises(BuildError) as info:  # one full sequence beside the pinned pages must fit
        size_pool_for_budget(TINY, "fp8_e4m3", limits, 23_492 + 5 * 2048, pinned_pages=3, **kw)
    assert info.value.details["needed_bytes"] == 23_492 + 6 * 2048


@pytest.mark.parametrize("text,expected", [
    ("24GiB", 24 * 2**30), ("512MB", 512 * 10**6), ("1.5G", 1_500_000_000), ("1.5GiB", 1_610_612_736),
    (" 2 kib ", 2048), ("4096", 4096), ("4096B", 4096), ("0.5Ki", 512), ("1T", 10**12), (123, 123), (0, 0),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "abc", "12XB", "-1G", "1.2.3G", "1e9", True, -5])
def test_parse_size_rejects(bad):
    with pytest.raises(BuildError) as info:
        parse_size(bad)
    assert info.value.code == "usage" and "expected" in info.value.message


# -- tiers -------------------------------------------------------------------------------------


@pytest.fixture
def stub_400mb(monkeypatch):
    monkeypatch.setattr(layout, "weight_specs", lambda config, fmt: [("w", "U8", (400_000_000,))])


def test_tiers_double_until_memory_runs_out(stub_400mb):
    budget = 24 << 30
    planned = plan_tiers(QWEN3_06B, "fp8_e4m3", budget, "h200")
    batch = [t for t in planned if t.name != "long"]
    assert len(batch) >= 3
    for i, tier in enumerate(batch):
        step = START_STEP_TOKENS << i
        lim = tier.limits
        assert (lim.max_tokens_per_step, lim.max_sequences, lim.prefill_chunk) == (step, step // 2, step // 2)
        assert lim.num_pages == lim.max_sequences * 34  # ceil((1024 + 64) / 32) pages each
        assert tier.memory == plan_memory(QWEN3_06B, "fp8_e4m3", lim, "h200")
        assert tier.memory.total_bytes <= budget
    nxt = 2 * batch[-1].limits.max_tokens_per_step
    nxt_limits = dataclasses.replace(batch[-1].limits, max_tokens_per_step=nxt, max_sequences=nxt // 2,
                                     prefill_chunk=min(nxt // 2, 1024), num_pages=nxt // 2 * 34)
    assert plan_memory(QWEN3_06B, "fp8_e4m3", nxt_limits, "h200").total_bytes > budget


def test_long_tier_is_the_longest_input_that_fits(stub_400mb):
    budget = 8 << 30
    long = plan_tiers(QWEN3_06B, "fp8_e4m3", budget, "h200")[-1]
    assert long.name == "long" and long.limits.max_sequences == LONG_SEQUENCES
    n = long.limits.max_input_tokens
    assert n % 32 == 0 and n > 1024 and long.memory.total_bytes <= budget
    longer = dataclasses.replace(long.limits, max_input_tokens=n + 32,
                                 num_pages=LONG_SEQUENCES * ((n + 32 + 64 + 31) // 32))
    assert plan_memory(QWEN3_06B, "fp8_e4m3", longer, "h200").total_bytes > budget
    # A huge budget stops at the model's positions.
    huge = plan_tiers(QWEN3_06B, "fp8_e4m3", 1 << 40, "h200")[-1]
    assert huge.limits.max_input_tokens == (40960 - 64) // 32 * 32


def test_tiers_refuse_a_budget_below_the_smallest_tier(stub_400mb):
    with pytest.raises(BuildError) as info:
        plan_tiers(QWEN3_06B, "fp8_e4m3", 500 << 20, "h200")
    assert info.value.code == "budget_too_small" and info.value.details["available_bytes"] == 500 << 20
    assert info.value.details["needed_bytes"] > 500 << 20


def test_tier_rows(stub_400mb):
    planned = plan_tiers(TINY, "bf16", 1 << 30, "cpu", page_size=16, max_input_tokens=64, max_output_tokens=8)
    rows = tier_rows(planned)
    assert len(rows) == len(planned) and all(len(r) == len(TIER_COLUMNS) for r in rows)
    first = dict(zip(TIER_COLUMNS, rows[0]))
    assert first["tier"] == "batch-16" and first["pages"] == 16 * 5
    assert first["weights"] == "381.5MiB"  # 400,000,000 bytes = 381.47 MiB, rounded up
    assert first["total"] == format_size(planned[0].memory.total_bytes)


@pytest.mark.parametrize("n, text", [(0, "0B"), (1023, "1023B"), (1024, "1.0KiB"), (1025, "1.1KiB"),
                                     ((1 << 20) - 1, "1024.0KiB"), (1 << 20, "1.0MiB"), (10_918_016, "10.5MiB"),
                                     (3 << 30, "3.00GiB"), ((3 << 30) + 1, "3.01GiB")])
def test_format_size_rounds_up_in_the_largest_fitting_unit(n, text):
    assert format_size(n) == text


# ---- default prefill chunks (builder/compile.py fit_prefill_chunk) ----
def chunk_options(target: str, budget: int | None = None, chunk: int | None = None, max_input: int = 1024):
    from toolcall.runtime.bundle.contract import BuildOptions
    return BuildOptions(precision="fp8_e4m3", target=target, max_sequences=8, max_input_tokens=max_input,
                        max_output_tokens=35, page_size=32, max_tokens_per_step=None, prefill_chunk=chunk,
                        memory_budget_bytes=budget, context_reserve_bytes=None, seed=0)


def fitted(options):
    """(limits, options) as `builder compile` plans them: defaults filled, then the chunk fitted."""
    from toolcall.builder.compile import fit_prefill_chunk, resolve_defaults
    return fit_prefill_chunk(options, resolve_defaults(options, grammar=None), QWEN3_06B, 32)


@pytest.mark.parametrize("target,max_input,chunk,step", [("h200", 1024, 512, 520), ("h200", 96, 96, 256),
                                                         ("cpu", 1024, 128, 256)])
def test_default_prefill_chunk_per_target(stub_weights, target, max_input, chunk, step):
    limits, options = fitted(chunk_options(target, max_input=max_input))
    assert (limits.prefill_chunk, limits.max_tokens_per_step) == (chunk, step)
    assert (options.prefill_chunk, options.max_tokens_per_step) == (chunk, step)  # recorded as built


def test_a_budget_too_small_for_512_takes_the_largest_chunk_that_fits(stub_weights):
    """A budget holding the 128-chunk step's workspace and one sequence, but not the 256 one's: chunk 128, and
    the options record it; a chunk given by the user is not changed but refused."""
    small = Limits(page_size=32, num_pages=0, max_sequences=8, max_tokens_per_step=256, prefill_chunk=128,
                   max_input_tokens=1024, max_output_tokens=35)
    one_sequence = small.pages_per_sequence * 32 * kv_bytes_per_token(QWEN3_06B)
    budget = plan_memory(QWEN3_06B, "fp8_e4m3", small, "h200", CONTEXT_RESERVE_BYTES_GPU, 32).total_bytes \
        + one_sequence
    limits, options = fitted(chunk_options("h200", budget))
    assert (limits.prefill_chunk, limits.max_tokens_per_step, options.prefill_chunk) == (128, 256, 128)
    assert limits.num_pages == small.pages_per_sequence
    with pytest.raises(BuildError) as e:
        fitted(chunk_options("h200", budget, chunk=512))
    assert e.value.code == "budget_too_small"


def test_tiers_cap_the_prefill_chunk_at_512(stub_weights):
    tiers = plan_tiers(QWEN3_06B, "fp8_e4m3", 80 << 30, "h200")
    assert max(t.limits.prefill_chunk for t in tiers) == 512
    assert all(t.limits.prefill_chunk == min(t.limits.max_tokens_per_step // 2, 512, t.limits.max_input_tokens)
               for t in tiers)
