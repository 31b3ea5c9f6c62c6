"""The fast CPU backend's output-panel linear kernels (runtime/cpu/panel_kernels.py) on the weight formats it
holds in panels (fp8_e4m3, bf16), best of --repeats passes:

- tiny: the serving model's matrices (models/toolcall-qwen3-tiny: hidden 192, intermediate 512, q 192,
  kv 64: q, k, v, o, gate, up, down) x 6 layers, --rows activation rows (default 64, a serving step), GMAC/s;
- 0.6B: one token (T=1) through the 0.6B shape's 28 layers of linears (440 M weights, more than the
  caches hold), ns per weight and GB/s of weights read (the batch-1 decode figure).

    python bench/panel_kernels.py [--threads 1] [--rows 64] [--repeats 7] [--skip-06b] [--json OUT]

Prints one summary line; writes JSON with the machine recorded. Not part of CI.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()

TINY_LINEARS = ((192, 192), (64, 192), (64, 192), (192, 192), (512, 192), (512, 192), (192, 512))  # (out, in)


def _runner(fmt, shapes, rows: int, rng):
    """One call: every linear of ``shapes`` [(out, in)] on random ``fmt`` weights, ``rows`` rows; its weight bytes."""
    import numpy as np
    from cpu_compare import _random_linear

    from toolcall.runtime.cpu.stored_weights import LAYOUTS
    lins = [_random_linear(fmt, o, n, rng) for o, n in shapes]
    xs = {n: rng.standard_normal((rows, n), dtype=np.float32) for _, n in shapes}
    ys = {o: np.empty((rows, o), np.float32) for o, _ in shapes}
    run = LAYOUTS[fmt].run

    def call():
        for (o, n), lin in zip(shapes, lins):
            run(lin, xs[n], ys[o])
    return call, sum(a.nbytes for lin in lins for a in (lin.weight, lin.scale) if a is not None)


def _best(fn, repeats: int, inner: int) -> float:
    """Seconds per call of fn, best of ``repeats`` passes of ``inner`` calls."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def measure(threads: int, rows: int, repeats: int, with_06b: bool) -> dict:
    import numpy as np
    from cpu_compare import QWEN3_06B_LINEARS

    from toolcall.common.formats import BF16, FP8_E4M3
    from toolcall.runtime.cpu.fast_model import set_threads
    set_threads(threads)
    rng = np.random.default_rng(0)
    out = {}
    for fmt in (FP8_E4M3, BF16):
        shapes = list(TINY_LINEARS) * 6
        call, _ = _runner(fmt, shapes, rows, rng)
        seconds = _best(call, repeats, 20)
        out[f"tiny_{fmt.name}_T{rows}"] = {"GMAC_s": rows * sum(o * n for o, n in shapes) / seconds / 1e9,
                                           "seconds": seconds}
    if with_06b:
        for fmt in (FP8_E4M3, BF16):
            shapes = list(QWEN3_06B_LINEARS) * 28
            call, nbytes = _runner(fmt, shapes, 1, rng)
            seconds = _best(call, max(3, repeats // 2), 1)
            out[f"0.6b_{fmt.name}_T1"] = {"ns_per_weight": seconds / sum(o * n for o, n in shapes) * 1e9,
                                          "GB_s": nbytes / seconds / 1e9, "seconds": seconds}
            del call
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--skip-06b", action="store_true", help="Only the tiny shapes (no 0.9 GB of 0.6B matrices).")
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    args = ap.parse_args()
    from cpu_compare import machine
    res = measure(args.threads, args.rows, args.repeats, not args.skip_06b)
    parts = [f"{name} {r['GMAC_s']:.1f} GMAC/s" if "GMAC_s" in r else
             f"{name} {r['ns_per_weight']:.3f} ns/weight ({r['GB_s']:.1f} GB/s)" for name, r in res.items()]
    print(f"panel_kernels ({args.threads} threads): " + "; ".join(parts))
    if args.json_out:
        info = {"machine": {**machine(), "loadavg_end": os.getloadavg()}, "threads": args.threads, "results": res}
        args.json_out.write_text(json.dumps(info, indent=2) + "\n")


if __name__ == "__main__":
    main()
