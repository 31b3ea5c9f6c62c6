"""The serving engine without the server: the burst's requests (bench/serve_burst.py's bodies) handed to
the bundle's generator at once, best of --repeats passes; requests/s, ms a request, rows a request, and
with --profile the top functions by own time (cProfile). What the engine costs a burst request when
nothing else shares the machine: the figure serve_burst's rate is measured against. Also the process's
CPU ms a request (all threads, and the engine thread's own: plan and land, which with lanes is all but the
kernels), and with --lanes N the server's lanes (runtime/batching/lanes.py) instead of one generator.

    python bench/engine_alone.py BUNDLE [--requests 2048] [--threads 1] [--lanes 1] [--repeats 3] [--warm 256]
                                        [--profile [--sort tottime|cumulative]]

Not part of CI.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()

from serve_burst import requests_for, sampling_of  # noqa: E402

from toolcall.runtime.engine import Engine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1, help="Kernel threads.")
    ap.add_argument("--lanes", type=int, default=1, help="Lanes (runtime/batching/lanes.py), each on --threads kernel threads.")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warm", type=int, default=256,
                    help="Requests run before the timed passes (256: every distinct prompt prefilled; the burst's "
                         "warm-up is 64, so a cold pass is --warm 64 --repeats 1).")
    ap.add_argument("--profile", action="store_true", help="One more pass under cProfile; its top 20 by --sort.")
    ap.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"], help="The profile's order.")
    ap.add_argument("--json", help="also write the figures here (requests, requests_per_s, ms_per_request, ...)")
    args = ap.parse_args()
    engine = Engine.load(args.bundle, threads=args.threads)
    bodies = requests_for(256)

    def requests():
        cycle = (bodies * (args.requests // len(bodies) + 1))[:args.requests]
        return [engine.request(b["request"], sampling_of(b)) for b in cycle]

    generator, rows = engine.generator, [0]
    if args.lanes > 1:
        from toolcall.runtime.batching.lanes import Lanes
        generator = Lanes.of(generator, args.lanes)
    models = generator.lanes if args.lanes > 1 else [generator]
    for g in models:  # every forward of the fast model goes through forward_call (the lanes call it directly)
        name = "forward_call" if hasattr(g.model, "forward_call") else "forward"
        def counted(tokens, *a, _call=getattr(g.model, name), **k):
            rows[0] += len(tokens)
            return _call(tokens, *a, **k)
        setattr(g.model, name, counted)
    generator.generate(requests()[:args.warm])  # warm: the kernels' first calls, the pool's pages
    best, cpu, engine_cpu = float("inf"), float("inf"), float("inf")
    for _ in range(args.repeats):
        rows[0], batch = 0, requests()
        start, start_cpu, start_thread = time.perf_counter(), time.process_time(), time.thread_time()
        generator.generate(batch)  # on this thread: the engine thread's part (plan, land; with lanes, not the kernels)
        best, cpu = min(best, time.perf_counter() - start), min(cpu, time.process_time() - start_cpu)
        engine_cpu = min(engine_cpu, time.thread_time() - start_thread)
    n = args.requests
    print(f"engine_alone: {n} requests, {args.lanes} lane(s) of {args.threads} thread(s): best {best:.3f} s, "
          f"{n / best:.0f} requests/s, {1e3 * best / n:.3f} ms a request, CPU {1e3 * cpu / n:.3f} ms a request "
          f"(engine thread {1e3 * engine_cpu / n:.3f}), {rows[0] / n:.1f} rows a request")
    if args.json:  # rows: counted where the backend's forward is called (the CPU's; a GPU step keeps them)
        import json
        from pathlib import Path
        Path(args.json).write_text(json.dumps({
            "requests": n, "lanes": args.lanes, "threads": args.threads, "best_s": best, "requests_per_s": n / best,
            "ms_per_request": 1e3 * best / n, "cpu_ms_per_request": 1e3 * cpu / n,
            "engine_thread_ms_per_request": 1e3 * engine_cpu / n, "rows_per_request": rows[0] / n}, indent=1))
    if args.profile:
        profile, batch = cProfile.Profile(), requests()
        profile.enable()
        generator.generate(batch)
        profile.disable()
        pstats.Stats(profile).sort_stats(args.sort).print_stats(20)


if __name__ == "__main__":
    main()
