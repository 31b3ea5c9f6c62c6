"""The bundle's layout by formula, shared by the builder's memory plan and the runtime's load
checks (runtime/bundle/checks.py), so both compute the same numbers from the same shapes:
weights.safetensors' tensors, the KV pool's bytes and the step workspace's buffers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from toolcall.common.formats import KV_BF16, KvFormat, WeightFormat
from toolcall.kernels.geometry import attention_max_splits, decode_max_splits
from toolcall.runtime.bundle.contract import CPU_TARGET, Limits
from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.bundle.tensor_file import DTYPES

F32 = 4  # float32 activations
_QUANTIZED = re.compile(r"^model\.layers\.\d+\.(?:[\w.]+\.)?(?:q|k|v|o|gate|up|down)_proj\.weight$")


def is_quantized(name: str, fmt: WeightFormat) -> bool:
    """The one rule: a decoder layer's linear weight takes a quantized build format; every other tensor
    (embedding, lm_head, norms, biases) is stored BF16."""
    return fmt.quantized and _QUANTIZED.match(name) is not None


def weight_specs(config: ModelConfig, fmt: WeightFormat) -> list[tuple[str, str, tuple[int, ...]]]:
    """weights.safetensors' layout [(name, safetensors dtype, shape)] in file order, from shapes alone:
    quantized linears as ``fmt`` stores them (the weight, then its scales), every other tensor BF16.
    builder/quantize.py writes exactly this."""
    specs: list[tuple[str, str, tuple[int, ...]]] = []
    for name, shape in config.tensor_shapes().items():
        specs += fmt.stored(name, shape) if is_quantized(name, fmt) else [(name, "BF16", shape)]
    return specs


def weights_bytes(config: ModelConfig, fmt: WeightFormat) -> int:
    """Tensor data bytes of weights.safetensors."""
    return sum(int(np.prod(shape, dtype=object)) * DTYPES[dtype].itemsize
               for _, dtype, shape in weight_specs(config, fmt))


def kv_bytes_per_token(config: ModelConfig, kv: KvFormat = KV_BF16) -> int:
    """K and V of every layer for one token: num_layers * 2 * num_kv_heads * head_dim elements."""
    return config.num_layers * 2 * config.num_kv_heads * config.head_dim * kv.itemsize


def kv_scales_bytes(config: ModelConfig, kv: KvFormat = KV_BF16) -> int:
    """A scaled format's per-(layer, kv head) float32 K and V scales (runtime/bundle/kv_scales.py); else 0."""
    return 2 * config.num_layers * config.num_kv_heads * 4 if kv.scaled else 0


def kv_pool_bytes(config: ModelConfig, num_pages: int, page_size: int, kv: KvFormat = KV_BF16) -> int:
    """Bytes of a KV pool of num_pages pages of page_size tokens, with its scales (a scaled format)."""
    return num_pages * page_size * kv_bytes_per_token(config, kv) + kv_scales_bytes(config, kv)


def attention_splits(limits: Limits) -> int:
    """Prefill attention splits (ATTN_SPLIT positions each) of the longest context (max_input +
    max_output tokens), as the kernels cut it; each leaves a partial output (head_dim) plus its
    running max and sum per row and query head."""
    return attention_max_splits(limits.max_input_tokens + limits.max_output_tokens)


@dataclass(frozen=True)
class AttentionPartials:
    """The split-K attention partials buffer, part_o [rows, heads, splits, head_dim] then part_ml [rows, heads,
    splits, 2] float32, laid out for one of two launches that never share it: the prefill partials (T =
    max_tokens_per_step rows of ATTN_SPLIT-position splits) or the decode kernel's finer splits (flash-decoding)
    of min(T, max_sequences) rows."""

    rows: int
    splits: int
    decode_rows: int
    decode_splits: int

    @classmethod
    def of(cls, limits: Limits) -> "AttentionPartials":
        t, positions = limits.max_tokens_per_step, limits.max_input_tokens + limits.max_output_tokens
        return cls(t, attention_max_splits(positions), min(t, limits.max_sequences), decode_max_splits(positions))

    def bytes(self, config: ModelConfig) -> int:
        slots = max(self.rows * self.splits, self.decode_rows * self.decode_splits)
        return slots * config.num_heads * (config.head_dim + 2) * F32


def attention_partials_bytes(config: ModelConfig, limits: Limits) -> int:
    """Bytes of the attention partials buffer (AttentionPartials)."""
    return AttentionPartials.of(limits).bytes(config)


def workspace_breakdown(config: ModelConfig, limits: Limits, max_edges_per_node: int | None = None,
                        target_name: str | None = None) -> dict[str, int]:
    """Bytes of each float32 step buffer, by name, for T = max_tokens_per_step rows (target
    ``cpu``: the fast CPU backend's buffers; otherwise the CUDA backend's).

    Only sampled rows reach the head: a step samples at most one token per sequence (a prefill
    chunk only at its last row), so the head's logits have R = min(T, max_sequences) rows.
    ``max_edges_per_node`` unknown (no catalog yet): bounded by vocab_size.
    """
    t = limits.max_tokens_per_step
    r = min(t, limits.max_sequences)
    edges = config.vocab_size if max_edges_per_node is None else max_edges_per_node
    h, i = config.hidden_size, config.intermediate_size
    if target_name == CPU_TARGET:
        # [T, heads, max_input + max_output]: each row's scores over its positions (attention_kernels.attention)
        attention = {"attn_scores": t * config.num_heads * (limits.max_input_tokens + limits.max_output_tokens) * F32}
    else:
        # [rows, heads, splits, head_dim + 2]: partial outputs, running max and sum per split
        attention = {"attn_partials": attention_partials_bytes(config, limits),
                     "rope": t * config.head_dim * F32}  # [T, head_dim / 2, 2] the step's (cos, sin) pairs
    return {
        "hidden": t * h * F32,  # [T, hidden] residual stream
        "normed": t * h * F32,  # [T, hidden] RMSNorm output; reused for o_proj/down_proj output
        "q": t * config.q_dim * F32,  # [T, heads, head_dim]
        "k": t * config.kv_dim * F32,  # [T, kv_heads, head_dim] before the bf16 cache write
        "v": t * config.kv_dim * F32,  # [T, kv_heads, head_dim]
        "attn_out": t * config.q_dim * F32,  # [T, heads, head_dim]
        "gate": t * i * F32,  # [T, intermediate]; silu(gate) * up written in place
        "up": t * i * F32,  # [T, intermediate]
        **attention,
        "logits_sparse": r * edges * F32,  # [R, max_edges_per_node] allowed edges only
        "logits_dense": r * config.vocab_size * F32,  # [R, vocab] cross-check head
    }
