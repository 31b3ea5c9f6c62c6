"""The serving engine without the server: the burst's requests (bench/serve_burst.py's bodies) handed to
the bundle's generator at once, best of --repeats passes; requests/s, ms a request, rows a request, and
with --profile the top functions by own time (cProfile). What the engine costs a burst request when
nothing else shares the machine: the figure serve_burst's rate is measured against.

    python bench/engine_alone.py BUNDLE [--requests 2048] [--threads 1] [--repeats 3] [--profile]

Not part of CI.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.serve_burst import requests_for, sampling_of  # noqa: E402
from runtime.engine import Engine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1, help="Kernel threads.")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="One more pass under cProfile; its top 20 by own time.")
    args = ap.parse_args()
    engine = Engine.load(args.bundle, threads=args.threads)
    bodies = requests_for(256)

    def requests():
        cycle = (bodies * (args.requests // len(bodies) + 1))[:args.requests]
        return [engine.request(b["request"], sampling_of(b)) for b in cycle]

    generator, forward, rows = engine.generator, engine.generator.model.forward, [0]

    def counted(tokens, *a, **k):
        rows[0] += len(tokens)
        return forward(tokens, *a, **k)

    generator.generate(requests()[:256])  # warm: the kernels' first calls, the pool's pages
    generator.model.forward = counted
    best = float("inf")
    for _ in range(args.repeats):
        rows[0], batch = 0, requests()
        start = time.perf_counter()
        generator.generate(batch)
        best = min(best, time.perf_counter() - start)
    n = args.requests
    print(f"engine_alone: {n} requests, {args.threads} thread(s): best {best:.3f} s, {n / best:.0f} requests/s, "
          f"{1e3 * best / n:.3f} ms a request, {rows[0] / n:.1f} rows a request")
    if args.profile:
        profile, batch = cProfile.Profile(), requests()
        profile.enable()
        generator.generate(batch)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
