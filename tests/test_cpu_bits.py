"""Batch independence on bits: a request's logits and tokens are the same alone, beside 1, 7 or 31
others, and with its prefill cut into different chunks, on both CPU backends."""
from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from toolcall.runtime.batching.batcher import Request, Result
from toolcall.runtime.bundle.contract import Limits
from toolcall.runtime.bundle.files import GRAMMAR_FILE, TOKENIZER_FILE, WEIGHTS_FILE, read_contract
from toolcall.runtime.cpu import CPU_BACKENDS
from toolcall.runtime.cpu.backend import cpu_batcher, load_cpu_weights
from toolcall.runtime.grammar.trie import Grammar

REQUESTS = ["Book a flight to Paris", "What's the weather in Oslo tomorrow?", "Send an email to Bob",
            "Convert 20 euros to yen", "Remind me to call Alice on Friday", "Find a hotel in Rome",
            "Play some music", "Translate this note to French and share it with Carol"]


@pytest.fixture(scope="module", params=CPU_BACKENDS)
def parts(request, tiny_bundle):
    contract = read_contract(tiny_bundle)
    grammar = Grammar.read(tiny_bundle / GRAMMAR_FILE)
    tok = Tokenizer.from_file(str(tiny_bundle / TOKENIZER_FILE))
    prompts = [tuple(tok.encode(grammar.render_prompt(r)).ids) for r in REQUESTS]
    weights = load_cpu_weights(tiny_bundle / WEIGHTS_FILE, contract.model, request.param)
    return contract.model, weights, grammar, prompts


def make(parts, prefill_chunk=64, max_tokens_per_step=128):
    cfg, weights, grammar, _ = parts
    limits = Limits(page_size=16, num_pages=0, max_sequences=32, max_tokens_per_step=max_tokens_per_step,
                    prefill_chunk=prefill_chunk, max_input_tokens=96, max_output_tokens=grammar.max_answer_tokens)
    limits = Limits(**{**limits.__dict__, "num_pages": 32 * limits.pages_per_sequence})
    return cpu_batcher(cfg, weights, grammar, limits)


def observed(result: Result) -> tuple[list[int], list[bytes]]:
    """Token ids and each step's allowed-candidate logits as raw bytes (padding dropped: its width is the batch's)."""
    assert isinstance(result, Result)
    logits = [lg[c >= 0].tobytes() for lg, c in zip(result.step_logits, result.step_candidates)]
    return result.token_ids, logits


@pytest.fixture(scope="module")
def alone(parts):
    gen = make(parts)
    return [observed(gen.generate([Request(p, keep_logits=True)])[0]) for p in parts[3]]


@pytest.mark.parametrize("others,seed", [(1, 0), (7, 1), (31, 2)])
def test_same_bits_beside_others(parts, alone, others, seed):
    prompts = parts[3]
    rng = np.random.default_rng(seed)
    batch = [int(i) for i in rng.integers(0, len(prompts), others + 1)]
    results = make(parts).generate([Request(prompts[i], keep_logits=True) for i in batch])
    for i, res in zip(batch, results):
        tokens, logits = observed(res)
        assert tokens == alone[i][0]
        assert logits == alone[i][1], f"request {i}: logits bits differ beside {others} others"


@pytest.mark.parametrize("chunk,step", [(1, 128), (7, 128), (16, 20), (64, 64)])
def test_same_bits_in_any_prefill_chunking(parts, alone, chunk, step):
    prompts = parts[3]
    gen = make(parts, prefill_chunk=chunk, max_tokens_per_step=step)
    results = gen.generate([Request(p, keep_logits=True) for p in prompts[:4]])
    for i, res in enumerate(results):
        assert observed(res) == alone[i], f"request {i}: prefill in chunks of {chunk} changes the bits"


def test_requests_really_shared_steps(parts):
    """The batch tests above are only meaningful if rows of several sequences share steps."""
    gen = make(parts)
    sizes = []
    forward = gen.model.forward
    gen.model.forward = lambda tokens, *a, **k: (sizes.append(len(tokens)), forward(tokens, *a, **k))[1]
    try:
        gen.generate([Request(p) for p in parts[3]])
    finally:
        gen.model.forward = forward
    assert max(sizes) > 64 and min(sizes) < 8


def test_output_rows_have_the_full_passs_bits(parts):
    """forward(..., outputs=rows) returns those rows of the full pass, bit for bit (the fast backend runs
    the last layer's attention and MLP on them alone), and stores the same K/V for every row."""
    gen = make(parts)
    model, kv, prompt = gen.model, gen.kv, parts[3][7]
    n = len(prompt)
    slot = kv.admit(n + 4)
    args = np.asarray(prompt, np.int64), np.full(n, slot, np.int64), np.arange(n, dtype=np.int64), kv
    full = model.forward(*args).copy()
    keys = [k.copy() for k in kv.k]
    for rows in ([], [n - 1], [0, 3, n - 1], list(range(n))):
        got = model.forward(*args, outputs=np.asarray(rows, np.int64))
        assert got.shape == (len(rows), full.shape[1])
        assert got.tobytes() == full[rows].tobytes()
        assert all(np.array_equal(a, b) for a, b in zip(keys, kv.k))


@pytest.mark.parametrize("k,n", [(64, 192), (192, 64), (256, 768), (32, 64)])
def test_a_prompt_row_has_the_same_bits_at_every_place_in_its_gemm_block(k, n):
    """The reference backend's gemm_rows is probed on this machine's BLAS (OpenBLAS's Zen sgemm
    rounds rows 0-5 of a 16-row block one way and 6-15 another); at the probed size a row's bits
    do not depend on its place among the other prompt rows."""
    from toolcall.runtime.cpu.model import blocked_matmul, stable_gemm_rows
    rows = stable_gemm_rows(((k, n, True),))
    rng = np.random.default_rng(1)
    w = rng.standard_normal((n, k), dtype=np.float32)
    x = rng.standard_normal((3 * rows, k), dtype=np.float32)
    first = blocked_matmul(x[:1], w, rows)[0]
    for place in range(3 * rows):
        others = rng.standard_normal((3 * rows, k), dtype=np.float32)
        others[place] = x[0]
        assert np.array_equal(blocked_matmul(others, w, rows)[place], first), f"place {place} of {rows}-row blocks"
