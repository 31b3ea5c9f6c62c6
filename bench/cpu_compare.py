"""CPU side by side: this project (fp8, nvfp4, bf16 bundles, fast backend) vs transformers (bf16)
vs llama.cpp (GGUF Q8_0, Q4_0), on the same synthetic checkpoint, same threads.

    python bench/cpu_compare.py --checkpoint CKPT --bundles DIR --gguf DIR [--threads N] [--runs 3]
        [--prefill-tokens 256] [--decode-tokens 32] [--llama-python PY] [--json OUT]
    python bench/cpu_compare.py --kernels [--threads N]     # our linear kernels alone, ns/weight

DIR holds bundles named fp8_e4m3 / nvfp4 / bf16 (``builder compile CKPT --precision P``); the
GGUF folder holds q8_0.gguf and q4_0.gguf (made by --make-gguf bench/llama_convert.py, with
LLAMA_CPP_SRC set: llama.cpp's own convert_hf_to_gguf.py to bf16, run by this python, which has the
torch and transformers it imports; then llama_model_quantize in --llama-python). Each engine runs in
its own child process (so its peak RSS is its own, VmHWM), interleaved ours/theirs: load, a prefill
of --prefill-tokens tokens in one batch, then --decode-tokens batch-1 greedy steps over the full
vocabulary head (the same work every engine does; our grammar-bounded sparse head would be
cheaper). --runs N repeats the whole interleaved sequence N times; each figure is the median of the
runs, with the runs listed. Prints one summary line, writes JSON with the machine recorded. Not part
of CI.

llama.cpp runs with its defaults, its extra CPU buffer types (weight repacking; AMX tiles in a build
that has them) included; the JSON records llama-cpp-python's version, whether the extra buffer
types were on, llama.cpp's system info and the buffers the weights went to.
--no-llama-extra-bufts turns them off, which is not llama.cpp's default and is slower (no repacking).
Where an AMX build faults (SIGILL at its first tile instruction: the Xeon VM of bench/RESULTS.md),
build llama-cpp-python without AMX instead of turning them off. Its default build is -march=native
(GGML_NATIVE=ON), which does not read GGML_AMX_TILE/INT8/BF16, so take AMX out of the compiler flags:
    A="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; CFLAGS="$A" CXXFLAGS="$A" pip install --no-cache-dir llama-cpp-python
(or ``CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON ..."``, where the GGML_AMX_*
options apply and default to OFF). REPACK stays on; the system info in the JSON then lacks AMX_INT8.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()
ORDER = ("ours:fp8_e4m3", "llama:q8_0", "ours:nvfp4", "llama:q4_0", "ours:bf16", "transformers:bf16")


def _peak_rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _prompt(vocab: int, n: int) -> list[int]:
    import numpy as np
    return [int(t) for t in np.random.default_rng(0).integers(3, min(vocab, 3000), n)]


def child_ours(bundle: str, threads: int, prefill: int, decode: int, backend: str = "fast") -> dict:
    import numpy as np

    from toolcall.runtime.bundle.files import WEIGHTS_FILE, read_contract
    from toolcall.runtime.cpu.backend import load_cpu_weights
    from toolcall.runtime.cpu.fast_model import FastCpuModel
    from toolcall.runtime.cpu.kv_pool import PagedKVPool
    from toolcall.runtime.cpu.model import CpuModel

    t0 = time.perf_counter()
    contract = read_contract(bundle)
    cfg = contract.model
    weights = load_cpu_weights(Path(bundle) / WEIGHTS_FILE, cfg, backend)
    if backend == "fast":
        model = FastCpuModel(cfg, weights, prefill, prefill + decode, threads)
    else:
        model = CpuModel(cfg, weights, blas_threads=threads)
    kv = PagedKVPool(cfg, -(-(prefill + decode) // 32), 32, 1, prefill + decode)
    slot = kv.admit(prefill + decode)
    load_s = time.perf_counter() - t0
    prompt = np.array(_prompt(cfg.vocab_size, prefill))
    t0 = time.perf_counter()
    hidden = model.forward(prompt, np.full(prefill, slot), np.arange(prefill), kv)
    token = int(np.argmax(model.dense_logits(hidden[-1:])[0]))
    prefill_s = time.perf_counter() - t0
    times = []
    for i in range(decode):
        t0 = time.perf_counter()
        hidden = model.forward(np.array([token]), np.array([slot]), np.array([prefill + i]), kv)
        token = int(np.argmax(model.dense_logits(hidden)[0]))
        times.append(time.perf_counter() - t0)
    return {"load_s": load_s, "prefill_s": prefill_s, "decode_step_s": times}


def child_transformers(checkpoint: str, threads: int, prefill: int, decode: int) -> dict:
    import torch
    import transformers

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    load_s = time.perf_counter() - t0
    ids = torch.tensor([_prompt(model.config.vocab_size, prefill)])
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(ids, use_cache=True)
        token = int(out.logits[0, -1].argmax())
        prefill_s = time.perf_counter() - t0
        past, times = out.past_key_values, []
        for _ in range(decode):
            t0 = time.perf_counter()
            out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past, token = out.past_key_values, int(out.logits[0, -1].argmax())
            times.append(time.perf_counter() - t0)
    return {"load_s": load_s, "prefill_s": prefill_s, "decode_step_s": times}


_llama_log = None


def child_llama(gguf: str, threads: int, prefill: int, decode: int, extra_bufts: bool = True) -> dict:
    """``extra_bufts`` True: llama.cpp's defaults (``use_extra_bufts`` left as llama.cpp sets it: weight
    repacking, AMX tiles in an AMX build). False turns the extra buffer types off, which is not its
    default; where an AMX build faults, use a build without AMX instead (the module's docstring)."""
    import ctypes

    import llama_cpp
    import llama_cpp.llama_cpp as lc
    import numpy as np

    log: list[str] = []

    @lc.llama_log_callback
    def keep_log(level, text, user_data):  # llama.cpp's log, kept for the buffers the weights went to
        log.append(text.decode("utf-8", "replace"))
    global _llama_log  # llama.cpp logs until the process ends: the callback must outlive this function
    _llama_log = keep_log
    lc.llama_log_set(keep_log, ctypes.c_void_p(0))
    default = lc.llama_model_default_params
    if not extra_bufts:
        def params():
            p = default()
            p.use_extra_bufts = False
            return p
        lc.llama_model_default_params = params
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=prefill + decode + 8, n_batch=prefill, n_ubatch=prefill,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    load_s = time.perf_counter() - t0
    prompt = _prompt(llm.n_vocab(), prefill)

    def last_logits():  # the one row llama.cpp computes without logits_all: the batch's last token
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
    t0 = time.perf_counter()
    llm.eval(prompt)
    token = int(np.argmax(last_logits()))
    prefill_s = time.perf_counter() - t0
    times = []
    for _ in range(decode):
        t0 = time.perf_counter()
        llm.eval([token])
        token = int(np.argmax(last_logits()))
        times.append(time.perf_counter() - t0)
    buffers = [" ".join(line.split()) for line in "".join(log).splitlines() if "model buffer size" in line]
    return {"load_s": load_s, "prefill_s": prefill_s, "decode_step_s": times,
            "llama_cpp_version": llama_cpp.__version__,
            "extra_bufts": bool(lc.llama_model_default_params().use_extra_bufts),
            "llama_system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "llama_model_buffers": buffers}


def make_gguf(checkpoint: Path, out: Path, llama_python: str, converter: Path) -> None:
    """bf16 GGUF by llama.cpp's converter (``converter`` wraps convert_hf_to_gguf.py; run by this python,
    which has the torch and transformers the converter imports), then Q8_0 and Q4_0 by
    llama_model_quantize (llama-cpp-python's binding of llama-quantize) in ``llama_python``."""
    out.mkdir(parents=True, exist_ok=True)
    bf16 = out / "bf16.gguf"
    if not bf16.exists():
        subprocess.run([sys.executable, str(converter), str(checkpoint), "--outtype", "bf16", "--outfile", str(bf16)],
                       check=True)
    code = ("import llama_cpp, sys\n"
            "p = llama_cpp.llama_model_quantize_default_params()\n"
            "p.ftype = getattr(llama_cpp, sys.argv[3])\n"
            "assert llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p) == 0\n")
    for name, ftype in (("q8_0", "LLAMA_FTYPE_MOSTLY_Q8_0"), ("q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0")):
        if not (out / f"{name}.gguf").exists():
            subprocess.run([llama_python, "-c", code, str(bf16), str(out / f"{name}.gguf"), ftype], check=True)


QWEN3_06B_LINEARS = ((2048, 1024), (1024, 1024), (1024, 1024), (1024, 2048), (3072, 1024), (3072, 1024), (1024, 3072))


def _random_linear(fmt, o: int, n: int, rng):
    """A linear [o, n] of random codes in weight format ``fmt``, held as the fast backend holds it
    (stored_weights.LAYOUTS: fp8/bf16 in output panels, nvfp4 in rows)."""
    import numpy as np

    from toolcall.common.formats import BF16, FP8_E4M3, NVFP4
    from toolcall.runtime.cpu.stored_weights import LAYOUTS

    def fp8():
        q = rng.integers(-100, 100, (o, n), dtype=np.int8)
        q[q == -1] = 1  # no E4M3 NaN code (0xFF; 0x7F is out of the range)
        return q, rng.random(o, dtype=np.float32)
    stored = {FP8_E4M3: fp8,
              NVFP4: lambda: (rng.integers(0, 256, (o, n // 2), dtype=np.uint8),
                              rng.integers(8, 0x70, (o, n // 16), dtype=np.uint8), np.float32(0.01)),
              BF16: lambda: (rng.integers(0x3C00, 0x3F00, (o, n), dtype=np.uint16),)}
    return LAYOUTS[fmt].load(None, "w", *stored[fmt]())


def kernels(threads: int, rows: int) -> dict:
    """Our linear kernels on one token's worth of the 0.6B shape's matrices (28 layers x q, k, v, o,
    gate, up, down, random weights: 440 M, more than the caches hold) per bundle weight format, as the model
    runs them (stored_weights.LAYOUTS), and the 151,936-row bf16 head (``head_bf16``), ``rows`` activation
    rows: best of 3 passes, ns per weight (per row) and GB/s of weights read."""
    import numpy as np

    from toolcall.common.formats import BF16, WEIGHT_FORMATS
    from toolcall.runtime.cpu import linear_high as lh
    from toolcall.runtime.cpu.fast_model import set_threads
    from toolcall.runtime.cpu.stored_weights import LAYOUTS, StoredLinear

    set_threads(threads)
    rng = np.random.default_rng(0)
    out = {}
    cases = [(fmt.name, list(QWEN3_06B_LINEARS) * 28, fmt) for fmt in WEIGHT_FORMATS if fmt.in_bundles]
    for name, shapes, fmt in cases + [("head_bf16", [(151936, 1024)], None)]:
        if fmt is None:  # the head: bf16 rows (u16 bits)
            mats = [StoredLinear(BF16, rng.integers(0x3C00, 0x3F00, shapes[0], dtype=np.uint16))]
        else:
            mats = [_random_linear(fmt, o, n, rng) for o, n in shapes]
        xs = {n: rng.standard_normal((rows, n), dtype=np.float32) for _, n in shapes}
        ys = {o: np.empty((rows, o), np.float32) for o, _ in shapes}

        def run():
            for (o, n), m in zip(shapes, mats):
                if fmt is None:
                    lh.linear_rows(xs[n], m.weight, ys[o])
                else:
                    LAYOUTS[fmt].run(m, xs[n], ys[o])
        run()
        best = min(_timed(run) for _ in range(3))
        weights = sum(o * n for o, n in shapes)
        nbytes = sum(a.nbytes for m in mats for a in (m.weight, m.scale, m.block, m.global_scale) if a is not None)
        out[name] = {"seconds": best, "weights": weights, "ns_per_weight_row": best / weights / rows * 1e9,
                     "weight_GB_s": nbytes / best / 1e9}
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    versions = {}
    for mod in ("numpy", "numba", "torch", "transformers"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "loadavg": os.getloadavg(), "versions": versions,
            "shared": "a 2-core VM shared with other jobs: figures are relative, taken interleaved in one run"}


def run_child(kind: str, target: str, args, python: str) -> dict:
    cmd = [python, __file__, "--child", kind, target, "--threads", str(args.threads),
           "--prefill-tokens", str(args.prefill_tokens), "--decode-tokens", str(args.decode_tokens)]
    if kind == "llama" and not args.llama_extra_bufts:
        cmd.append("--no-llama-extra-bufts")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.timeout,
                          env={**os.environ, "PYTHONPATH": str(checkout.import_folder(ROOT))})
    if proc.returncode < 0:  # killed by a signal: SIGILL from llama.cpp is an AMX build on a VM without AMX state
        hint = " (an AMX build where AMX faults: build without AMX, see the docstring)" if proc.returncode == -4 else ""
        return {"error": f"killed by {signal.Signals(-proc.returncode).name}{hint}"}
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(r: dict, prefill: int) -> dict:
    if "error" in r:
        return r
    steps = sorted(r["decode_step_s"][1:] or r["decode_step_s"])  # the first step warms caches
    median = steps[len(steps) // 2]
    return {"decode_tok_s": 1.0 / median, "prefill_tok_s": prefill / r["prefill_s"], "peak_rss_bytes": r["peak_rss"],
            "load_s": r["load_s"], **{k: v for k, v in r.items() if k not in ("decode_step_s",)}}


def combine(runs: list[dict]) -> dict:
    """One engine over the runs: the median of each figure, the runs listed; the largest peak RSS."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    out = {k: v for k, v in ok[-1].items() if k not in ("decode_tok_s", "prefill_tok_s", "load_s", "prefill_s",
                                                          "peak_rss", "peak_rss_bytes")}
    for key in ("decode_tok_s", "prefill_tok_s", "load_s"):
        out[key] = statistics.median(r[key] for r in ok)
        out[key + "_runs"] = [r[key] for r in ok]
    out["peak_rss_bytes"] = max(r["peak_rss_bytes"] for r in ok)
    out["peak_rss_bytes_runs"] = [r["peak_rss_bytes"] for r in ok]
    if len(ok) < len(runs):
        out["failed_runs"] = [r["error"] for r in runs if "error" in r]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--bundles", type=Path)
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prefill-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=1, help="Repeat the whole interleaved sequence; figures are medians.")
    ap.add_argument("--llama-python", default=sys.executable, help="A python with llama-cpp-python installed.")
    ap.add_argument("--llama-extra-bufts", action=argparse.BooleanOptionalAction, default=True,
                    help="llama.cpp's extra CPU buffer types (weight repacking, AMX), on by default as in "
                         "llama.cpp; where an AMX build faults, use a build without AMX (see above).")
    ap.add_argument("--make-gguf", type=Path, default=None, metavar="CONVERTER",
                    help="Make the GGUFs first with this wrapper of llama.cpp's convert_hf_to_gguf.py.")
    ap.add_argument("--only", default=",".join(ORDER),
                    help="Comma-separated engines, in run order (also reference:fp8_e4m3, the numpy backend).")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    ap.add_argument("--kernels", action="store_true", help="Time our linear kernels alone (no checkpoint needed).")
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.kernels:
        info = {"machine": machine(), "threads": args.threads, "kernels": {}}
        for rows in (1, args.prefill_tokens):
            info["kernels"][rows] = kernels(args.threads, rows)
        info["machine"]["loadavg_end"] = os.getloadavg()
        print(f"cpu_compare --kernels ({args.threads} threads): " + "; ".join(
            f"{fmt} T={rows} {k['ns_per_weight_row']:.3f} ns/weight/row ({k['weight_GB_s']:.1f} GB/s)"
            for rows, ks in info["kernels"].items() for fmt, k in ks.items()))
        if args.json_out:
            args.json_out.write_text(json.dumps(info, indent=2) + "\n")
        return

    if args.child:
        kind, target = args.child
        run = {"ours": child_ours, "transformers": child_transformers,
               "llama": lambda *a: child_llama(*a, extra_bufts=args.llama_extra_bufts),
               "reference": lambda *a: child_ours(*a, backend="reference")}[kind]
        result = run(target, args.threads, args.prefill_tokens, args.decode_tokens)
        print(json.dumps({**result, "peak_rss": _peak_rss()}))
        return

    if args.make_gguf is not None:
        make_gguf(args.checkpoint, args.gguf, args.llama_python, args.make_gguf)
    engines = args.only.split(",")
    info = {"machine": machine(), "threads": args.threads, "prefill_tokens": args.prefill_tokens,
            "decode_tokens": args.decode_tokens, "checkpoint": str(args.checkpoint), "runs": [], "engines": {}}
    for run in range(args.runs):  # each run: every engine once, in order (ours/theirs interleaved)
        results = {}
        for engine in engines:
            kind, name = engine.split(":")
            if kind in ("ours", "reference"):  # reference: the numpy float32 backend on the same bundle
                r = run_child(kind, str(args.bundles / name), args, sys.executable)
            elif kind == "llama":
                r = run_child("llama", str(args.gguf / f"{name}.gguf"), args, args.llama_python)
            else:
                r = run_child("transformers", str(args.checkpoint), args, sys.executable)
            results[engine] = summarize(r, args.prefill_tokens)
            print(f"run {run + 1} {engine}: {json.dumps(results[engine])}", file=sys.stderr)
        info["runs"].append(results)
    info["machine"]["loadavg_end"] = os.getloadavg()
    for engine in engines:
        info["engines"][engine] = combine([results[engine] for results in info["runs"]])
    e = info["engines"]

    def tok(name, key="decode_tok_s"):
        return e.get(name, {}).get(key)

    def ratio(a, b):
        return (tok(a) / tok(b)) if tok(a) and tok(b) else None

    info["ratios"] = {"fp8_vs_q8_0": ratio("ours:fp8_e4m3", "llama:q8_0"),
                      "nvfp4_vs_q4_0": ratio("ours:nvfp4", "llama:q4_0"),
                      "fp8_vs_transformers": ratio("ours:fp8_e4m3", "transformers:bf16"),
                      "nvfp4_vs_transformers": ratio("ours:nvfp4", "transformers:bf16")}

    def figure(name, key):
        runs = " / ".join(f"{v:.1f}" for v in e[name][key + "_runs"])
        return f"{tok(name, key):.2f} ({runs})" if len(e[name][key + "_runs"]) > 1 else f"{tok(name, key):.1f}"
    parts = []
    for name in e:
        if "error" in e[name]:
            parts.append(f"{name} failed: {e[name]['error']}")
        else:
            parts.append(f"{name} {figure(name, 'decode_tok_s')} tok/s decode, "
                         f"{figure(name, 'prefill_tok_s')} prefill, {e[name]['peak_rss_bytes'] / 2**30:.2f} GiB")
    r = info["ratios"]
    fmt = lambda v: f"{v:.2f}x" if v else "n/a"  # noqa: E731
    print(f"cpu_compare ({args.threads} threads, median of {args.runs} runs): " + "; ".join(parts) +
          f" | fp8/Q8_0 {fmt(r['fp8_vs_q8_0'])}, nvfp4/Q4_0 {fmt(r['nvfp4_vs_q4_0'])}, "
          f"fp8/transformers {fmt(r['fp8_vs_transformers'])}")
    if args.json_out:
        args.json_out.write_text(json.dumps(info, indent=2) + "\n")


if __name__ == "__main__":
    main()
