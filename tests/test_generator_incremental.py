"""The incremental core: requests joining mid-flight get their solo answers (tokens and logits
bits), abort frees pages at once, a tools subset bounds the answer, the engine thread."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from test_generator import make, parts  # noqa: F401  (module fixture and generator factory)

from toolcall.common.errors import RequestError
from toolcall.runtime.batching.batcher import Request, Result
from toolcall.runtime.batching.sampling import Sampling
from toolcall.runtime.serve.engine_thread import EngineThread


def bits(arrays) -> list[bytes]:
    return [np.ascontiguousarray(a, np.float32).view(np.uint32).tobytes() for a in arrays]


@pytest.fixture(scope="module")
def solo(parts):
    gen = make(parts)
    return [gen.generate([Request(p, keep_logits=True)])[0] for p in parts[3]]


def run_until_idle(gen, results, limit=1000):
    for _ in range(limit):
        if not gen.busy:
            return
        for handle, res in gen.step():
            results[handle] = res
    raise AssertionError("generator did not finish within the step limit")


@pytest.mark.parametrize("max_sequences", [3, 33])
def test_requests_joining_mid_flight_get_their_solo_answers(parts, solo, max_sequences):
    gen = make(parts, max_sequences=max_sequences, max_tokens_per_step=24, prefill_chunk=8)
    prompts = parts[3]
    results, order = {}, {}
    rng = np.random.default_rng(3)
    joins = [int(i) for i in rng.integers(0, len(prompts), 14)]
    for step, i in enumerate(joins):  # one new request before each step, others in every phase
        order[gen.submit(Request(prompts[i], keep_logits=True))] = i
        for handle, res in gen.step():
            results[handle] = res
    run_until_idle(gen, results)
    assert sorted(results) == sorted(order)
    for handle, i in order.items():
        res, alone = results[handle], solo[i]
        assert isinstance(res, Result) and res.token_ids == alone.token_ids
        assert bits(res.step_logits) == bits(alone.step_logits)  # bit for bit, not a tolerance
        assert [c.tolist() for c in res.step_candidates] == [c.tolist() for c in alone.step_candidates]
    assert gen.kv.free_pages == gen.kv.num_pages and gen.kv.free_slots == gen.kv.max_seqs


def test_the_cpu_backend_gives_a_row_the_same_bits_however_its_prompt_is_chunked(parts):
    from toolcall.runtime.cpu.kv_pool import PagedKVPool

    gen = make(parts)
    model, prompt = gen.model, np.asarray(parts[3][1], np.int64)
    n = len(prompt)

    def prefill(chunks, neighbours):
        kv = PagedKVPool(model.cfg, 16, 16, 4, 96)
        slot, other = kv.admit(n + 30), kv.admit(n + 30)
        start, hidden = 0, []
        for c in chunks:  # each chunk beside `neighbours` rows of another sequence
            rows = np.r_[prompt[start:start + c], prompt[:neighbours]]
            slots = np.r_[np.full(c, slot), np.full(neighbours, other)]
            pos = np.r_[np.arange(start, start + c), np.arange(neighbours)]
            hidden.append(model.forward(rows, slots, pos, kv)[:c])
            start += c
        return np.concatenate(hidden)

    alone = prefill([n], 0)
    for chunks, neighbours in [([1] * n, 0), ([5, 5, n - 10], 3), ([8, n - 8], 7), ([n - 1, 1], 1)]:
        assert bits(prefill(chunks, neighbours)) == bits(alone), chunks


def test_abort_frees_pages_at_once_and_spares_the_others(parts, solo):
    gen = make(parts, max_sequences=2)
    prompts = parts[3]
    a, b, c = (gen.submit(Request(prompts[i])) for i in range(3))  # c waits: two slots
    gen.step()
    held = gen.kv.num_pages - gen.kv.free_pages
    assert gen.counts() == (1, len(prompts[2]), 2) and held > 0
    assert gen.abort(a) and gen.kv.free_pages == gen.kv.num_pages - held + gen.kv.pages_for(
        len(prompts[0]) + gen.max_output_tokens)
    assert gen.abort(c) and gen.counts() == (0, 0, 1)
    assert not gen.abort(a) and not gen.abort(10**6)
    results = {}
    run_until_idle(gen, results)
    assert list(results) == [b] and results[b].token_ids == solo[1].token_ids
    assert gen.kv.free_pages == gen.kv.num_pages


def test_generate_is_a_loop_over_the_same_core(parts, solo):
    gen = make(parts)
    out = gen.generate([Request(p) for p in parts[3]])
    assert [r.token_ids for r in out] == [s.token_ids for s in solo]
    assert not gen.busy and gen.counts() == (0, 0, 0)


def test_a_tools_subset_bounds_the_answer(parts, solo):
    gen = make(parts)
    grammar = parts[2]
    names = grammar.tool_names
    first = solo[0].tools
    assert first, "the tiny model names at least one tool here"
    one = names.index(first[0])
    (res,) = gen.generate([Request(parts[3][0], tools=(one,))])
    assert res.tools == [first[0]] and res.finish == "done"
    others = tuple(i for i in range(len(names)) if names[i] not in first)[:5]
    for i, p in enumerate(parts[3][:4]):
        (res,) = gen.generate([Request(p, Sampling(1.0, 1.0, i), tools=others)])
        # the catalog allows the empty answer: a subset bounds what is named, it does not force a name
        assert res.finish == "done" and set(res.tools) <= {names[t] for t in others}
    for bad in [(), (len(names),), (1, 1), (-1,)]:
        with pytest.raises(RequestError) as e:
            gen.submit(Request(parts[3][0], tools=bad))
        assert e.value.code == "request_invalid"


def test_engine_loop_answers_threads_and_sleeps_when_idle(parts, solo):
    gen = make(parts, max_sequences=4)
    loop = EngineThread(gen, max_waiting_requests=64, max_waiting_tokens=10**6, beat_s=0.2).start()
    try:
        prompts = parts[3]
        done = threading.Event()
        got = []

        def on_done(t):
            got.append(t)
            if len(got) == 2 * len(prompts):
                done.set()

        def client(offset):
            for k in range(len(prompts)):
                loop.submit(Request(prompts[(k + offset) % len(prompts)]), on_done)
                time.sleep(0.002 * offset)

        threads = [threading.Thread(target=client, args=(o,)) for o in (0, 3)]
        [t.start() for t in threads]
        [t.join(10) for t in threads]
        assert done.wait(60), f"{len(got)} of {2 * len(prompts)} answered"
        for t in got:
            assert t.result.token_ids == solo[prompts.index(t.request.prompt_ids)].token_ids
        time.sleep(0.1)
        turns = loop.turns
        time.sleep(0.5)  # idle: woken only by the 0.2 s heartbeat, never spinning
        assert loop.turns - turns <= 4 and loop.alive(1.0)
        assert loop.in_flight == 0 and loop.free_pages == gen.kv.num_pages
    finally:
        loop.close(10)


def test_engine_loop_bounds_its_queue_and_expires_deadlines(parts):
    gen = make(parts, max_sequences=1)
    prompt = parts[3][0]
    loop = EngineThread(gen, max_waiting_requests=2, max_waiting_tokens=len(prompt) * 2)
    got = []
    a = loop.submit(Request(prompt), got.append)
    loop.submit(Request(prompt), got.append)  # the thread is not started: both stay queued
    with pytest.raises(RequestError) as e:
        loop.submit(Request(prompt), got.append)
    assert e.value.code == "queue_full" and e.value.details["max_waiting"] == 2

    loop.abort(a)
    loop.start()
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [getattr(t.result, "code", "ok") for t in got] == ["request_aborted", "ok"]
    late = []
    t = loop.submit(Request(prompt), late.append, timeout_s=1e-6)
    while not late and time.monotonic() < deadline:
        time.sleep(0.01)
    assert late == [t] and t.result.code == "deadline_exceeded"
    loop.close(10)
    assert gen.kv.free_pages == gen.kv.num_pages and loop.in_flight == 0


def test_engine_loop_hooks_run_on_its_thread_and_a_failed_step_answers_everyone(parts, solo):
    gen = make(parts, max_sequences=4)
    seen = []
    real_step = gen.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real_step()

    gen.step = flaky_step
    loop = EngineThread(gen, max_waiting_requests=8, max_waiting_tokens=10**6,
                      on_start=lambda: seen.append(("start", threading.current_thread().name)),
                      on_stop=lambda: seen.append(("stop", threading.current_thread().name)))
    got = []
    for p in parts[3][:3]:
        loop.submit(Request(p), got.append)
    loop.start()
    wait = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < wait:
        time.sleep(0.01)
    assert [t.result.code for t in got] == ["internal"] * 3  # the failed step's sequences, typed
    assert gen.kv.free_pages == gen.kv.num_pages
    after = []
    loop.submit(Request(parts[3][0]), after.append)  # and the loop keeps serving
    while not after and time.monotonic() < wait:
        time.sleep(0.01)
    assert after[0].result.token_ids == solo[0].token_ids
    loop.close(10)
    assert seen == [("start", "engine-loop"), ("stop", "engine-loop")]
