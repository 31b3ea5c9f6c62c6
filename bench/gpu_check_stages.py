"""The stages of bench/gpu_check.py; each runs in its own process (a hang or crash in one
cannot take the others down) and returns a JSON-ready dict.

Every stage takes a gpu_check_record.Recorder and puts each job's result as soon as it has it.

build          synthetic checkpoints (a kernel-compatible "small" model and qwen3-0.6b), the
               shipped tool model, and h200 bundles of each in fp8 and nvfp4
kernels        every case of tests/test_kernels_gpu.py and the host-stepped grammar loops of
               tests/test_kernels_gpu_loop.py against kernels/reference.py (no graphs),
               recording relative errors instead of asserting
kernels-while  the WHILE-graph loops of tests/test_kernels_gpu_loop.py alone: a loop that never
               clears its condition stops this stage (the device is then unusable)
cpuref         the e2e prompts and the canary's hidden rows on the CPU reference backend
(e2e and bench: gpu_check_e2e.py, the bench's timings gpu_check_timings.py)
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "builder" / "data" / "tools-64.json"
# The synthetic "tiny" shape has head_dim 16, which the attention kernels do not take; this
# one is as small but kernel-compatible (head_dim 64, dims multiples of 32 for nvfp4).
SMALL_SHAPE = dict(hidden_size=256, intermediate_size=512, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64)
# bundle -> (checkpoint, precision, max_input_tokens, prefill_chunk)
BUNDLES = {"small-fp8": ("small", "fp8_e4m3", 256, 64), "small-nvfp4": ("small", "nvfp4", 256, 64),
           "tool-fp8": ("tool", "fp8_e4m3", 256, 64), "tool-nvfp4": ("tool", "nvfp4", 256, 64),
           "q06-fp8": ("q06", "fp8_e4m3", 2048, 512), "q06-nvfp4": ("q06", "nvfp4", 2048, 512)}
# checkpoints the repository ships (the trained tool model: 3 q heads on 1 kv head); the others
# are synthesized into --work
SHIPPED = {"tool": REPO / "models" / "toolcall-qwen3-tiny"}


def checkpoint_dir(work: Path, ckpt: str) -> Path:
    return SHIPPED.get(ckpt, work / ckpt)
E2E_REQUESTS = 4  # canary candidate requests per bundle, plus one long multi-chunk prompt


def load_test_module(name: str):
    """tests/<name>.py as a module; tests/ on the path, as pytest puts it, for the modules it imports."""
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    spec = importlib.util.spec_from_file_location(f"gpu_check_{name}", REPO / "tests" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- build ----
def synth_small(out: Path) -> None:
    """A synthetic checkpoint of SMALL_SHAPE (toolcall.builder.synth's tiny shape with the sizes replaced)."""
    from unittest import mock

    import toolcall.builder.synth as synth
    original = synth.model_config_for

    def small_config(opts, vocab):
        return dataclasses.replace(original(opts, vocab), **SMALL_SHAPE)
    with mock.patch.object(synth, "model_config_for", small_config):
        synth.synth_checkpoint(out, synth.SynthOptions(shape="tiny"))


def ensure_headers() -> str:
    """toolcall.kernels.nvrtc_build.include_dir(), or (if cuda.pathfinder cannot find them) the first
    folder on the Python path or in /usr/local/cuda holding cuda_fp8.h and cuda_fp4.h."""
    import sys

    import toolcall.kernels.nvrtc_build as nb
    try:
        return nb.include_dir()
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
    roots = [Path(p) for p in sys.path if p] + [Path("/usr/local/cuda")]
    for root in roots:
        for sub in ("nvidia/cu13/include", "nvidia/cuda_runtime/include", "include"):
            d = root / sub
            if (d / "cuda_fp8.h").is_file() and (d / "cuda_fp4.h").is_file():
                nb.include_dir = lambda d=d: str(d)
                return f"{d} (fallback: {why})"
    raise RuntimeError(f"no CUDA headers with cuda_fp8.h and cuda_fp4.h: {why}")


def _build_one(work: Path, name: str) -> dict:
    """One bundle of BUNDLES built (a worker process of stage_build): its record."""
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.bundle.contract import BuildOptions
    ckpt, precision, max_in, chunk = BUNDLES[name]
    t = time.perf_counter()
    options = BuildOptions(precision=precision, target="h200", max_sequences=8, max_input_tokens=max_in,
                           max_output_tokens=None, page_size=32, max_tokens_per_step=max(256, chunk),
                           prefill_chunk=chunk, memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
    try:
        r = compile_bundle(checkpoint_dir(work, ckpt), CATALOG, options, work / name, force=True)
    except Exception as e:  # one bundle failing leaves the others
        return {"error": f"{type(e).__name__}: {e}"[:800]}
    return {"path": str(work / name), "seconds": time.perf_counter() - t, "timings": r.timings,
            "canary_margin": r.contract.canary.min_margin}


def stage_build(work: Path, names: list[str], rec) -> dict:
    """The checkpoints synthesized, the kernels compiled once (the workers inherit NVRTC's cache), then every
    bundle of ``names`` built in its own process, side by side (the device machine has 16 cores)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from toolcall.builder.synth import SynthOptions, synth_checkpoint
    from toolcall.kernels.nvrtc_build import compile_all
    from toolcall.kernels.targets import TARGETS
    out = rec.data
    rec.put("headers", ensure_headers())
    work.mkdir(parents=True, exist_ok=True)
    for ckpt in sorted({BUNDLES[n][0] for n in names} - set(SHIPPED)):
        t = time.perf_counter()
        if not (work / ckpt / "config.json").is_file():
            if ckpt == "small":
                synth_small(work / ckpt)
            else:
                synth_checkpoint(work / ckpt, SynthOptions(shape="qwen3-0.6b"))
        rec.put(f"synth-{ckpt}", {"seconds": time.perf_counter() - t})
    todo = []
    for name in names:
        if (work / name / "contract.json").is_file():
            rec.put(name, {"path": str(work / name), "reused": True})
        else:
            todo.append(name)
    if not todo:
        return out
    t = time.perf_counter()
    compile_all(TARGETS["h200"].sm_arch)
    rec.put("kernels_compiled", {"seconds": time.perf_counter() - t})
    with ProcessPoolExecutor(max_workers=len(todo), mp_context=get_context("fork")) as pool:
        for name, result in zip(todo, pool.map(_build_one, [work] * len(todo), todo)):
            rec.put(name, result)
    return out


# ---- kernels ----
def kernel_jobs(graphs: bool, cases: str | None, ci_only: bool = False) -> list[tuple[str, object, tuple]]:
    """(id, fn(runner, rng, *spec), spec): the parity cases and host loops, or the WHILE-graph loops;
    ``cases``: comma-separated parts, a job is kept when its id contains one; ``ci_only``: only the cases the
    executor runs in CI (``python -m toolcall.kernels.sim test``; the simulated device: the others' T up to 2,048
    take it minutes each)."""
    from toolcall.kernels.cases import all_cases, grammar_loop, linear
    loop = load_test_module("test_kernels_gpu_loop")
    jobs = []
    if graphs:
        for case in grammar_loop.CASES:
            jobs.append((f"loop-while-graph-{case.id}",
                         lambda d, rng, c=case: loop.test_while_graph_loop_stops_on_the_device(d, c), ()))
    else:
        # the parity cases of toolcall.kernels.cases: rows, attention (both families' prefill), both linear
        # families over T = 1 .. 2048 and a row alone vs beside 1 .. 255 others (the bit rule), the host-stepped
        # grammar loops, the draw
        prefix = {**{id(c): "linear-" for c in linear.CASES}, **{id(c): "loop-host-" for c in grammar_loop.CASES}}
        jobs = [(prefix.get(id(c), "") + c.id, c.run, c.spec) for c in all_cases() if c.ci or not ci_only]
    if cases:
        parts = [c for c in cases.split(",") if c]
        jobs = [j for j in jobs if any(p in j[0] for p in parts)]
    return jobs


def kernel_gpu(device: str):
    """The device the kernel stages run on: GPU 0 (native), or the simulated h200 (sim: sanitizers on)."""
    if device == "sim":
        from toolcall.kernels.sim.device import SimGpu
        from toolcall.kernels.targets import TARGETS
        return SimGpu(TARGETS["h200"].sm_arch, name="simulated H200")
    from toolcall.kernels.launch import Gpu
    return Gpu()


def stage_kernels(rec, graphs: bool = False, cases: str | None = None, while_timeout_s: float = 20.0,
                  device: str = "native", ci_only: bool = False) -> dict:
    """Every job's records and error are put as soon as the job ends; a stuck WHILE graph ends
    the stage at once (exit_stuck); ``gpu.close()`` is best effort and its error recorded."""
    from gpu_check_record import close_all, exit_stuck, is_stuck

    import toolcall.kernels.runner as runner_mod
    from toolcall.kernels.runner import KernelRunner

    class RecordingRunner(KernelRunner):
        """close/same record ||got - want|| / ||want|| and pass/fail instead of asserting."""
        case = ""

        def _record(self, got, want, ok: bool, label: str) -> None:
            g, w = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
            fin = np.isfinite(w) & np.isfinite(g)
            num, den = np.linalg.norm(g[fin] - w[fin]), np.linalg.norm(w[fin])
            self.records.append({"case": self.case, "check": label, "ok": bool(ok),
                                 "rel_err": float(num / den) if den > 0 else float(num),
                                 "max_abs": float(np.max(np.abs(g[fin] - w[fin]), initial=0.0)),
                                 "nonfinite_mismatch": int(np.sum(np.isfinite(w) != np.isfinite(g)))})

        def close(self, got, want, atol, rtol=0.0, label=""):
            g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
            bad = ~(np.abs(g - w) <= atol + rtol * np.abs(w)) & ~(np.isinf(g) & (g == w))
            self._record(got, want, not bad.any(), label)

        def same(self, got, want, label=""):
            self._record(got, want, np.array_equal(np.asarray(got), np.asarray(want), equal_nan=True), label)

    runner_mod.WHILE_TIMEOUT_S = while_timeout_s
    rec.put("headers", ensure_headers())
    jobs = kernel_jobs(graphs, cases, ci_only)
    rec.put("cases", len(jobs))
    gpu = kernel_gpu(device)
    rec.put("device", gpu.name)
    runner = RecordingRunner(gpu)
    runner.records, errors, t = [], {}, time.perf_counter()
    rec.put("records", runner.records)
    rec.put("errors", errors)
    for cid, case, spec in jobs:
        runner.case = cid
        try:
            case(runner, np.random.default_rng(zlib.crc32(repr(spec).encode())), *spec)
        except Exception as e:  # a launch failure or a plain assert in a case
            errors[cid] = f"{type(e).__name__}: {e}"[:500]
            if is_stuck(e):
                exit_stuck(rec, cid)
        rec.put("done", rec.data.get("done", 0) + 1)  # rewrites records and errors too
    rec.put("seconds", time.perf_counter() - t)
    close_error = close_all([gpu.close])
    if close_error:
        rec.put("close_error", close_error)
    return rec.data


# ---- prompts shared by e2e and cpuref ----
def e2e_prompts(grammar, tokenizer, max_input: int) -> list[tuple[int, ...]]:
    from toolcall.builder.canary import CANARY_REQUESTS
    # the long prompt: about 660 tokens, two chunks of q06's 512 (a chunk after cached pages), cut to the input limit
    texts = list(CANARY_REQUESTS[:E2E_REQUESTS]) + [" ".join(CANARY_REQUESTS * 6)]
    return [tuple(tokenizer.encode(grammar.render_prompt(t)).ids)[-max_input:] for t in texts]


def stage_cpuref(work: Path, names: list[str], rec) -> dict:
    from tokenizers import Tokenizer

    from toolcall.runtime.batching.batcher import Request, Result
    from toolcall.runtime.bundle.files import read_contract
    from toolcall.runtime.cpu.backend import cpu_batcher, load_cpu_weights
    from toolcall.runtime.grammar.trie import Grammar
    for name in names:
        t, folder = time.perf_counter(), work / name
        c, g = read_contract(folder), Grammar.read(folder / "grammar.msgpack")
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        gen = cpu_batcher(c.model, load_cpu_weights(folder / "weights.safetensors", c.model), g, c.limits)
        prompts = e2e_prompts(g, tok, c.limits.max_input_tokens)
        res = gen.generate([Request(p) for p in prompts])
        p = np.asarray(c.canary.prompt_token_ids)
        slot = gen.kv.admit(len(p) + 1)
        np.save(work / f"{name}-cpu-hidden.npy", gen.model.forward(p, np.full(len(p), slot), np.arange(len(p)), gen.kv))
        gen.kv.release(slot)
        rec.put(name, {"tokens": [r.token_ids if isinstance(r, Result) else str(r) for r in res],
                       "margins": [r.min_margin if isinstance(r, Result) else None for r in res],
                       "prompt_lengths": [len(q) for q in prompts], "seconds": time.perf_counter() - t})
    return rec.data
