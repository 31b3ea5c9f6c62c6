"""A minimal Qwen3 for training the catalog-reading model: RMSNorm, q/k norm, rotary, grouped-query
attention, SwiGLU, tied embeddings; it takes a bool attention mask and explicit position ids, so one row
packs a catalog prefix and many requests that each see only the prefix and themselves.

Parameter names are Hugging Face's: ``to_hf`` loads the state dict into ``Qwen3ForCausalLM`` unchanged.
An attention layer with ``capture = True`` computes its softmax explicitly and keeps head 0's
probabilities [B, T, T] in ``probs`` for the training-only attention losses.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from toolcall.models.recipe.train import MODEL

HEAD_DIM = MODEL["head_dim"]  # 64: the smallest head the GPU attention kernels take
ROPE_THETA = MODEL["rope_theta"]
# A shape's keys and their Qwen3Config names.
HF_NAMES = dict(vocab="vocab_size", hidden="hidden_size", mlp="intermediate_size", layers="num_hidden_layers",
                heads="num_attention_heads", kv="num_key_value_heads")

class RMSNorm(nn.Module):
    def __init__(self, dim, eps=MODEL["rms_norm_eps"]):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.kv = c["heads"], c["kv"]
        self.q_proj = nn.Linear(c["hidden"], self.h * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(c["hidden"], self.kv * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(c["hidden"], self.kv * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(self.h * HEAD_DIM, c["hidden"], bias=False)
        self.q_norm = RMSNorm(HEAD_DIM)
        self.k_norm = RMSNorm(HEAD_DIM)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.h, HEAD_DIM)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.kv, HEAD_DIM)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv, HEAD_DIM).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.kv != self.h:
            k = k.repeat_interleave(self.h // self.kv, dim=1)
            v = v.repeat_interleave(self.h // self.kv, dim=1)
        if getattr(self, "capture", False):
            s = (q @ k.transpose(-1, -2)) / HEAD_DIM ** 0.5
            s = s.masked_fill(~mask, float("-inf"))
            p = s.softmax(-1)
            self.probs = p[:, 0]
            o = p @ v
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.h * HEAD_DIM))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["hidden"], c["mlp"], bias=False)
        self.up_proj = nn.Linear(c["hidden"], c["mlp"], bias=False)
        self.down_proj = nn.Linear(c["mlp"], c["hidden"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden"])
        self.post_attention_layernorm = RMSNorm(c["hidden"])

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"])


class Qwen3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        inv = 1.0 / (ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        self.register_buffer("inv_freq", inv, persistent=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)

    def hidden(self, ids, pos, mask, keep=False):
        """ids, pos [B, T] long; mask [B, 1, T, T] bool (True: attend). Final-normed hidden states."""
        f = pos[..., None].float() * self.inv_freq  # B T 32
        emb = torch.cat((f, f), -1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        x = self.model.embed_tokens(ids)
        mids = []
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
            mids.append(x)
        return (self.model.norm(x), mids) if keep else self.model.norm(x)

    def logits_at(self, h):
        return h @ self.model.embed_tokens.weight.T


def hf_config(c):
    """The Qwen3Config of shape ``c``: train.MODEL (the shipped model's token ids, norms and rotary) resized."""
    from transformers import Qwen3Config
    return Qwen3Config(**{**MODEL, **{HF_NAMES[k]: v for k, v in c.items()}})


def to_hf(model: Qwen3):
    from transformers import Qwen3ForCausalLM
    hf = Qwen3ForCausalLM(hf_config(model.c))
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    hf.tie_weights()
    hf.eval()
    return hf
