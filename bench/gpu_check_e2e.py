"""bench/gpu_check.py's GPU end-to-end stages; each runs in its own process and puts every
result into its Recorder as soon as it has it.

e2e (untimed), in this order so that a fault or a WHILE loop that never ends costs least:
  1. graph-free: the bundle's CUDA model without the canary gate (modules that fail to load
     recorded), the prompts through the host-driven generator (sparse and check heads) and the
     host-stepped decode loop, and the canary prompt's final hidden rows (saved for parity);
     then that model is closed (best effort, first error kept);
  2. Engine.load (target check, CUDA backend, canary on both decode paths), then the prompts
     through the decode graph (one graph launch each).
bench (timed; gpu_check.py starts it only after the CPU reference has finished):
  Timings (CUDA events on the model's stream unless named "wall"):
  ttft_<L>_ms      prefill graph (chunks + first sample) of an L-token prompt, median of 5
  step_ms_p<P>     the decode step graph at a fixed position P (100, 511, 2047 where the bundle's span holds
                   it): before each of 50 replays the row is put back at P with its grammar at the root
                   (host copies, outside the events), so every replay does one row's forward at P and a first
                   sample: the device record's step_ms_p100 (median)
  step_graph_ms    one decode step replayed as a graph (body kernels, no loop), 200 replays;
                   step_graph_programmatic_ms: the same with programmatic edges (programmatic_built
                   False and programmatic_error say why the driver refused them)
  in_loop_ms       (whole-answer graph - prefill graph) / (tokens - 1) for the canary prompt
  host_loop_ms     wall: the same body launched from the host + sync + condition read, per token
  answer_graph/host_wall_ms  whole canary answer, median of 5, each mode
  copy_gbs         device-to-device cuMemcpy, bytes read + written per second (1 GiB, 10 copies)
  weight_gbs       decode weight bytes (layers + final norm + embedding row + candidate head rows)
                   per step_graph_ms
A stuck WHILE graph ends the stage at once (gpu_check_record.exit_stuck): every later call
would wait on it.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
from gpu_check_record import close_all, exit_stuck, is_stuck
from gpu_check_stages import e2e_prompts


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


def manual_engine(folder: Path, family: str = "fma"):
    """The engine's parts without the canary gate (graph-free paths first, or after a failed
    Engine.load, to learn more): modules that fail to load are recorded instead of fatal. ``family``: the
    GPU kernel family (kernels/geometry.py KERNEL_FAMILIES)."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer

    from toolcall.runtime.batching.batcher import StepBatcher
    from toolcall.runtime.bundle.files import read_contract
    from toolcall.runtime.cuda.backend import load_cuda_model
    from toolcall.runtime.cuda.graph import DecodeGraph
    from toolcall.kernels.geometry import KERNEL_FAMILIES
    from toolcall.runtime.grammar.trie import Grammar
    c, g = read_contract(folder), Grammar.read(folder / "grammar.msgpack")
    m = load_cuda_model(folder, c, g, strict=False, family=KERNEL_FAMILIES[family])
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


def stage_e2e(work: Path, name: str, rec) -> dict:
    from toolcall.runtime.engine import Engine
    t = time.perf_counter()
    bundle, family = variant(name)
    # 1. graph-free paths, saved before any graph is launched
    parts = attempt(rec, "load_graph_free", lambda: manual_engine(work / bundle, family))
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
    engine = attempt(rec, "load", lambda: Engine.load(work / bundle, gpu_kernels=family))
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


def _events_ms(m, ev, fn) -> float:
    from cuda.bindings import driver as drv

    from toolcall.kernels.launch import check
    check(drv.cuEventRecord(ev[0], m.stream), "cuEventRecord")
    fn()
    check(drv.cuEventRecord(ev[1], m.stream), "cuEventRecord")
    check(drv.cuEventSynchronize(ev[1]), "cuEventSynchronize")
    return float(check(drv.cuEventElapsedTime(ev[0], ev[1]), "cuEventElapsedTime"))


def copy_bandwidth(m, loop, canary) -> dict:
    from cuda.bindings import driver as drv

    from toolcall.kernels.launch import check
    n = 1 << 30  # the copy-bandwidth ceiling, measured here: 1 GiB, 10 copies, read + write bytes
    src, dst = m.gpu.alloc(n), m.gpu.alloc(n)
    try:
        copy = lambda: [check(drv.cuMemcpyDtoDAsync(dst.ptr, src.ptr, n, m.stream), "cuMemcpyDtoDAsync")
                        for _ in range(10)]
        copy()
        return {"copy_gbs": 2 * n * 10 / (_events_ms(m, loop.builder.events, copy) * 1e-3) / 1e9}
    finally:
        m.gpu.free(src)
        m.gpu.free(dst)


