"""The model section of a bundle: architecture sizes shared by builder, contract and backends."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

FAMILIES = ("qwen3", "qwen2", "llama")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling ("rope_type": "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """Decoder architecture. Families differ only in ``qkv_bias`` and ``qk_norm``."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        if d.get("rope_scaling") is not None:
            d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
        d["eos_token_ids"] = tuple(d["eos_token_ids"])
        return cls(**d)

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """Per-layer linear weights, suffix -> [out, in] (the quantized ones)."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "self_attn.q_proj": (self.q_dim, h),
            "self_attn.k_proj": (self.kv_dim, h),
            "self_attn.v_proj": (self.kv_dim, h),
            "self_attn.o_proj": (h, self.q_dim),
            "mlp.gate_proj": (i, h),
            "mlp.up_proj": (i, h),
            "mlp.down_proj": (h, i),
        }

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of a checkpoint in Hugging Face names, in a fixed order."""
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, self.hidden_size)}
        for layer in range(self.num_layers):
            p = f"model.layers.{layer}."
            shapes[p + "input_layernorm.weight"] = (self.hidden_size,)
            for suffix, shape in self.linear_shapes().items():
                shapes[p + suffix + ".weight"] = shape
                if self.qkv_bias and suffix in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                    shapes[p + suffix + ".bias"] = (shape[0],)
            if self.qk_norm:
                shapes[p + "self_attn.q_norm.weight"] = (self.head_dim,)
                shapes[p + "self_attn.k_norm.weight"] = (self.head_dim,)
            shapes[p + "post_attention_layernorm.weight"] = (self.hidden_size,)
        shapes["model.norm.weight"] = (self.hidden_size,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, self.hidden_size)
        return shapes

    def param_count(self) -> int:
        total = 0
        for shape in self.tensor_shapes().values():
            n = 1
            for s in shape:
                n *= s
            total += n
        return total
