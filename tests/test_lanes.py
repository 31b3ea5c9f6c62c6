"""Lanes (runtime/batching/lanes.py): sequence groups stepped in overlap give every request the answer it gets from
one generator (tokens and logits bits), deferred aborts free pages and are never reported, each lane keeps
its share of the slots, and `runtime serve` picks its lanes from the CPUs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from toolcall.runtime.batching.batcher import Result
from toolcall.runtime.batching.lanes import Lanes
from toolcall.runtime.engine import Engine
from toolcall.runtime.serve.state import ServeConfig, serving_lanes

TEXTS = ["Book a flight to Paris", "What's the weather in Oslo tomorrow?", "Send an email to Bob",
         "Convert 20 euros to yen", "Remind me to call Alice on Friday", "Find a hotel in Rome",
         "Play some music", "Translate this note to French", "Book a flight to Paris and a taxi"]


def bits(arrays) -> list[bytes]:
    return [np.ascontiguousarray(a, np.float32).view(np.uint32).tobytes() for a in arrays]


@pytest.fixture(scope="module")
def one_lane(tiny_bundle):
    engine = Engine.load(tiny_bundle, threads=1)
    reqs = [dataclasses.replace(engine.request(t), keep_logits=True) for t in TEXTS]
    return engine.generator.generate(reqs)


def lanes_of(bundle, n: int) -> tuple[Engine, Lanes]:
    engine = Engine.load(bundle, threads=1)
    return engine, Lanes.of(engine.generator, n)


def run_joining(lanes: Lanes, reqs: list, first: int) -> tuple[dict[int, int], dict[int, object]]:
    """Submits the first ``first`` requests, then the rest one a step, mid-flight, and steps until all are
    answered (at most 2000 steps); (handle -> request index, handle -> result)."""
    handles = {lanes.submit(r): i for i, r in enumerate(reqs[:first])}
    results = {}
    for _ in range(2000):
        if len(handles) < len(reqs):
            handles[lanes.submit(reqs[len(handles)])] = len(handles)
        for handle, res in lanes.step():
            results[handle] = res
        if not lanes.busy and len(handles) == len(reqs):
            break
    return handles, results


@pytest.mark.parametrize("n", [2, 3])
def test_lanes_give_every_request_its_one_generator_answer(tiny_bundle, one_lane, n):
    engine, lanes = lanes_of(tiny_bundle, n)
    try:
        texts = TEXTS * 3  # more requests than slots: admissions interleave with steps
        reqs = [dataclasses.replace(engine.request(t), keep_logits=True) for t in texts]
        handles, results = run_joining(lanes, reqs, first=5)
        assert sorted(results) == sorted(handles)
        for handle, i in handles.items():
            got, want = results[handle], one_lane[i % len(TEXTS)]
            assert isinstance(got, Result) and got.token_ids == want.token_ids
            assert bits(got.step_logits) == bits(want.step_logits)  # bit for bit, not a tolerance
        assert lanes.kv.pages_in_use == 0 and lanes.kv.free_slots == lanes.kv.max_seqs
    finally:
        lanes.close()


def test_an_abort_while_its_lane_steps_frees_its_pages_at_the_landing_and_is_never_reported(tiny_bundle):
    engine, lanes = lanes_of(tiny_bundle, 2)
    try:
        handles = [lanes.submit(engine.request(t)) for t in TEXTS[:6]]
        lanes.step()  # every lane's first forward is in flight now
        victim = handles[0]
        lane = lanes._lane_of[victim]
        assert lanes._flight[lane] is not None
        in_use = lanes.kv.pages_in_use
        assert lanes.abort(victim) is True
        assert lanes.kv.pages_in_use == in_use  # its forward still writes them
        assert lanes.abort(victim) is False  # once
        reported = {}
        while lanes.busy:
            for handle, res in lanes.step():
                reported[handle] = res
        assert victim not in reported and sorted(reported) == sorted(handles[1:])
        assert lanes.kv.pages_in_use == 0 and lanes.kv.free_slots == lanes.kv.max_seqs
        assert lanes.abort(handles[1]) is False  # finished: unknown
    finally:
        lanes.close()


def test_each_lane_keeps_its_share_of_the_slots(tiny_bundle):
    engine, lanes = lanes_of(tiny_bundle, 2)
    try:
        caps = [g.scheduler.max_running for g in lanes.lanes]
        assert caps == [lanes.kv.max_seqs // 2] * 2
        for t in TEXTS * 2:
            lanes.submit(engine.request(t))
        lanes.step()
        running = [len(g.scheduler.running) for g in lanes.lanes]
        assert running == caps  # the first lane planned did not take every slot
        rows = [g.max_tokens_per_step for g in lanes.lanes]
        assert rows == [engine.contract.limits.max_tokens_per_step // 2] * 2
        assert all(g.model._rows == rows[0] for g in lanes.lanes)  # step buffers add up to the contract's
        lanes.abort_all()
        assert lanes.kv.pages_in_use == 0 and not lanes.busy
    finally:
        lanes.close()


class _Model:
    def __init__(self, threads: int, lanes: bool = True):
        self.threads, self.lanes_supported = threads, lanes


@pytest.mark.parametrize("config,model,cpus,expected", [
    (ServeConfig(), _Model(1), 2, (2, 1)),  # the default on 2 CPUs: 2 lanes of 1 kernel thread
    (ServeConfig(), _Model(7), 8, (2, 4)),
    (ServeConfig(), _Model(1), 1, (1, 1)),
    (ServeConfig(adaptive_threads=False), _Model(4), 8, (1, 4)),  # --threads 4: one lane, as given
    (ServeConfig(adaptive_threads=False, lanes=2), _Model(4), 8, (2, 2)),  # --threads 4 --lanes 2
    (ServeConfig(lanes=3), _Model(1), 2, (3, 1)),
    (ServeConfig(), _Model(1, lanes=False), 4, (1, 0)),  # CUDA, the numpy reference: one lane
])
def test_serve_picks_its_lanes_from_the_cpus(config, model, cpus, expected):
    assert serving_lanes(model, config, cpus) == expected


@pytest.mark.parametrize("broken", [False, True], ids=["lanes as recorded", "lanes answering otherwise"])
def test_serve_runs_the_canary_through_its_lanes_before_it_is_ready(tiny_bundle, monkeypatch, broken):
    from toolcall.runtime.serve.state import ServeState

    seen = []
    generate = Lanes.generate

    def recording_generate(self, requests, queue=True):
        results = generate(self, requests, queue)
        seen.append(len(results))
        if broken:  # a lane path that computes another model: the first answer's first token differs
            results[0] = dataclasses.replace(results[0], token_ids=[results[0].token_ids[0] + 1])
        return results

    monkeypatch.setattr(Lanes, "generate", recording_generate)
    engine = Engine.load(tiny_bundle, threads=1)
    state = ServeState(lambda: engine, ServeConfig(lanes=2))
    state.load()
    try:
        assert seen == [len(engine.contract.canary.prompts)]  # the canary, on the lanes, inside load
        if broken:
            assert state.phase == "failed" and state.failure.code == "canary_failed" and "lanes" in str(state.failure)
            assert state.engine_thread is None
        else:
            assert state.phase == "ready" and state.failure is None
    finally:
        state.close()


def test_the_canary_compiles_the_one_signature_of_the_lanes_fused_loop(tiny_bundle, monkeypatch):
    """numba compiles (or loads from its cache, ~0.1 s holding the GIL) once per argument type signature,
    and types a one-row strided view C-contiguous, a view of more rows not. The fused loop takes only
    C-contiguous buffers (runtime/cpu/fused_forward.py makes its views), so steps of one sequence or many,
    with one picking row or several, call it with one signature: the one the canary compiled before `serve`
    is ready. Serving then meets no new one (on the views it took before, it met one after the canary)."""
    import numba

    from toolcall.runtime.cpu import fused_forward as ff

    calls: list[tuple] = []
    fused = ff.fused_layers_serial

    def recording(*args):
        calls.append(tuple(numba.typeof(a) for a in args))
        return fused(*args)

    monkeypatch.setattr(ff, "fused_layers_serial", recording)
    engine, lanes = lanes_of(tiny_bundle, 2)
    try:
        engine.check_canary(lanes)
        canary = set(calls)
        calls.clear()
        # several sequences a lane, joining while others answer, the last ones alone
        run_joining(lanes, [engine.request(t) for t in TEXTS * 3], first=4)
        assert calls and not lanes.busy
        new = set(calls) - canary
        assert not new, f"{len(new)} signature(s) of the fused loop first met after the canary"
    finally:
        lanes.close()
