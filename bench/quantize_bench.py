"""Quantization throughput and memory: checkpoint -> bundle weights file, per precision.

    python bench/quantize_bench.py CHECKPOINT_DIR [--precision fp8_e4m3|nvfp4|bf16|all] [--workers 2] [--json OUT]

Each precision runs in a fresh child process, so its peak RSS (getrusage ru_maxrss, which
counts the checkpoint's memory-mapped pages it touched) is its own. Prints one summary line per
precision: wall and CPU seconds, source GB/s (checkpoint bytes as stored / wall seconds), peak
RSS and the 1-minute load average (the build machine is shared); the JSON adds the machine. The weights file goes to a temporary folder and is deleted.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()

TARGETS_GB_PER_S = {"fp8_e4m3": 0.5, "nvfp4": 0.3}  # on the 2-core build machine, Qwen3-0.6B shape
TARGET_PEAK_RSS_GB = 1.5


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import numpy
    return {"platform": platform.platform(), "cpu": cpu or platform.processor(), "cores": os.cpu_count(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
            "python": platform.python_version(), "numpy": numpy.__version__}


def run_one(checkpoint_dir: str, precision: str, workers: int, out_dir: str) -> dict:
    """Runs in the child: one precision, returns its measurements."""
    from toolcall.builder.checkpoint import open_checkpoint
    from toolcall.builder.quantize import quantize_checkpoint

    ckpt = open_checkpoint(checkpoint_dir)
    source_bytes = ckpt.source_bytes()
    out = Path(out_dir) / f"weights-{precision}.safetensors"
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before, sys_before, faults_before = usage.ru_utime + usage.ru_stime, usage.ru_stime, usage.ru_minflt
    started = time.perf_counter()
    report = quantize_checkpoint(ckpt, ckpt.config, precision, out, workers=workers)
    seconds = time.perf_counter() - started
    out_bytes = out.stat().st_size
    out.unlink()
    totals = report.to_dict()["totals"]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"precision": precision, "workers": workers, "seconds": round(seconds, 3),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime - cpu_before, 3),
            "sys_seconds": round(usage.ru_stime - sys_before, 3), "page_faults": usage.ru_minflt - faults_before,
            "load_average_1min": round(os.getloadavg()[0], 2),
            "source_bytes": source_bytes, "source_gb_per_s": round(source_bytes / seconds / 1e9, 3),
            "out_bytes": out_bytes, "peak_rss_gb": round(usage.ru_maxrss * 1024 / 1e9, 3),
            "params": totals["params"], "rel_rms_max": totals.get("rel_rms_max"),
            "target_gb_per_s": TARGETS_GB_PER_S.get(precision), "target_peak_rss_gb": TARGET_PEAK_RSS_GB}


def micro(seed: int = 0) -> dict:
    """ns per element of the plain (ml_dtypes / comparison) and fast paths on one bf16 [3072, 1024]
    tensor (Qwen3-0.6B's gate_proj shape), single thread, best of 5."""
    import ml_dtypes
    import numpy as np

    from toolcall.builder.quantize import DequantError
    from toolcall.common.fp8 import quantize_fp8
    from toolcall.common.nvfp4 import quantize_nvfp4

    w = np.random.default_rng(seed).standard_normal((3072, 1024)).astype(ml_dtypes.bfloat16)
    cases = {"fp8_plain": lambda: quantize_fp8(w, fast=False), "fp8_fast": lambda: quantize_fp8(w),
             "fp8_fast_with_error": lambda: quantize_fp8(w, error=DequantError()),
             "nvfp4_plain": lambda: quantize_nvfp4(w, fast=False), "nvfp4_fast": lambda: quantize_nvfp4(w),
             "nvfp4_fast_with_error": lambda: quantize_nvfp4(w, error=DequantError())}
    out = {}
    for name, run in cases.items():
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - started)
        out[name] = round(best / w.size * 1e9, 2)
    return out


def summary_line(r: dict) -> str:
    target = f", target >= {r['target_gb_per_s']} GB/s" if r["target_gb_per_s"] else ""
    return (f"quantize {r['precision']}: {r['source_bytes'] / 1e9:.2f} GB source in {r['seconds']:.2f} s "
            f"({r['cpu_seconds']:.2f} s CPU) = {r['source_gb_per_s']:.2f} GB/s, peak RSS {r['peak_rss_gb']:.2f} GB, "
            f"out {r['out_bytes'] / 1e9:.2f} GB, workers {r['workers']}, load {r['load_average_1min']}, "
            f"rel RMS max {r['rel_rms_max']}{target}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--precision", default="all", choices=["fp8_e4m3", "nvfp4", "bf16", "all"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--micro", action="store_true", help="also time plain vs fast quantizers per element")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.checkpoint, args.precision, args.workers, args.out_dir)))
        return 0
    precisions = ["fp8_e4m3", "nvfp4"] if args.precision == "all" else [args.precision]
    results = []
    with tempfile.TemporaryDirectory(prefix="quantize-bench-") as out_dir:
        for precision in precisions:
            child = subprocess.run([sys.executable, __file__, args.checkpoint, "--child", "--precision", precision,
                                    "--workers", str(args.workers), "--out-dir", out_dir],
                                   capture_output=True, text=True)
            if child.returncode != 0:
                sys.stderr.write(child.stderr)
                return child.returncode
            result = json.loads(child.stdout.strip().splitlines()[-1])
            results.append(result)
            print(summary_line(result), flush=True)
    doc = {"benchmark": "quantize", "checkpoint": str(Path(args.checkpoint).resolve()),
           "date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine(), "results": results}
    if args.micro:
        doc["micro_ns_per_element"] = micro()
        print("quantize per element (ns, 1 thread, bf16 [3072, 1024]): "
              + ", ".join(f"{k} {v}" for k, v in doc["micro_ns_per_element"].items()), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
