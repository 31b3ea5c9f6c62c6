"""A GPU bundle of the project's own tool model answers on the simulated device (`--device sim`: its kernels' PTX on
the CPU executor, sanitizers on) as the CPU bundle of the same checkpoint and precision does: hand-written
requests batched (mixed prefill and decode steps), a sampled one, tool subsets and answer rules, and the captured
decode loop. Loads once (the canary runs through the serving step and the decode graph there)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import compile_test_bundle

from toolcall.models.recipe.handwritten import load_handwritten
from toolcall.runtime.batching.sampling import Sampling
from toolcall.runtime.engine import Engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bit_gates  # noqa: E402

EVERY = 30  # the hand-written set's requests taken: one in EVERY (the whole set: bench/sim_end_to_end.py)


@pytest.fixture(scope="module")
def h200_bundle(tmp_path_factory):
    return compile_test_bundle("models/toolcall-qwen3-tiny", tmp_path_factory.mktemp("bundles") / "toolcall-fp8-h200",
                               target="h200")


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


def test_a_rows_bits_alone_are_its_bits_beside_others(engines):
    """bench/bit_gates.py's batch_2 and beside_prefix_sibling on the simulated device: a row's tokens, candidates
    and logit bits served alone, then in a burst of two and beside a sibling with its prompt (the KV pool serving its
    prompt's pages and rows, the prompt's last row computed alone in its sequence)."""
    sim, _ = engines
    gates = bit_gates.Gates(sim)
    alone = sim.generator.generate([gates.target()])[0]
    assert bit_gates.bits_differ(alone, gates.burst(2)) is None
    assert bit_gates.bits_differ(alone, gates.beside_prefix_sibling()) is None


def test_openai_clients_at_once_get_the_cpu_answers(engines):
    """`runtime serve`'s app on the simulated engine (last in the module: the server's engine thread frees the engine
    when it stops): eight clients at once, under tool_choice's forms, a one-call cap, a token cap and a seeded
    sample, each answered as the CPU engine answers it."""
    openai = pytest.importorskip("openai")
    from concurrent.futures import ThreadPoolExecutor

    from test_serve import LiveServer

    from toolcall.runtime.serve.state import ServeConfig, ServeState
    sim, cpu = engines
    multi, chat = "Convert 100 dollars to euros and then book a taxi to the airport", "thanks a lot, bye"
    asks = [dict(text=multi), dict(text=chat), dict(text=chat, tool_choice="required"),
            dict(text=chat, tool_choice={"type": "function", "function": {"name": cpu.grammar.tool_names[5]}}),
            dict(text=multi, parallel_tool_calls=False), dict(text=multi, temperature=0.8, seed=3),
            dict(text=multi, max_tokens=3), dict(text=multi, tool_choice="none")]

    def answers(engine, concurrent: bool):
        with LiveServer(ServeState(lambda: engine, ServeConfig(served_model_names=("m",), lanes=1,
                                                               request_timeout_s=1800.0))) as srv:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused", max_retries=0,
                                   timeout=1800)

            def ask(kw):
                kw = dict(kw)
                c = client.chat.completions.create(model="m", messages=[{"role": "user", "content": kw.pop("text")}],
                                                   **kw)
                return ([t.function.name for t in c.choices[0].message.tool_calls or []], c.choices[0].finish_reason,
                        c.usage.completion_tokens)
            if not concurrent:
                return [ask(kw) for kw in asks]
            with ThreadPoolExecutor(len(asks)) as pool:
                return list(pool.map(ask, asks))
    want = answers(cpu, concurrent=False)
    assert answers(sim, concurrent=True) == want
    assert any(names for names, _, _ in want)
