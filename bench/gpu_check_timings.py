"""The timings of bench/gpu_check.py's bench stage (gpu_check_e2e.stage_bench), on a loaded CudaModel and its
decode graph, each a function returning its figures.

  Timings (CUDA events on the model's stream unless named "wall"):
  ttft_<L>_ms      prefill graph (chunks + first sample) of an L-token prompt (512, 2048), median of 5
  batch_step_<R>_ms  the same for a prompt of R rows (64, 256) that one prefill chunk holds: one step over R rows
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
"""
from __future__ import annotations

import statistics
import time

import numpy as np


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
        exe = b.instantiate(loop.plan(loop.shape(length)))
        times = []
        for _ in range(6):
            slot, _shape = loop.prepare(prompt)
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
    prefill, times = b.instantiate(loop.plan(loop.shape(len(canary)))), []
    for i in range(4):
        slot, _shape = loop.prepare(canary)
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
