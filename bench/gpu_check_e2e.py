"""bench/gpu_check.py's GPU end-to-end stage: load, token identity across the decode paths,
and (``bench``) the timings. Runs in its own process; returns a JSON-ready dict.

Timings (CUDA events on the model's stream unless named "wall"):
  ttft_<L>_ms      prefill graph (chunks + first sample) of an L-token prompt, median of 5
  step_graph_ms    one decode step replayed as a graph (body kernels, no loop), 200 replays
  in_loop_ms       (whole-answer graph - prefill graph) / (tokens - 1) for the canary prompt
  host_loop_ms     wall: the same body launched from the host + sync + condition read, per token
  generator_ms     wall: host-driven Generator (CPU grammar, per-step copies), per output token
  answer_graph/host_wall_ms  whole canary answer, median of 5, each mode
  copy_gbs         device-to-device cuMemcpy, bytes read + written per second (1 GiB, 10 copies)
  weight_gbs       decode weight bytes (layers + final norm + embedding row + candidate head rows)
                   per step_graph_ms
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from gpu_check_stages import e2e_prompts


class DeviceStuck(Exception):
    """A decode graph never ended: the device stays busy until the process exits."""


def attempt(out: dict, key: str, fn):
    """out[key] = fn(), or {"error": ...}: one failing part never hides the others (except a
    graph that never ended: every later call would wait on it, so that one propagates)."""
    try:
        out[key] = fn()
    except Exception as e:
        out[key] = {"error": f"{type(e).__name__}: {e}"[:800]}
        if "still runs" in str(e) and key != "load":
            raise DeviceStuck(key) from None
    return out[key]


def manual_engine(folder: Path):
    """The engine's parts without the canary gate (after a failed Engine.load, to learn more):
    modules that fail to load are recorded instead of fatal."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer

    from runtime.bundle import read_contract
    from runtime.cuda.backend import load_cuda_model
    from runtime.cuda.graph import CudaDecodeLoop
    from runtime.generator import Generator
    from runtime.grammar import Grammar
    c, g = read_contract(folder), Grammar.read(folder / "grammar.msgpack")
    m = load_cuda_model(folder, c, g, strict=False)
    lim = c.limits
    gen = Generator(m, m.kv, g, max_input_tokens=lim.max_input_tokens, max_output_tokens=lim.max_output_tokens,
                    max_tokens_per_step=lim.max_tokens_per_step, prefill_chunk=lim.prefill_chunk)
    loop = None
    try:
        loop = CudaDecodeLoop(m)
    except Exception:
        pass
    return SimpleNamespace(model=m, loop=loop, generator=gen, grammar=g, contract=c, close=m.close,
                           tokenizer=Tokenizer.from_file(str(folder / "tokenizer.json")))


def stage_e2e(work: Path, name: str, bench: bool) -> dict:
    out: dict = {}
    try:
        return _e2e(work, name, bench, out)
    except DeviceStuck as e:
        out["stuck"] = f"{e.args[0]}: a decode graph never ended; the rest of this stage was skipped"
        return out


