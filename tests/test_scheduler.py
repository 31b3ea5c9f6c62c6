"""Admission: a pass with every slot busy builds no refusal per waiting request, and queued
requests still all get their solo answers once slots free up."""
from __future__ import annotations

from test_generator import alone, make, parts  # noqa: F401  (module fixtures and generator factory)

from toolcall.runtime.batching.batcher import Request


def test_a_full_pool_admits_nobody_without_trying_each_waiting_request(parts, alone):
    gen = make(parts, max_sequences=2)
    prompts = parts[3]
    handles = {gen.submit(Request(p)): i for i, p in enumerate(prompts)}
    calls = []
    admit = gen.kv.admit

    def counting_admit(*args, **kwargs):
        calls.append(args)
        return admit(*args, **kwargs)

    gen.kv.admit = counting_admit
    results = {}
    for handle, res in gen.step():  # first pass: the two slots fill
        results[handle] = res
    assert len(calls) == 2 and gen.kv.free_slots == 0
    calls.clear()
    for _ in range(1000):
        if not gen.busy:
            break
        free, tried = gen.kv.free_slots, len(calls)
        for handle, res in gen.step():
            results[handle] = res
        assert len(calls) - tried <= free  # a pass tries waiting requests only while a slot is free
    assert not gen.busy
    assert {handles[h]: r.token_ids for h, r in results.items()} == dict(enumerate(alone))
    assert gen.kv.free_slots == gen.kv.max_seqs and gen.kv.free_pages == gen.kv.num_pages


def test_a_request_that_must_not_wait_is_refused_behind_waiting_ones(parts):
    gen = make(parts, max_sequences=2)
    prompts = parts[3]
    for p in prompts[:4]:
        gen.submit(Request(p))  # two run, two wait
    gen.step()
    impatient = gen.submit(Request(prompts[0]), queue=False)
    refused = dict((h, r) for h, r in gen.step() if h == impatient)
    assert refused[impatient].code == "too_many_sequences"
    assert len(gen.scheduler.waiting) == 2  # the queued ones still wait
