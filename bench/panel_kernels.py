"""The fast CPU backend's linear kernels, old (row dot products, runtime/cpu/linear_kernels.py) against new
(output panels, runtime/cpu/panel_kernels.py), interleaved, best of --repeats passes:

- tiny: the serving model's matrices (models/toolcall-qwen3-tiny: hidden 192, intermediate 512, q 192,
  kv 64: q, k, v, o, gate, up, down), --rows activation rows (default 64, a serving step), GMAC/s;
- 0.6B: one token (T=1) through the 0.6B shape's 28 layers of linears (440 M weights, more than the
  caches hold), ns per weight and GB/s of weights read (the batch-1 decode figure of issue 17).

    python bench/panel_kernels.py [--threads 1] [--rows 64] [--repeats 7] [--skip-06b] [--json OUT]

Prints one summary line; writes JSON with the machine recorded. Not part of CI.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TINY_LINEARS = ((192, 192), (64, 192), (64, 192), (192, 192), (512, 192), (512, 192), (192, 512))  # (out, in)
QWEN3_06B_LINEARS = ((2048, 1024), (1024, 1024), (1024, 1024), (1024, 2048), (3072, 1024), (3072, 1024),
                     (1024, 3072))


def _mats(fmt: str, shapes, rng):
    import numpy as np

    from runtime.cpu import panel_kernels as pk
    mats = []
    for o, n in shapes:
        if fmt == "fp8":  # E4M3 codes without the NaN ones (0x7F / 0xFF)
            q = rng.integers(-100, 100, (o, n), dtype=np.int8)
            s = rng.random(o, dtype=np.float32)
            mats.append(((q, s), (pk.repack(q), pk.padded_scale(s))))
        else:
            w = rng.integers(0x3C00, 0x3F00, (o, n), dtype=np.uint16)
            mats.append(((w,), (pk.repack(w),)))
    return mats


def _runners(fmt: str, shapes, mats, rows: int, rng):
    import numpy as np

    from runtime.cpu import linear_high as lh, linear_kernels as lk, panel_kernels as pk
    xs = {n: rng.standard_normal((rows, n), dtype=np.float32) for _, n in shapes}
    ys = {o: np.empty((rows, o), np.float32) for o, _ in shapes}

    def old():
        for (o, n), (m, _) in zip(shapes, mats):
            lk.linear_fp8(xs[n], m[0], m[1], ys[o]) if fmt == "fp8" else lh.linear_bf16(xs[n], m[0], ys[o])

    def new():
        for (o, n), (_, m) in zip(shapes, mats):
            pk.linear_fp8_panels(xs[n], m[0], m[1], ys[o]) if fmt == "fp8" else pk.linear_bf16_panels(xs[n], m[0],
                                                                                                    ys[o])
    return old, new


def _best(fns, repeats: int, inner: int) -> list[float]:
    """Seconds per call of each fn, best of ``repeats`` passes of ``inner`` calls, the fns interleaved."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / inner)
    return best


def measure(threads: int, rows: int, repeats: int, with_06b: bool) -> dict:
    import numpy as np

    from runtime.cpu.fast_model import set_threads
    set_threads(threads)
    rng = np.random.default_rng(0)
    out = {}
    for fmt in ("fp8", "bf16"):
        shapes = list(TINY_LINEARS) * 6
        mats = _mats(fmt, shapes, rng)
        old, new = _best(_runners(fmt, shapes, mats, rows, rng), repeats, 20)
        macs = rows * sum(o * n for o, n in shapes)
        out[f"tiny_{fmt}_T{rows}"] = {"old_GMAC_s": macs / old / 1e9, "new_GMAC_s": macs / new / 1e9,
                                      "speedup": old / new, "old_s": old, "new_s": new}
    if with_06b:
        for fmt in ("fp8", "bf16"):
            shapes = list(QWEN3_06B_LINEARS) * 28
            mats = _mats(fmt, shapes, rng)
            old, new = _best(_runners(fmt, shapes, mats, 1, rng), max(3, repeats // 2), 1)
            weights = sum(o * n for o, n in shapes)
            nbytes = sum(a.nbytes for m, _ in mats for a in m)
            out[f"0.6b_{fmt}_T1"] = {"old_ns_per_weight": old / weights * 1e9, "new_ns_per_weight": new / weights * 1e9,
                                     "old_GB_s": nbytes / old / 1e9, "new_GB_s": nbytes / new / 1e9,
                                     "speedup": old / new}
            del mats
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--skip-06b", action="store_true", help="Only the tiny shapes (no 0.9 GB of 0.6B matrices).")
    ap.add_argument("--json", dest="json_out", type=Path, default=None)
    args = ap.parse_args()
    from bench.cpu_compare import machine
    res = measure(args.threads, args.rows, args.repeats, not args.skip_06b)
    parts = []
    for name, r in res.items():
        if "old_GMAC_s" in r:
            parts.append(f"{name} {r['old_GMAC_s']:.1f} -> {r['new_GMAC_s']:.1f} GMAC/s (x{r['speedup']:.2f})")
        else:
            parts.append(f"{name} {r['old_ns_per_weight']:.3f} -> {r['new_ns_per_weight']:.3f} ns/weight "
                         f"({r['old_GB_s']:.1f} -> {r['new_GB_s']:.1f} GB/s)")
    print(f"panel_kernels ({args.threads} threads, old -> new): " + "; ".join(parts))
    if args.json_out:
        info = {"machine": {**machine(), "loadavg_end": os.getloadavg()}, "threads": args.threads, "results": res}
        args.json_out.write_text(json.dumps(info, indent=2) + "\n")


if __name__ == "__main__":
    main()