def _e2e(work: Path, name: str, bench: bool, out: dict) -> dict:
    from runtime.engine import Engine
    from runtime.generator import Generator, Request, Result
    t = time.perf_counter()
    engine = attempt(out, "load", lambda: Engine.load(work / name))
    if isinstance(engine, dict) and "still runs" in engine["error"]:
        return out  # a WHILE loop that never ended holds the device: only ending the process frees it
    if isinstance(engine, dict):  # refused or failed: carry on without the gate to see where
        engine = attempt(out, "load_without_canary", lambda: manual_engine(work / name))
        if isinstance(engine, dict):
            return out
        out["load_without_canary"] = {"module_errors": engine.model.module_errors}
    m, loop, c = engine.model, engine.loop, engine.contract
    info = {"seconds": time.perf_counter() - t, "device_bytes": m.device_bytes(),
            "contract_memory": c.memory.__dict__, "canary": list(c.canary.expected_token_ids)}
    if isinstance(out["load"], dict):  # the error of Engine.load
        out["load_info"] = info
    else:
        out["load"] = info
    attempt(out, "launches_per_token", lambda: len(loop.body(0)))
    prompts = e2e_prompts(engine.grammar, engine.tokenizer, c.limits.max_input_tokens)
    out["prompt_lengths"] = [len(p) for p in prompts]

    def run_generator(head: str):
        lim = c.limits
        gen = engine.generator if head == "sparse" else Generator(
            m, m.kv, engine.grammar, max_input_tokens=lim.max_input_tokens, max_output_tokens=lim.max_output_tokens,
            max_tokens_per_step=lim.max_tokens_per_step, prefill_chunk=lim.prefill_chunk, head=head)
        res = gen.generate([Request(p) for p in prompts])
        return {"tokens": [r.token_ids if isinstance(r, Result) else str(r) for r in res],
                "ms_per_token": [1e3 * (r.total_s - r.ttft_s) / max(len(r.token_ids) - 1, 1)
                                 for r in res if isinstance(r, Result)]}
    attempt(out, "generator", lambda: run_generator("sparse"))
    attempt(out, "generator_check_head", lambda: run_generator("check"))
    attempt(out, "graph", lambda: [loop.generate(p).token_ids for p in prompts])
    attempt(out, "host_loop", lambda: [loop.generate(p, mode="host").token_ids for p in prompts])

    def hidden():
        p = np.asarray(c.canary.prompt_token_ids)
        slot = m.kv.admit(len(p) + 1)
        try:
            np.save(work / f"{name}-gpu-hidden.npy", m.forward(p, np.full(len(p), slot), np.arange(len(p)), m.kv))
        finally:
            m.kv.release(slot)
        return True
    attempt(out, "hidden_saved", hidden)
    if bench:
        out["bench"] = timings(engine)
    engine.close()
    return out


def _events_ms(m, ev, fn) -> float:
    from cuda.bindings import driver as drv

    from kernels.launch import check
    check(drv.cuEventRecord(ev[0], m.stream), "cuEventRecord")
    fn()
    check(drv.cuEventRecord(ev[1], m.stream), "cuEventRecord")
    check(drv.cuEventSynchronize(ev[1]), "cuEventSynchronize")
    return float(check(drv.cuEventElapsedTime(ev[0], ev[1]), "cuEventElapsedTime"))


def timings(engine) -> dict:
    """The bench numbers (see the module docstring); each part recorded or its error."""
    m, loop, res = engine.model, engine.loop, {}
    canary = list(engine.contract.canary.prompt_token_ids)
    parts = (("copy", copy_bandwidth), ("ttft", ttft), ("steps", step_times), ("answers", answer_times))
    for key, fn in parts:
        try:
            res.update(fn(m, loop, canary))
        except Exception as e:
            res[f"{key}_error"] = f"{type(e).__name__}: {e}"[:800]
            if "still runs" in str(e):
                raise DeviceStuck(f"bench {key}") from None
    res["decode_bytes"] = m.weights.decode_bytes(m.grammar.max_edges_per_node)
    if "step_graph_ms" in res:
        res["weight_gbs"] = res["decode_bytes"] / (res["step_graph_ms"] * 1e-3) / 1e9
        res["tokens_per_s"] = 1e3 / res["step_graph_ms"]
    if "answer_graph_ms" in res and "prefill_canary_ms" in res:
        res["in_loop_ms"] = (res["answer_graph_ms"] - res["prefill_canary_ms"]) / max(res["answer_tokens"] - 1, 1)
    return res


def copy_bandwidth(m, loop, canary) -> dict:
    from cuda.bindings import driver as drv

    from kernels.launch import check
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


def ttft(m, loop, canary) -> dict:
    """Prefill chunks + first sample as one graph, for 512- and 2048-token prompts (median of 5)."""
    res, b = {}, loop.builder
    for length in (512, 2048):
        if length > m.limits.max_input_tokens:
            continue
        prompt = (canary * (length // len(canary) + 1))[:length]
        exe = b.instantiate(loop.plan(-(-length // loop.C)))
        times = []
        for _ in range(6):
            slot, _n = loop.prepare(prompt)
            times.append(loop.launch(exe))
            m.kv.release(slot)
        b.destroy(exe)
        res[f"ttft_{length}_ms"] = statistics.median(times[1:])
    return res


def step_times(m, loop, canary) -> dict:
    """The canary's prefill graph, then its last decode step replayed as a graph and from the host."""
    from cuda.bindings import driver as drv

    from kernels.launch import check
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
        step = b.instantiate(loop.body(0))
        launch = lambda k: [check(drv.cuGraphLaunch(step, m.stream), "cuGraphLaunch") for _ in range(k)]
        launch(5)
        res["step_graph_ms"] = _events_ms(m, b.events, lambda: launch(200)) / 200
        b.destroy(step)
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