BATCH_STEP_ROWS = (64, 256)  # prompts of one prefill chunk: a step over that many rows (batch_step_<rows>_ms)


def ttft(m, loop, canary) -> dict:
    """Prefill chunks + first sample as one graph, for 512- and 2048-token prompts (ttft_<n>_ms), and for prompts
    of 64 and 256 tokens where one chunk holds them (batch_step_<n>_ms: one step over that many rows), median of
    5."""
    res, b = {}, loop.builder
    for length in (*BATCH_STEP_ROWS, 512, 2048):
        batch_step = length in BATCH_STEP_ROWS
        if length > m.limits.max_input_tokens or (batch_step and length > loop.C):
            continue
        prompt = (canary * (length // len(canary) + 1))[:length]
        exe = b.instantiate(loop.plan(-(-length // loop.C)))
        times = []
        for _ in range(6):
            slot, _n = loop.prepare(prompt)
            times.append(loop.launch(exe))
            m.kv.release(slot)
        b.destroy(exe)
        res[f"batch_step_{length}_ms" if batch_step else f"ttft_{length}_ms"] = statistics.median(times[1:])
    return res


def step_times(m, loop, canary) -> dict:
    """The canary's prefill graph, then its last decode step replayed as a graph and from the host."""
    from cuda.bindings import driver as drv

    from toolcall.kernels.launch import check
    res, b = {}, loop.builder
    prefill, times = b.instantiate(loop.plan(-(-len(canary) // loop.C))), []
    for i in range(4):
        slot, _n = loop.prepare(canary)
        times.append(loop.launch(prefill))
        if i < 3:
            m.kv.release(slot)
    b.destroy(prefill)
    res["prefill_canary_ms"] = statistics.median(times[1:])
    try:
        # the decode step as a graph with the builder's edges, then with programmatic ones
        default = b.programmatic
        for key, edges in (("step_graph_ms", default), ("step_graph_programmatic_ms", True)):
            b.programmatic = edges
            step = b.instantiate(loop.body(0))
            launch = lambda k: [check(drv.cuGraphLaunch(step, m.stream), "cuGraphLaunch") for _ in range(k)]
            launch(5)
            res[key] = _events_ms(m, b.events, lambda: launch(200)) / 200
            b.destroy(step)
        res["programmatic_built"], res["programmatic_error"] = b.programmatic, b.programmatic_error
        b.programmatic = default
        body = m.program(("body",), lambda: loop.body(0))
        t = time.perf_counter()
        for _ in range(50):
            body.run()
            m.sync()
            m.gpu.download(m.ws["cond"], (1,), np.int32)
        res["host_loop_ms"] = 1e3 * (time.perf_counter() - t) / 50
    finally:
        m.kv.release(slot)
    return res


STEP_POSITIONS = (100, 511, 2047)
FIXED_REPLAYS = 50


def fixed_position_steps(m, loop, canary) -> dict:
    """step_ms_p<P> (module docstring): the decode step graph timed at fixed positions (loop.launch: the graph
    between two events, device milliseconds)."""
    span = m.limits.max_input_tokens + m.limits.max_output_tokens
    res, b = {}, loop.builder
    slot = m.kv.admit(span)
    try:
        m.kv.sync()
        step = b.instantiate(loop.body(0))
        try:
            for position in (p for p in STEP_POSITIONS if p < span):
                times = []
                for i in range(FIXED_REPLAYS + 3):  # 3 warm-up replays
                    loop.reset_answer(slot)
                    loop.place_row(int(canary[0]), position, slot)
                    ms = loop.launch(step)
                    if i >= 3:
                        times.append(ms)
                res[f"step_ms_p{position}"] = statistics.median(times)
        finally:
            b.destroy(step)
    finally:
        m.kv.release(slot)
    return res


def answer_times(m, loop, canary) -> dict:
    """The whole canary answer in each mode, median of 5: wall, and device time for the graph."""
    res = {}
    for mode in ("graph", "host"):
        walls, dev = [], []
        for _ in range(6):
            t = time.perf_counter()
            r = loop.generate(canary, mode=mode)
            walls.append(1e3 * (time.perf_counter() - t))
            dev.append(r.device_ms)
        res[f"answer_{mode}_wall_ms"] = statistics.median(walls[1:])
        res[f"answer_{mode}_ms"] = statistics.median(dev[1:])
        res["answer_tokens"] = len(r.token_ids)
    return res
