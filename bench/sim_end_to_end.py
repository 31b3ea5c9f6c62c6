"""A GPU bundle on the simulated device against the CPU bundle of the same checkpoint and precision, request by
request: the tool model's hand-written set (or one request in --every), batched as `runtime run` batches them.

    python bench/sim_end_to_end.py GPU_BUNDLE CPU_BUNDLE [--every N] [--gpu-kernels fma|mma] [--json OUT]

Loads GPU_BUNDLE with `--device sim` (its canary checked there through the serving step and the decode graph) and
CPU_BUNDLE on the reference backend, answers the same requests greedily on both, and compares tools and token ids.
The last line: ``sim end to end: K of N requests equal; load L s; answers A s (S s a request); device ...``.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()

from toolcall.models.recipe.handwritten import load_handwritten  # noqa: E402
from toolcall.runtime.engine import Engine  # noqa: E402


def answer(result) -> list:
    """[tools, token ids] of a Result, or [the refusal's code]."""
    return [list(result.tools), list(result.token_ids)] if hasattr(result, "tools") else [result.code]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gpu_bundle")
    ap.add_argument("cpu_bundle")
    ap.add_argument("--every", type=int, default=1, help="one request in N of the hand-written set")
    ap.add_argument("--gpu-kernels", default="fma")
    ap.add_argument("--json", help="also write the figures and every differing request here")
    args = ap.parse_args()
    texts = [request for request, _ in load_handwritten()[::args.every] if request]
    start = time.perf_counter()
    sim = Engine.load(args.gpu_bundle, gpu_kernels=args.gpu_kernels, device="sim")
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    got = sim.run(texts)
    answer_s = time.perf_counter() - start
    sim.close()
    want = Engine.load(args.cpu_bundle, backend="reference").run(texts)
    differ = [{"request": t, "sim": answer(g), "cpu": answer(w)} for t, g, w in zip(texts, got, want)
              if answer(g) != answer(w)]
    c = sim.contract
    out = {"gpu_bundle": args.gpu_bundle, "target": c.target.name, "precision": c.precision.weights,
           "gpu_kernels": args.gpu_kernels, "requests": len(texts), "equal": len(texts) - len(differ),
           "load_s": load_s, "answers_s": answer_s, "differ": differ, "machine": platform.processor() or platform.machine()}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"sim end to end: {out['equal']} of {len(texts)} requests equal; load {load_s:.1f} s; answers "
          f"{answer_s:.1f} s ({answer_s / max(1, len(texts)):.1f} s a request); device simulated {c.target.name} "
          f"{c.precision.weights} {args.gpu_kernels}")


if __name__ == "__main__":
    main()
