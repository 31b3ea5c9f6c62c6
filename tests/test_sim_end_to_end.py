"""A GPU bundle of the project's own tool model answers on the simulated device (`--device sim`: its kernels' PTX on
the CPU executor, sanitizers on) as the CPU bundle of the same checkpoint and precision does: hand-written
requests batched (mixed prefill and decode steps), a sampled one, tool subsets and answer rules, and the captured
decode loop. Loads once (the canary runs through the serving step and the decode graph there)."""
from __future__ import annotations

import pytest

from toolcall.models.recipe.handwritten import load_handwritten
from toolcall.runtime.batching.sampling import Sampling
from toolcall.runtime.engine import Engine

EVERY = 30  # the hand-written set's requests taken: one in EVERY (the whole set: bench/sim_end_to_end.py)


@pytest.fixture(scope="module")
def h200_bundle(tmp_path_factory):
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.bundle.contract import BuildOptions

    out = tmp_path_factory.mktemp("bundles") / "toolcall-fp8-h200"
    options = BuildOptions(precision="fp8_e4m3", target="h200", max_sequences=8, max_input_tokens=128,
                           max_output_tokens=None, page_size=32, max_tokens_per_step=128, prefill_chunk=64,
                           memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
    compile_bundle("models/toolcall-qwen3-tiny", "builder/data/tools-64.json", options, out)
    return out


@pytest.fixture(scope="module")
def engines(h200_bundle, shipped_bundle):
    sim = Engine.load(h200_bundle, device="sim")
    yield sim, Engine.load(shipped_bundle, backend="reference")
    sim.close()


def texts() -> list[str]:
    return [request for request, _ in load_handwritten()[::EVERY] if request]


def answers(results) -> list:
    return [(tuple(r.tools), tuple(r.token_ids), r.finish) for r in results]


def test_the_simulated_device_presents_the_contracts_gpu(engines):
    sim, _ = engines
    gpu = sim.model.gpu
    c = sim.contract
    assert sim.device == "sim" and gpu.name == "simulated H200" and gpu.arch == c.target.sm_arch
    assert gpu.capacity == c.memory.total_bytes - c.memory.context_reserve_bytes
    assert 0 < gpu.allocated_bytes <= gpu.capacity


def test_hand_written_requests_batched_answer_as_on_the_cpu(engines):
    sim, cpu = engines
    requests = texts()
    assert len(requests) > sim.contract.limits.max_sequences  # some wait: later prompts prefill beside decode rows
    sampled = Sampling(0.8, 0.9, 7)
    got = answers(sim.run(requests) + sim.run(requests[:2], sampled))
    want = answers(cpu.run(requests) + cpu.run(requests[:2], sampled))
    assert got == want
    assert any(tools for tools, _, _ in got)


def test_tool_subsets_and_answer_rules_answer_as_on_the_cpu(engines):
    sim, cpu = engines
    text = "Book a flight to Paris and a hotel there, then email Bob"
    cases = [dict(tools=["book_flight", "book_hotel"]), dict(max_tools=1), dict(only=["send_email"]),
             dict(require_tool=True, max_output_tokens=6)]

    def run(engine):
        return answers(engine.generator.generate([engine.request(text, **kw) for kw in cases]))
    assert run(sim) == run(cpu)


def test_the_captured_decode_loop_answers_as_the_serving_step(engines):
    sim, cpu = engines
    text = texts()[0]
    loop = sim.decode_graph.generate(sim.encode(text))
    assert loop.token_ids == list(cpu.run([text])[0].token_ids)
