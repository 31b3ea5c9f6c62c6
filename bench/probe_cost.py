"""The catalog probe's cost in a build: `builder compile` (CPU target) of a checkpoint with a catalog, timed by stage.

``python3 bench/probe_cost.py CHECKPOINT [--catalog FILE | --tools N] [--runs R] [--probe-all] [--json OUT]``

--tools N generates a catalog of N tools (``synth_catalog``: "<verb>_<object>_<i>" names, one-sentence
descriptions; the same N, the same file), the kind of catalog issue 55 measured at the contract's 16,384.
Each run is a fresh `builder compile --force --json` process (imports and numba's cache loads included, as a
user runs it); the figures are per run: the process's wall time, the build's stages (``timings_s``: plan holds
the catalog and grammar, canary and probe their runs), the probe's share of the wall, peak RSS, the probe's
sample and recall. The summary line gives the medians; the JSON holds every run and the machine (CPU model,
CPUs, the load average before each run: the figures are only comparable on an idle machine).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VERBS = ("search", "book", "cancel", "check", "list", "create", "delete", "update", "send", "read", "fetch",
         "find", "show", "open", "close", "move", "copy", "rename", "share", "play", "stop", "start", "pause",
         "resume", "convert", "translate", "summarize", "schedule", "remind", "order", "track", "pay", "refund")
OBJECTS = ("flight", "hotel", "car", "email", "message", "file", "folder", "note", "task", "event", "meeting", "song",
           "video", "photo", "invoice", "payment", "order", "package", "weather", "news", "stock", "recipe",
           "restaurant", "ticket", "account", "user", "report", "document")


def synth_catalog(tools: int) -> dict:
    """A catalog of ``tools`` unique tools: name ``<verb>_<object>_<i>``, description a sentence naming both."""
    out = []
    for i in range(tools):
        verb, obj = VERBS[i % len(VERBS)], OBJECTS[(i // len(VERBS)) % len(OBJECTS)]
        out.append({"name": f"{verb}_{obj}_{i}", "description": f"{verb.capitalize()} the {obj} number {i} for the user."})
    return {"tools": out}


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"cpu": model, "cpus": os.cpu_count(), "python": platform.python_version()}


def one_build(checkpoint: str, catalog: Path, out: Path, probe_all: bool) -> dict:
    load = os.getloadavg()[0]
    cmd = [sys.executable, "-c", "from toolcall.builder.cli import main; main()", "compile", checkpoint, "--catalog", str(catalog), "--target",
           "cpu", "--out", str(out), "--force", "--json"] + (["--probe-all"] if probe_all else [])
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"builder compile failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    t = report["timings_s"]
    probe = report["probe"]
    return {"wall_s": wall, "stages_s": t, "stages_sum_s": sum(t.values()), "probe_s": t["probe"],
            "probe_share_of_wall": t["probe"] / wall, "peak_rss_bytes": report["peak_rss_bytes"],
            "load_before": load, "sampled_tools": probe["sampled_tools"], "catalog_tools": probe["catalog_tools"],
            "sample_method": probe["sample_method"], "recall": probe["recall"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--tools", type=int, default=None, help="Generate a catalog of this many tools instead.")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--probe-all", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if (args.catalog is None) == (args.tools is None):
        ap.error("give one of --catalog or --tools")
    with tempfile.TemporaryDirectory(prefix="probe-cost-") as tmp:
        catalog = Path(args.catalog) if args.catalog else Path(tmp) / f"tools-{args.tools}.json"
        if args.tools is not None:
            catalog.write_text(json.dumps(synth_catalog(args.tools)))
        runs = [one_build(args.checkpoint, catalog, Path(tmp) / "bundle", args.probe_all) for _ in range(args.runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "probe_s", "probe_share_of_wall")}
    stages = {k: statistics.median(r["stages_s"][k] for r in runs) for k in runs[0]["stages_s"]}
    print(f"{runs[0]['catalog_tools']} tools, {runs[0]['sampled_tools']} probed ({runs[0]['sample_method']}): "
          f"build wall {med['wall_s']:.2f} s, probe {med['probe_s']:.2f} s ({100 * med['probe_share_of_wall']:.0f} % "
          f"of the wall), stages " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
          + f"; median of {len(runs)}, load before " + ", ".join(f"{r['load_before']:.1f}" for r in runs))
    if args.json:
        Path(args.json).write_text(json.dumps({"checkpoint": args.checkpoint, "catalog": args.catalog,
                                               "tools": args.tools, "probe_all": args.probe_all, "runs": runs,
                                               "median": {**med, "stages_s": stages}, "machine": machine()},
                                              indent=2) + "\n")


if __name__ == "__main__":
    main()
