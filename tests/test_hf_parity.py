"""The CPU reference backend against Hugging Face transformers (torch, CPU, float32).

64-token prompt, then 32 greedy decode steps: logits within 1e-3 of max |logit| and
identical greedy tokens. A step whose reference top-2 margin is under MARGIN_TOL is a
near-tie: reported apart, not failed (two float32 paths may legitimately order it apart).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from toolcall.builder.checkpoint import open_checkpoint
from toolcall.common.formats import KV_FP32
from toolcall.runtime.cpu.kv_pool import PagedKVPool
from toolcall.runtime.cpu.model import CpuModel

transformers = pytest.importorskip("transformers")

PROMPT_TOKENS, DECODE_STEPS = 64, 32
REL_TOL = 1e-3
MARGIN_TOL = 1e-4

# family, query heads per KV head (tiny has 4 query heads), tied head, page size
CASES = [
    ("qwen3", 1, True, 16), ("qwen3", 2, False, 32), ("qwen3", 4, True, 32),
    ("qwen2", 1, False, 16), ("qwen2", 2, True, 32), ("qwen2", 4, False, 16),
    ("llama", 1, True, 32), ("llama", 2, False, 16), ("llama", 4, True, 16),
]


def hf_greedy(folder, prompt: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt logits (P, V) and the logits of each greedy step (steps, V), from transformers."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor(prompt)[None]
    with torch.no_grad():
        out = model(ids, use_cache=True)
        prompt_logits = out.logits[0].numpy()
        past, step_logits = out.past_key_values, [prompt_logits[-1]]
        for _ in range(steps - 1):
            nxt = torch.tensor([[int(np.argmax(step_logits[-1]))]])
            out = model(nxt, past_key_values=past, use_cache=True)
            past = out.past_key_values
            step_logits.append(out.logits[0, -1].numpy())
    return prompt_logits, np.stack(step_logits)


@pytest.mark.parametrize("family,ratio,tied,page_size", CASES)
def test_reference_matches_transformers(make_checkpoint, family, ratio, tied, page_size):
    folder = make_checkpoint(family=family, num_kv_heads=4 // ratio, tie_word_embeddings=tied)
    ckpt = open_checkpoint(folder)
    cfg = ckpt.config
    model = CpuModel(cfg, ckpt.weights_f32())
    prompt = np.random.default_rng(7).integers(3, 3000, PROMPT_TOKENS)
    ref_prompt, ref_steps = hf_greedy(folder, prompt, DECODE_STEPS)

    pool = PagedKVPool(cfg, num_pages=8, page_size=page_size, max_seqs=1,
                       max_tokens_per_seq=PROMPT_TOKENS + DECODE_STEPS, kv_format=KV_FP32)
    slot = pool.admit(PROMPT_TOKENS + DECODE_STEPS)
    hidden = model.forward(prompt, np.full(PROMPT_TOKENS, slot), np.arange(PROMPT_TOKENS), pool)
    logits = model.dense_logits(hidden)
    scale = np.abs(ref_prompt).max()
    assert np.abs(logits - ref_prompt).max() <= REL_TOL * scale

    near_ties = []
    step_logits = logits[-1]
    for step in range(DECODE_STEPS):
        ref = ref_steps[step]
        assert np.abs(step_logits - ref).max() <= REL_TOL * np.abs(ref).max(), f"step {step}"
        top2 = np.sort(ref)[-2:]
        if top2[1] - top2[0] < MARGIN_TOL:
            near_ties.append(step)
            break  # past a near-tie the two paths may follow different tokens
        token = int(np.argmax(step_logits))
        assert token == int(np.argmax(ref)), f"greedy token differs at step {step}"
        if step + 1 < DECODE_STEPS:
            pos = PROMPT_TOKENS + step
            hidden = model.forward(np.array([token]), np.array([slot]), np.array([pos]), pool)
            step_logits = model.dense_logits(hidden)[0]
    if near_ties:
        print(f"near-tie steps (margin < {MARGIN_TOL}), compared up to there: {near_ties}")
