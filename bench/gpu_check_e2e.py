"""bench/gpu_check.py's GPU end-to-end stages; each runs in its own process and puts every
result into its Recorder as soon as it has it.

e2e (untimed), in this order so that a fault or a WHILE loop that never ends costs least:
  1. graph-free: the bundle's CUDA model without the canary gate (modules that fail to load
     recorded), the prompts through the host-driven generator (sparse and check heads) and the
     host-stepped decode loop, and the canary prompt's final hidden rows (saved for parity);
     then that model is closed (best effort, first error kept);
  2. Engine.load (target check, CUDA backend, canary on both decode paths), then the prompts
     through the decode graph (one graph launch each).
bench (timed; gpu_check.py starts it only after the CPU reference has finished): the timings of
bench/gpu_check_timings.py, each put as it ends.
A stuck WHILE graph ends the stage at once (gpu_check_record.exit_stuck): every later call
would wait on it.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from gpu_check_record import close_all, exit_stuck, is_stuck
from gpu_check_stages import e2e_prompts
from gpu_check_timings import answer_times, copy_bandwidth, fixed_position_steps, step_times, ttft


def attempt(rec, key: str, fn):
    """rec[key] = fn(), or {"error": ...}: one failing part never hides the others; a graph that
    never ended stops the stage."""
    try:
        value = fn()
    except Exception as e:
        value = {"error": f"{type(e).__name__}: {e}"[:800]}
        rec.put(key, value)
        if is_stuck(e):
            exit_stuck(rec, key)
        return value
    rec.put(key, value)
    return value


def manual_engine(folder: Path, family: str = "fma", device: str = "native"):
    """The engine's parts without the canary gate (graph-free paths first, or after a failed
    Engine.load, to learn more): modules that fail to load are recorded instead of fatal. ``family``: the
    GPU kernel family (kernels/geometry.py KERNEL_FAMILIES); ``device``: runtime/cuda/devices.py DEVICES."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer

    from toolcall.kernels.geometry import KERNEL_FAMILIES
    from toolcall.runtime.batching.batcher import StepBatcher
    from toolcall.runtime.bundle.files import read_contract
    from toolcall.runtime.cuda.backend import load_cuda_model
    from toolcall.runtime.cuda.devices import DEVICES
    from toolcall.runtime.cuda.graph import DecodeGraph
    from toolcall.runtime.grammar.trie import Grammar
    c, g = read_contract(folder), Grammar.read(folder / "grammar.msgpack")
    m = load_cuda_model(folder, c, g, DEVICES[device].gpu(c), strict=False, family=KERNEL_FAMILIES[family])
    lim = c.limits
    gen = StepBatcher(m, m.kv, g, max_input_tokens=lim.max_input_tokens, max_output_tokens=lim.max_output_tokens,
                    max_tokens_per_step=lim.max_tokens_per_step, prefill_chunk=lim.prefill_chunk)
    decode_graph = None
    try:
        decode_graph = DecodeGraph(m)
    except Exception:
        pass
    return SimpleNamespace(model=m, decode_graph=decode_graph, generator=gen, grammar=g, contract=c, close=m.close,
                           tokenizer=Tokenizer.from_file(str(folder / "tokenizer.json")))


def _generate(engine, prompts, head: str) -> dict:
    from toolcall.runtime.batching.batcher import Request, Result, StepBatcher
    m, c = engine.model, engine.contract
    lim = c.limits
    gen = engine.generator if head == "sparse" else StepBatcher(
        m, m.kv, engine.grammar, max_input_tokens=lim.max_input_tokens, max_output_tokens=lim.max_output_tokens,
        max_tokens_per_step=lim.max_tokens_per_step, prefill_chunk=lim.prefill_chunk, head=head)
    res = gen.generate([Request(p) for p in prompts])
    return {"tokens": [r.token_ids if isinstance(r, Result) else str(r) for r in res],
            "ms_per_token": [1e3 * (r.total_s - r.ttft_s) / max(len(r.token_ids) - 1, 1)
                             for r in res if isinstance(r, Result)]}


def variant(name: str) -> tuple[str, str]:
    """(bundle, kernel family) of a stage's bundle name: "q06-fp8" runs the default family, "q06-fp8+mma" the
    same bundle with the mma one (gpu_check.MMA_VARIANTS)."""
    bundle, _, family = name.partition("+")
    return bundle, family or "fma"


