"""The model section of a bundle: architecture sizes shared by builder, contract and backends."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from toolcall.runtime.bundle.families import HEAD_NORM_NAMES, LINEAR_NAMES


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling ("rope_type": "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """Decoder architecture; ``family`` names a runtime/bundle/families.py entry, whose features the builder
    wrote into ``qkv_bias`` and ``qk_norm`` (the contract records them, so the runtime reads no registry)."""

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
        shapes = {"q": (self.q_dim, h), "k": (self.kv_dim, h), "v": (self.kv_dim, h), "o": (h, self.q_dim),
                  "gate": (i, h), "up": (i, h), "down": (h, i)}
        return {LINEAR_NAMES[role]: shape for role, shape in shapes.items()}

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of a checkpoint in Hugging Face names, in a fixed order."""
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, self.hidden_size)}
        for layer in range(self.num_layers):
            p = f"model.layers.{layer}."
            shapes[p + "input_layernorm.weight"] = (self.hidden_size,)
            for suffix, shape in self.linear_shapes().items():
                shapes[p + suffix + ".weight"] = shape
                if self.qkv_bias and suffix in (LINEAR_NAMES["q"], LINEAR_NAMES["k"], LINEAR_NAMES["v"]):
                    shapes[p + suffix + ".bias"] = (shape[0],)
            if self.qk_norm:
                for norm in HEAD_NORM_NAMES:
                    shapes[p + norm + ".weight"] = (self.head_dim,)
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
