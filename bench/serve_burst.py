"""Burst benchmark of `runtime serve`: N concurrent callers against one bundle on loopback.

    python3 bench/serve_burst.py BUNDLE [--clients 2048] [--distinct 256] [--rounds 1] [--json out.json]

Starts `runtime serve BUNDLE --port 0` (a subprocess on 127.0.0.1), fires N concurrent aiohttp
clients (connection limits lifted) with varied tool-discovery requests (the tool model's test
split; a quarter sampled with a seed), and reports requests/s, p50/p99 latency, TTFT, refusals
by reason and lost (= requests with neither an answer nor a typed refusal). Every answer is
compared with the same request run alone on the CPU reference. Then the same burst against
the same server with a no-op engine (bench/noop_engine.py): our rate as a share of the HTTP stack's
own ceiling on this machine. Also: KV pages in use after the burst (must be 0) and the server's
RSS before and after, and where the burst's CPU went: milliseconds a request on the server's
main thread (the event loop), its other threads (the engine and lanes), and this client. With
--rounds N the pair (engine, then no-op, each on a fresh server) runs N times interleaved, and the
share is the median of the rounds' shares (a single no-op burst on a 2-core machine moves by a
third between runs): a line and two CPU lines a round, then the summary; JSON with every round
and the machine recorded.

With --device sim (a GPU bundle on the simulated device, runtime/cuda/devices.py) the burst checks answers only:
the same requests alone on the simulated device are the reference, and the warm-up burst, the no-op engine and
the heap waits (timing) are left out; keep --clients small (bench/RESULTS.md has the simulated device's speed).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import time
from pathlib import Path

import numpy as np

import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()
from serve_process import Server, client_cpu_seconds, cpu_seconds, rss_bytes  # noqa: E402


def requests_for(distinct: int) -> list[dict]:
    """``distinct`` request bodies: test-split texts; every fourth sampled (temperature 0.8, its own seed)."""
    from toolcall.models.recipe.data import make_split

    texts = [e.request for e in make_split("test", size=max(distinct, 1))][:distinct]
    return [{"request": t, **({"temperature": 0.8, "top_p": 0.95, "seed": i} if i % 4 == 3 else {})}
            for i, t in enumerate(texts)]


def sampling_of(body: dict):
    """The Sampling a /v1/discover body asks for (the server's defaults where it is silent)."""
    from toolcall.runtime.batching.sampling import Sampling

    return Sampling(body.get("temperature", 0.0), body.get("top_p", 1.0), body.get("seed", 0))


def solo_answers(bundle: str, bodies: list[dict], device: str) -> list[list[int]]:
    """Each body's token ids, run alone (one request at a time) on the bundle's engine on ``device``."""
    from toolcall.runtime.engine import Engine

    engine = Engine.load(bundle, threads=1, device=device)  # one kernel thread: no barrier stalls on a busy machine
    out = []
    try:
        for b in bodies:
            (res,) = engine.generator.generate([engine.request(b["request"], sampling_of(b))])
            out.append(res.token_ids)
    finally:
        engine.close()  # a GPU bundle's device memory back before the server loads it
    return out


def metric_values(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^toolcall:{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


async def burst(url: str, bodies: list[dict], clients: int, timeout_s: float) -> list[dict]:
    """``clients`` concurrent POST /v1/discover (body i % len(bodies)); one record per client."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    records: list[dict] = [{} for _ in range(clients)]
    start_gate = asyncio.Event()

    async def one(session, i):
        await start_gate.wait()
        t0 = time.perf_counter()
        rec = records[i]
        rec["body"] = i % len(bodies)
        try:
            async with session.post(url + "/v1/discover", json=bodies[i % len(bodies)]) as resp:
                data = await resp.json(content_type=None)
                rec["status"] = resp.status
                rec["data"] = data
        except Exception as e:  # no answer: counted as lost unless a typed refusal came back
            rec["exception"] = f"{type(e).__name__}: {e}"
        rec["latency_s"] = time.perf_counter() - t0

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(one(session, i)) for i in range(clients)]
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        start_gate.set()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return records, wall


def summarize(records: list[dict], wall: float, solo: list[list[int]] | None) -> dict:
    ok = [r for r in records if r.get("status") == 200]
    refused: dict[str, int] = {}
    lost = 0
    for r in records:
        if r.get("status") == 200:
            continue
        err = (r.get("data") or {}).get("error") if isinstance(r.get("data"), dict) else None
        if err and "code" in err:
            refused[err["code"]] = refused.get(err["code"], 0) + 1
        else:
            lost += 1
    different = sum(1 for r in ok if solo is not None and r["data"]["token_ids"] != solo[r["body"]])
    lat = np.array([r["latency_s"] for r in ok]) if ok else np.zeros(1)
    ttft = np.array([r["data"]["ttft_ms"] for r in ok]) if ok else np.zeros(1)
    return {"clients": len(records), "answered": len(ok), "refused": refused, "lost": lost,
            "different_from_solo": different if solo is not None else None, "wall_s": wall,
            "requests_per_s": len(ok) / wall, "p50_ms": 1e3 * float(np.percentile(lat, 50)),
            "p99_ms": 1e3 * float(np.percentile(lat, 99)), "ttft_p50_ms": float(np.percentile(ttft, 50)),
            "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "examples_lost": [r.get("exception") for r in records if "exception" in r][:5]}


def run_one(bundle: str, noop: bool, bodies, solo, clients: int, timeout_s: float, threads: int | None,
            lanes: int | None = None, device: str = "native") -> dict:
    import urllib.request

    timed = device == "native"  # the simulated device checks answers: no warm-up burst, no waits for the heap
    server = Server(bundle, noop, timeout_s, threads, lanes, device=device, ready_s=120.0 if timed else 1200.0)
    try:
        if timed:
            asyncio.run(burst(server.url, bodies, min(64, clients), timeout_s))  # first-call costs
            time.sleep(2.5)  # before and after both measured idle, once the server has trimmed its heap
        rss_before = rss_bytes(server.proc.pid)
        cpu_before, client_before = cpu_seconds(server.proc.pid), client_cpu_seconds()
        records, wall = asyncio.run(burst(server.url, bodies, clients, timeout_s))
        cpu_after, client_after = cpu_seconds(server.proc.pid), client_cpu_seconds()
        if timed:
            time.sleep(2.5)  # the server trims its heap once idle (ticks of 1 s)
        text = urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()
        rss_after = rss_bytes(server.proc.pid)
        models = json.loads(urllib.request.urlopen(server.url + "/v1/models", timeout=30).read())
    finally:
        code = server.stop()
    out = summarize(records, wall, None if noop else solo)
    out.update({"engine": "noop" if noop else "bundle", "rss_before_bytes": rss_before, "rss_after_bytes": rss_after,
                "rss_change": rss_after / max(1, rss_before) - 1.0, "kv_pages_in_use_after": metric_values(text, "kv_pages_in_use"),
                "requests_running_after": metric_values(text, "num_requests_running"),
                "requests_waiting_after": metric_values(text, "num_requests_waiting"), "exit_code": code,
                "model": models["data"][0]["id"],
                # CPU ms a request over the burst: the server's event loop, its other threads, this client
                "cpu_ms_per_request": {"server_main": 1e3 * (cpu_after[0] - cpu_before[0]) / clients,
                                       "server_other": 1e3 * (cpu_after[1] - cpu_before[1]) / clients,
                                       "client": 1e3 * (client_after - client_before) / clients}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--clients", type=int, default=2048)
    ap.add_argument("--distinct", type=int, default=256, help="Distinct request bodies, cycled over the clients.")
    ap.add_argument("--rounds", type=int, default=1, help="Engine/no-op pairs, interleaved; the share is their median.")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="Per-client total timeout, and the server's --request-timeout, seconds.")
    ap.add_argument("--threads", type=int, default=None, help="The server's --threads [default: its own].")
    ap.add_argument("--lanes", type=int, default=None, help="The server's --lanes [default: its own].")
    from toolcall.runtime.cuda.devices import DEVICES, NATIVE
    ap.add_argument("--device", choices=list(DEVICES), default=NATIVE,
                    help="sim: a GPU bundle on the simulated device, answers only (no no-op round, no warm-up)")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    timed = args.device == NATIVE
    if args.rounds < 1 or args.clients < 1 or args.distinct < 1:
        raise SystemExit("--rounds, --clients and --distinct must be at least 1")
    from toolcall.runtime.serve.server import raise_open_files

    soft, _ = raise_open_files()  # this process holds one socket per client
    if soft < args.clients + 64:
        raise SystemExit(f"open-files limit {soft} is below {args.clients} clients; raise `ulimit -n`")

    from toolcall.runtime.bundle.files import read_contract

    contract = read_contract(args.bundle)
    bodies = requests_for(args.distinct)
    t0 = time.perf_counter()
    solo = solo_answers(args.bundle, bodies, args.device)
    solo_s = time.perf_counter() - t0
    rounds = []
    for r in range(args.rounds):
        ours = run_one(args.bundle, False, bodies, solo, args.clients, args.timeout, args.threads, args.lanes,
                       args.device)
        if not timed:
            rounds.append({"engine": ours})
            print_answers(f"round {r + 1}/{args.rounds}: " if args.rounds > 1 else "", args.clients, ours)
            continue
        noop = run_one(args.bundle, True, bodies, None, args.clients, args.timeout, args.threads, args.lanes)
        rounds.append({"engine": ours, "noop": noop,
                       "share_of_noop_rate": ours["requests_per_s"] / max(1e-9, noop["requests_per_s"])})
        print_round(f"round {r + 1}/{args.rounds}: " if args.rounds > 1 else "", args.clients, rounds[-1])
    median = lambda xs: float(np.median(xs)) if timed else None  # noqa: E731
    ours_all = [x["engine"] for x in rounds]
    report = {
        "bench": "serve_burst", "bundle": str(args.bundle), "clients": args.clients, "distinct": args.distinct,
        "threads": args.threads, "lanes": args.lanes, "device": args.device, "rounds": rounds,
        "limits": {"max_sequences": contract.limits.max_sequences, "num_pages": contract.limits.num_pages},
        "solo_reference_s": solo_s,
        # over the rounds: medians of the rates and the share; the worst of everything that must hold
        "requests_per_s": median([o["requests_per_s"] for o in ours_all]),
        "noop_requests_per_s": median([x["noop"]["requests_per_s"] for x in rounds] if timed else []),
        "share_of_noop_rate": median([x["share_of_noop_rate"] for x in rounds] if timed else []),
        "share_min": min(x["share_of_noop_rate"] for x in rounds) if timed else None,
        "share_max": max(x["share_of_noop_rate"] for x in rounds) if timed else None,
        "lost": sum(o["lost"] for o in ours_all), "different_from_solo": sum(o["different_from_solo"] for o in ours_all),
        "kv_pages_in_use_after": max(o["kv_pages_in_use_after"] for o in ours_all),
        "rss_change_max": max(o["rss_change"] for o in ours_all),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg": os.getloadavg()},
    }
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    if args.rounds > 1 and timed:
        print(f"serve_burst, {args.rounds} rounds: median {report['requests_per_s']:.0f} req/s (no-op median "
              f"{report['noop_requests_per_s']:.0f}), share median {report['share_of_noop_rate']:.0%} (rounds "
              f"{report['share_min']:.0%}..{report['share_max']:.0%}); lost {report['lost']}, "
              f"{report['different_from_solo']} differ from solo, kv pages in use after {report['kv_pages_in_use_after']:.0f} "
              f"at most, RSS change {report['rss_change_max']:+.1%} at most")


def print_answers(prefix: str, clients: int, ours: dict) -> None:
    """A round's answers alone (the simulated device: no rates to compare)."""
    print(f"{prefix}serve_burst: {clients} clients, {ours['answered']} answered, refused {ours['refused']}, "
          f"lost {ours['lost']}, {ours['different_from_solo']} differ from alone; wall {ours['wall_s']:.1f} s; "
          f"kv pages in use after {ours['kv_pages_in_use_after']:.0f}", flush=True)


def print_round(prefix: str, clients: int, rnd: dict) -> None:
    ours, noop = rnd["engine"], rnd["noop"]
    print(f"{prefix}serve_burst: {clients} clients, {ours['answered']} answered, refused {ours['refused']}, "
          f"lost {ours['lost']}, {ours['different_from_solo']} differ from solo; {ours['requests_per_s']:.0f} req/s "
          f"(no-op engine {noop['requests_per_s']:.0f} req/s, share {rnd['share_of_noop_rate']:.0%}); "
          f"p50 {ours['p50_ms']:.0f} ms p99 {ours['p99_ms']:.0f} ms, TTFT p50 {ours['ttft_p50_ms']:.0f} ms "
          f"p99 {ours['ttft_p99_ms']:.0f} ms; kv pages in use after {ours['kv_pages_in_use_after']:.0f}; "
          f"RSS {ours['rss_before_bytes'] / 2**20:.0f} -> {ours['rss_after_bytes'] / 2**20:.0f} MiB "
          f"({ours['rss_change']:+.1%}); load avg {os.getloadavg()[0]:.1f}", flush=True)
    for name, run in (("engine", ours), ("no-op", noop)):
        c = run["cpu_ms_per_request"]
        print(f"  CPU ms a request, {name}: server main {c['server_main']:.2f}, server other threads "
              f"{c['server_other']:.2f}, client {c['client']:.2f}; wall ms a request {1e3 * run['wall_s'] / clients:.2f}",
              flush=True)


if __name__ == "__main__":
    main()
