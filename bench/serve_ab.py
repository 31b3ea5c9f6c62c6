"""A/B of two checkouts' servers on one bundle: engine bursts only, alternated, each on a fresh server.

    python3 bench/serve_ab.py BUNDLE OLD_CHECKOUT [--new CHECKOUT] [--pairs 8] [--clients 2048] [--json out.json]

For a speed change of the runtime: `git worktree add /tmp/old HEAD~1`, then this. Each burst starts
`runtime serve BUNDLE` from that checkout's tree (bench/serve_burst.py's Server, cwd = the checkout, so
its own runtime/ is imported), warms it with 64 requests, fires --clients concurrent requests (serve_burst's
bodies) and stops it; the sides alternate, the order flipped every pair (old-new, new-old, ...) so
neither always runs first. Prints each burst (requests/s, the server's CPU ms a request: main thread and
the others) and each side's median and mean. No no-op server: the HTTP stack is the same on both sides,
and a no-op burst's own spread (a third between runs on 2 cores) would drown a few per cent. Answers are
not compared here (serve_burst does that); a burst with a request not answered 200 is reported.
Listens on 127.0.0.1 only; every burst bounded by --timeout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()

from serve_burst import burst, requests_for  # noqa: E402
from serve_process import Server, cpu_seconds  # noqa: E402


def one_burst(bundle: str, root: Path, bodies: list[dict], clients: int, timeout_s: float) -> dict:
    server = Server(bundle, False, timeout_s, root=root)
    try:
        asyncio.run(burst(server.url, bodies, min(64, clients), timeout_s))
        main0, other0 = cpu_seconds(server.proc.pid)
        records, wall = asyncio.run(burst(server.url, bodies, clients, timeout_s))
        main1, other1 = cpu_seconds(server.proc.pid)
    finally:
        server.stop()
    return {"requests_per_s": clients / wall, "answered": sum(1 for r in records if r.get("status") == 200),
            "cpu_ms_main": 1e3 * (main1 - main0) / clients, "cpu_ms_other": 1e3 * (other1 - other0) / clients}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("old", type=Path, help="The other checkout (a git worktree of the base commit).")
    ap.add_argument("--new", type=Path, default=ROOT, help="The checkout under test [default: this one].")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--clients", type=int, default=2048)
    ap.add_argument("--timeout", type=float, default=600.0, help="Seconds a burst may take.")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    for side in (args.old, args.new):
        if not (side / "runtime" / "cli.py").is_file():
            raise SystemExit(f"error: {side} is not a checkout of this project (no runtime/cli.py)")
    bodies = requests_for(256)
    sides = {"old": args.old.resolve(), "new": args.new.resolve()}
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for pair in range(args.pairs):
        for side in (("old", "new") if pair % 2 == 0 else ("new", "old")):
            run = one_burst(args.bundle, sides[side], bodies, args.clients, args.timeout)
            runs[side].append(run)
            print(f"pair {pair + 1}/{args.pairs} {side}: {run['requests_per_s']:.0f} requests/s, "
                  f"{run['answered']}/{args.clients} answered, CPU ms a request: server main {run['cpu_ms_main']:.3f}, "
                  f"other threads {run['cpu_ms_other']:.3f}", flush=True)
    summary = {}
    for side, rs in runs.items():
        rate = [r["requests_per_s"] for r in rs]
        summary[side] = {"checkout": str(sides[side]), "median_requests_per_s": statistics.median(rate),
                         "mean_requests_per_s": statistics.mean(rate),
                         "median_cpu_ms_other": statistics.median(r["cpu_ms_other"] for r in rs),
                         "median_cpu_ms_main": statistics.median(r["cpu_ms_main"] for r in rs),
                         "all_answered": all(r["answered"] == args.clients for r in rs)}
        s = summary[side]
        print(f"{side}: median {s['median_requests_per_s']:.0f} requests/s (mean {s['mean_requests_per_s']:.0f}), "
              f"CPU ms a request: other threads {s['median_cpu_ms_other']:.3f}, main {s['median_cpu_ms_main']:.3f}"
              f"{'' if s['all_answered'] else '; NOT every request answered 200'}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"bundle": args.bundle, "clients": args.clients, "runs": runs,
                                                   "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