def stage_e2e(work: Path, name: str, rec, device: str = "native") -> dict:
    from toolcall.runtime.engine import Engine
    t = time.perf_counter()
    bundle, family = variant(name)
    # 1. graph-free paths, saved before any graph is launched
    parts = attempt(rec, "load_graph_free", lambda: manual_engine(work / bundle, family, device))
    if isinstance(parts, dict):
        return rec.data
    m, c = parts.model, parts.contract
    rec.put("load_graph_free", {"seconds": time.perf_counter() - t, "module_errors": m.module_errors,
                                "device_bytes": m.device_bytes(), "contract_memory": c.memory.__dict__,
                                "canary": list(c.canary.expected_token_ids)})
    if parts.decode_graph is not None:
        attempt(rec, "launches_per_token", lambda: len(parts.decode_graph.body(0)))
    prompts = e2e_prompts(parts.grammar, parts.tokenizer, c.limits.max_input_tokens)
    rec.put("prompt_lengths", [len(p) for p in prompts])
    attempt(rec, "generator", lambda: _generate(parts, prompts, "sparse"))
    attempt(rec, "generator_check_head", lambda: _generate(parts, prompts, "check"))
    if parts.decode_graph is not None:
        attempt(rec, "host_loop", lambda: [parts.decode_graph.generate(p, mode="host").token_ids for p in prompts])

    def hidden():
        p = np.asarray(c.canary.prompt_token_ids)
        slot = m.kv.admit(len(p) + 1)
        try:
            np.save(work / f"{name}-gpu-hidden.npy", m.forward(p, np.full(len(p), slot), np.arange(len(p)), m.kv))
        finally:
            m.kv.release(slot)
        return True
    attempt(rec, "hidden_saved", hidden)
    close_error = close_all([parts.close])
    if close_error:
        rec.put("graph_free_close_error", close_error)
        return rec.data  # a sticky error: a second context would only repeat it
    # 2. the load gate (canary on both decode paths) and the decode graph
    t = time.perf_counter()
    engine = attempt(rec, "load", lambda: Engine.load(work / bundle, gpu_kernels=family, device=device))
    if isinstance(engine, dict):
        return rec.data
    rec.put("load", {"seconds": time.perf_counter() - t})
    attempt(rec, "graph", lambda: [engine.decode_graph.generate(p).token_ids for p in prompts])
    close_error = close_all([engine.close])
    if close_error:
        rec.put("close_error", close_error)
    return rec.data


def stage_bench(work: Path, name: str, rec) -> dict:
    """The timings of the module docstring, each part put as it ends (Engine.load's gate first;
    after a refusal the parts without the gate, to time what runs)."""
    from toolcall.runtime.engine import Engine
    bundle, family = variant(name)
    engine = attempt(rec, "load", lambda: Engine.load(work / bundle, gpu_kernels=family))
    if isinstance(engine, dict):
        engine = attempt(rec, "load_without_canary", lambda: manual_engine(work / bundle, family))
        if isinstance(engine, dict) or engine.decode_graph is None:
            return rec.data
    else:
        rec.put("load", "ok")
    m, loop = engine.model, engine.decode_graph
    canary = list(engine.contract.canary.prompt_token_ids)
    res = {}
    for key, fn in (("copy", copy_bandwidth), ("ttft", ttft), ("steps", step_times), ("fixed", fixed_position_steps),
                    ("answers", answer_times)):
        try:
            res.update(fn(m, loop, canary))
        except Exception as e:
            res[f"{key}_error"] = f"{type(e).__name__}: {e}"[:800]
            rec.put("bench", dict(res))
            if is_stuck(e):
                exit_stuck(rec, f"bench {key}")
        rec.put("bench", dict(res))
    res["decode_bytes"] = m.weights.decode_bytes(m.grammar.max_edges_per_node)
    if "step_graph_ms" in res:
        res["weight_gbs"] = res["decode_bytes"] / (res["step_graph_ms"] * 1e-3) / 1e9
        res["tokens_per_s"] = 1e3 / res["step_graph_ms"]
    if "answer_graph_ms" in res and "prefill_canary_ms" in res:
        res["in_loop_ms"] = (res["answer_graph_ms"] - res["prefill_canary_ms"]) / max(res["answer_tokens"] - 1, 1)
    rec.put("bench", res)
    close_error = close_all([engine.close])
    if close_error:
        rec.put("close_error", close_error)
    return rec.data
