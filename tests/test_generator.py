"""The decode loop on the CPU backend: batch independence, sparse/dense head agreement, admission."""
from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from toolcall.builder.catalog import load_catalog
from toolcall.builder.checkpoint import open_checkpoint
from toolcall.builder.trie import build_grammar
from toolcall.common.errors import RequestError
from toolcall.runtime.batching.batcher import Request, Result
from toolcall.runtime.batching.sampling import Sampling
from toolcall.runtime.bundle.contract import Limits
from toolcall.runtime.cpu.backend import cpu_batcher

REQUESTS = ["Book a flight to Paris", "What's the weather in Oslo tomorrow?", "Send an email to Bob",
            "Convert 20 euros to yen", "Remind me to call Alice on Friday", "Find a hotel in Rome",
            "Play some music", "Translate this note to French"]


@pytest.fixture(scope="module")
def parts(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    tok = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    grammar = build_grammar(load_catalog("builder/data/tools-64.json"), tok, ckpt.config.eos_token_ids[0])
    prompts = [tuple(tok.encode(grammar.render_prompt(r)).ids) for r in REQUESTS]
    return ckpt.config, ckpt.weights_f32(), grammar, prompts


def make(parts, max_sequences=33, num_pages=None, max_tokens_per_step=64, prefill_chunk=16, head="sparse"):
    cfg, weights, grammar, _ = parts
    limits = Limits(page_size=16, num_pages=0, max_sequences=max_sequences, max_tokens_per_step=max_tokens_per_step,
                    prefill_chunk=prefill_chunk, max_input_tokens=64, max_output_tokens=grammar.max_answer_tokens)
    pages = num_pages if num_pages is not None else max_sequences * limits.pages_per_sequence
    limits = Limits(**{**limits.__dict__, "num_pages": pages})
    return cpu_batcher(cfg, weights, grammar, limits, head=head)


@pytest.fixture(scope="module")
def alone(parts):
    gen = make(parts)
    return [gen.generate([Request(p)])[0].token_ids for p in parts[3]]


@pytest.mark.parametrize("others,seed", [(1, 0), (7, 1), (32, 2)])
def test_output_does_not_depend_on_the_batch(parts, alone, others, seed):
    rng = np.random.default_rng(seed)
    prompts = parts[3]
    batch = [int(i) for i in rng.integers(0, len(prompts), others + 1)]
    results = make(parts).generate([Request(prompts[i]) for i in batch])
    for i, res in zip(batch, results):
        assert isinstance(res, Result) and res.token_ids == alone[i]
        assert res.finish == "done" and 1 <= len(res.tools) <= 4 and len(set(res.tools)) == len(res.tools)


def test_sparse_and_dense_heads_pick_the_same_tokens(parts, alone):
    results = make(parts, head="check").generate([Request(p) for p in parts[3]])  # raises on any disagreement
    assert [r.token_ids for r in results] == alone
    dense = make(parts, head="dense").generate([Request(p) for p in parts[3]])
    assert [r.token_ids for r in dense] == alone


def test_refused_requests_leave_others_unchanged(parts, alone):
    prompts = parts[3]
    bad = [Request(tuple(range(3, 3 + 65))), Request(()), Request((10**7,)), Request(prompts[0], Sampling(top_p=0))]
    mixed = [bad[0], Request(prompts[1]), bad[1], Request(prompts[2]), bad[2], bad[3], Request(prompts[3])]
    results = make(parts).generate(mixed)
    codes = [r.code if isinstance(r, RequestError) else None for r in results]
    assert codes == ["prompt_too_long", None, "request_invalid", None, "request_invalid", "request_invalid", None]
    assert [results[i].token_ids for i in (1, 3, 6)] == [alone[1], alone[2], alone[3]]
    assert results[0].details == {"limit": 64, "got": 65}


def test_admission_refuses_or_queues_when_short_of_slots_and_pages(parts, alone):
    prompts = parts[3]
    refusing = make(parts, max_sequences=2).generate([Request(p) for p in prompts[:3]], queue=False)
    assert [getattr(r, "code", None) for r in refusing] == [None, None, "too_many_sequences"]
    need = [-(-(len(p) + parts[2].max_answer_tokens) // 16) for p in prompts[:2]]  # pages of 16 tokens
    pool_pages = need[0] + need[1] - 1
    gen = make(parts, max_sequences=4, num_pages=pool_pages)
    refused = gen.generate([Request(p) for p in prompts[:2]], queue=False)
    assert refused[1].code == "kv_pages" and refused[1].details == {"needed": need[1], "free": need[1] - 1}
    queued = gen.generate([Request(p) for p in prompts[:4]])
    assert [r.token_ids for r in queued] == alone[:4]
    assert gen.kv.free_pages == pool_pages and gen.kv.free_slots == 4


def test_sampling_is_deterministic_per_seed_and_batch_independent(parts):
    prompts = parts[3]
    s = Sampling(temperature=1.5, top_p=0.9, seed=11)
    one = make(parts).generate([Request(prompts[0], s)])[0].token_ids
    batched = make(parts).generate([Request(prompts[1], Sampling(1.0, 1.0, 5)), Request(prompts[0], s)])[1].token_ids
    assert one == batched
    seeds = {tuple(make(parts).generate([Request(prompts[0], Sampling(2.0, 1.0, k))])[0].token_ids) for k in range(6)}
    assert len(seeds) > 1  # the seed matters


def test_keep_logits_records_each_steps_candidates(parts):
    gen = make(parts)
    prompt = parts[3][0]
    plain, kept = gen.generate([Request(prompt), Request(prompt, keep_logits=True)])
    assert plain.step_logits is None and kept.token_ids == plain.token_ids
    assert len(kept.step_logits) == len(kept.token_ids) == len(kept.step_candidates)
    for logits, cand, token in zip(kept.step_logits, kept.step_candidates, kept.token_ids):
        assert logits.dtype == np.float32 and logits.shape == cand.shape
        allowed = cand >= 0
        assert cand[np.argmax(np.where(allowed, logits, -np.inf))] == token  # greedy picked from these


@pytest.mark.parametrize("max_output_tokens", [None, 3, 5])  # None: the grammar's longest answer
def test_a_sampled_answer_is_the_same_a_step_a_token(parts, max_output_tokens):
    """keep_logits steps one token a step (every token its own pick); otherwise the grammar's forced tokens
    ride after a pick, without draws: a pick's draw is keyed by its index in the answer, so the same answer,
    also when max_output_tokens cuts a forced run short."""
    gen, prompts = make(parts), parts[3]
    if max_output_tokens is not None:
        gen.max_output_tokens = gen.scheduler.max_output_tokens = max_output_tokens
    requests = [Request(p, Sampling(1.5, 0.95, seed)) for seed, p in enumerate(prompts[:4] * 2)]
    plain = gen.generate(requests)
    kept = gen.generate([Request(r.prompt_ids, r.sampling, keep_logits=True) for r in requests])
    assert [r.token_ids for r in kept] == [r.token_ids for r in plain]
    assert all(0 <= r.ttft_s <= r.total_s for r in plain + kept)  # the first token's time: its pick's
    if max_output_tokens is not None:
        assert all(len(r.token_ids) <= max_output_tokens for r in plain)
        assert any(r.finish == "length" for r in plain)
    forced = 0  # tokens the grammar forced (one allowed), which the plain run appended after a pick
    for r in plain:
        state = gen.stepper.initial_state()
        for token in r.token_ids:
            forced += len(gen.stepper.allowed(state)[0]) == 1
            state = gen.stepper.advance(state, token)
    assert forced > 0


@pytest.mark.parametrize("sampling", [Sampling(1e-320), Sampling(float("nan")), Sampling(float("inf")),
                                      Sampling(0.5, top_p=0.0), Sampling(0.5, top_p=float("nan")), Sampling(seed=-1)])
def test_every_request_path_refuses_bad_sampling(parts, sampling):
    """The CLI's rule (runtime run) holds for any caller of the generator, the server included."""
    (res,) = make(parts).generate([Request(parts[3][0], sampling)])
    assert isinstance(res, RequestError) and res.code == "request_invalid" and "sampling" in res.message


def test_the_draw_is_compiled_at_load_in_the_one_signature_steps_use(parts, monkeypatch):
    """The generator calls draw_rows while it is built, with the argument types (numba's signature) that
    every sampled step then uses: numba compiles, or loads from its cache, at load, not at a first pick."""
    import numba

    from toolcall.runtime.batching import sampling
    calls, compiled = [], sampling.draw_rows

    def recording(*args):
        calls.append(tuple(numba.typeof(a) for a in args))
        return compiled(*args)

    monkeypatch.setattr(sampling, "draw_rows", recording)
    gen = make(parts)
    at_load = set(calls)
    assert len(at_load) == 1
    gen.generate([Request(p, Sampling(0.9, 0.95, i)) for i, p in enumerate(parts[3][:3])])
    assert len(calls) > 1 and set(calls) == at_load


@pytest.mark.parametrize("max_tokens_per_step", [64, 9])
def test_forced_tokens_ride_in_fewer_steps_with_the_same_answers(parts, max_tokens_per_step):
    """Forced runs appended after a pick (keep_logits off) give what one token a step gives (keep_logits
    on): tokens, tools, finish and margins, greedy and sampled, a tools subset, a cut by max_output_tokens;
    in fewer steps, and no more rows (a forced last token, END among them, is never fed). 9 rows a step
    for 8 sequences cuts chunks short."""
    prompts = parts[3]
    plans = [(p, Sampling(1.3, 0.9, i) if i % 2 else Sampling(), (3, 5, 7, 11) if i == 4 else None)
             for i, p in enumerate(prompts)]

    def run(keep: bool, max_output: int | None = None):
        gen = make(parts, max_tokens_per_step=max_tokens_per_step)
        if max_output is not None:
            gen.max_output_tokens = gen.scheduler.max_output_tokens = max_output
        calls, rows, forward = [0], [0], gen.model.forward

        def counted(tokens, *a, **k):
            calls[0] += 1
            rows[0] += len(tokens)
            return forward(tokens, *a, **k)
        gen.model.forward = counted
        res = gen.generate([Request(p, s, keep_logits=keep, tools=t) for p, s, t in plans])
        return [(r.token_ids, r.tools, r.finish, r.min_margin) for r in res], calls[0], rows[0]

    stepwise, steps, rows = run(True)
    jumped, jump_steps, jump_rows = run(False)
    assert jumped == stepwise and jump_rows <= rows and jump_steps < steps
    assert any(len(t) > 1 for t, *_ in stepwise)
    cut, _, _ = run(False, max_output=3)
    assert cut == run(True, max_output=3)[0] and "length" in {f for _, _, f, _ in cut}


def test_every_numba_module_compiles_for_the_one_target():
    """The draw (runtime/batching/sampling.py) and the CPU kernels set the same numba target whichever a process
    imports first (common/numba_target.py): a draw compiled first must not re-key the kernels' cache."""
    import subprocess
    import sys
    from pathlib import Path
    probe = "import {0}, numba; print(numba.config.CPU_NAME, numba.config.CPU_FEATURES)"
    seen = [subprocess.run([sys.executable, "-c", probe.format(m)], cwd=Path(__file__).parents[1], capture_output=True,
                           text=True, timeout=120).stdout for m in ("toolcall.runtime.batching.sampling", "toolcall.runtime.cpu.fast_kernels")]
    assert seen[0] and seen[0] == seen[1]
