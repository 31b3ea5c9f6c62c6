"""The model families, one registry (as the weight formats are one in common/formats.py): ``FAMILIES``.

A family is one entry: its name (config.json's ``model_type``, ``ModelConfig.family``, the contract's
``model.family``, ``builder synth --family``), the architecture transformers writes for it, the features
that set it apart from the others, and the config.json keys transformers writes for it. All three are
Llama-style decoders with the same Hugging Face tensor names (``LINEAR_NAMES``, ``HEAD_NORM_NAMES``):

  family  q/k norm  q/k/v bias              head_dim              rotary scaling  config.json defaults
  qwen3   yes       attention_bias (false)  head_dim              none            tied false, theta 10000
  qwen2   no        always                  hidden / heads        none            tied false, theta 10000
  llama   no        attention_bias (false)  head_dim (or h / n)   llama3          tied false, theta 10000

No code outside this module compares a family's name or lists the families (tests/test_families.py reads
the tree, and checks the contract schema's enum of families against this registry): adding a family that
differs only in these features is one entry here and its name in that enum.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# a decoder layer's linear weights by role, Hugging Face names (``model.layers.N.<name>.weight``)
LINEAR_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
HEAD_NORM_NAMES = ("self_attn.q_norm", "self_attn.k_norm")  # RMSNorm weights [head_dim] of q/k norm families


@dataclass(frozen=True)
class ModelFamily:
    """One family (module docstring). ``qkv_bias``: True, q/k/v always carry biases; None, config.json's
    ``attention_bias`` says (default false). ``head_dim_from_heads``: head_dim is hidden_size / heads (the
    family's config has no head_dim; synthetic checkpoints follow it). ``rope_scaling``: the scaling type its
    synthetic checkpoints use (real configs state theirs). ``default_tied`` / ``default_rope_theta``:
    what a config.json that omits ``tie_word_embeddings`` / ``rope_theta`` means. ``hf_keys``: config.json
    keys transformers writes for this family beside the shared ones (synthetic checkpoints)."""

    name: str
    architecture: str
    qk_norm: bool
    qkv_bias: bool | None
    head_dim_from_heads: bool
    rope_scaling: str | None
    default_tied: bool
    default_rope_theta: float
    hf_keys: Mapping[str, object] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"ModelFamily({self.name})"

    @property
    def head_norm_names(self) -> tuple[str, ...]:
        """Per-layer q/k norm weight names (empty without q/k norm)."""
        return HEAD_NORM_NAMES if self.qk_norm else ()

    def has_qkv_bias(self, attention_bias: bool) -> bool:
        """Whether q/k/v carry biases, given config.json's ``attention_bias`` (default false)."""
        return True if self.qkv_bias else bool(attention_bias)


QWEN3 = ModelFamily("qwen3", "Qwen3ForCausalLM", qk_norm=True, qkv_bias=None, head_dim_from_heads=False,
                    rope_scaling=None, default_tied=False, default_rope_theta=10000.0,
                    hf_keys={"attention_bias": False, "use_sliding_window": False, "sliding_window": None,
                             "rope_scaling": None})
QWEN2 = ModelFamily("qwen2", "Qwen2ForCausalLM", qk_norm=False, qkv_bias=True, head_dim_from_heads=True,
                    rope_scaling=None, default_tied=False, default_rope_theta=10000.0,
                    hf_keys={"use_sliding_window": False, "sliding_window": None, "rope_scaling": None})
LLAMA = ModelFamily("llama", "LlamaForCausalLM", qk_norm=False, qkv_bias=None, head_dim_from_heads=False,
                    rope_scaling="llama3", default_tied=False, default_rope_theta=10000.0,
                    hf_keys={"attention_bias": False, "mlp_bias": False})

FAMILIES: tuple[ModelFamily, ...] = (QWEN3, QWEN2, LLAMA)
FAMILY_NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES)
_BY_NAME = {f.name: f for f in FAMILIES}


def family(name: str) -> ModelFamily:
    """The family named ``name``; KeyError listing the known ones otherwise."""
    found = _BY_NAME.get(name)
    if found is None:
        raise KeyError(f"no model family {name!r}; known: {', '.join(FAMILY_NAMES)}")
    return found

