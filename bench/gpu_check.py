"""The one GPU check: builds its bundles, checks kernel parity and token identity, times decode.

Run on the GPU machine from the repository root (no `pip install -e` needed; jsonschema and its
three dependencies come as wheels in .whl/, git-ignored, fetched here first with
`python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl jsonschema
jsonschema-specifications referencing rpds-py`, and carried: `run(carry=[".whl"], timeout_s=540)`):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && \\
        PYTHONUNBUFFERED=1 python3 bench/gpu_check.py

Stages run in their own processes with timeouts under one global budget (--budget-s, default
450 s), so a failing, crashing or hanging stage is reported and the rest still run:
  kernels (GPU) beside build-small and build-q06 (CPU); the small bundles' e2e stages while
  q06 still builds; then cpuref (CPU, 8 threads, every bundle) beside the q06 e2e stages
  (with timings); then the kernel GPU tests through pytest if time is left. Bundles and checkpoints go to --work
  (default artifacts/gpu-check); the JSON (machine facts, every stage's raw result, the summary)
  and the stage logs go to $OUT when set, else artifacts/. The table prints last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from gpu_check_report import machine_facts, summarize, table  # noqa: E402
from gpu_check_stages import BUNDLES  # noqa: E402

# seconds per stage process, each also capped by what is left of the budget
TIMEOUTS = {"build": 330, "kernels": 200, "cpuref": 300, "e2e": 150, "pytest": 180}
RESERVE_S = 15  # kept for the summary and the JSON


def run_stage(args) -> None:
    """Child side: one stage, its result as JSON at --result."""
    work = Path(args.work)
    if args.stage == "build":
        from gpu_check_stages import stage_build
        res = stage_build(work, args.names)
    elif args.stage == "kernels":
        from gpu_check_stages import stage_kernels
        res = stage_kernels()
    elif args.stage == "cpuref":
        from gpu_check_stages import stage_cpuref
        res = stage_cpuref(work, args.names)
    else:
        from gpu_check_e2e import stage_e2e
        res = stage_e2e(work, args.names[0], args.bench)
    Path(args.result).write_text(json.dumps(res, default=str))
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: a device left busy by a stuck graph must not block the exit


class Stages:
    """Starts stage processes and waits for them within the global deadline."""

    def __init__(self, work: Path, budget_s: float):
        self.work, self.deadline, self.start = work, time.monotonic() + budget_s, time.monotonic()
        (work / "logs").mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - RESERVE_S - time.monotonic()

    def launch(self, key: str, stage: str, names=(), bench=False, threads: int | None = None, cmd=None):
        log = open(self.work / "logs" / f"{key}.log", "w")
        result = self.work / "logs" / f"{key}.json"
        result.unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                   PYTHONUNBUFFERED="1")
        if threads:
            env.update({v: str(threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
        if cmd is None:
            cmd = [sys.executable, str(Path(__file__)), "--stage", stage, "--work", str(self.work), "--result",
                   str(result), *(["--names", *names] if names else []), *(["--bench"] if bench else [])]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        print(f"[{time.monotonic() - self.start:6.1f} s] start {key}", flush=True)
        return dict(key=key, proc=proc, log=log, result=result, began=time.monotonic(), timeout=TIMEOUTS[stage])

    def wait(self, h) -> dict:
        limit = max(1.0, min(h["timeout"] - (time.monotonic() - h["began"]), self.left()))
        try:
            rc = h["proc"].wait(timeout=limit)
        except subprocess.TimeoutExpired:
            h["proc"].kill()
            rc = h["proc"].wait()
            res = {"error": f"timeout: killed after {time.monotonic() - h['began']:.0f} s"}
        else:
            if rc == 0 and h["result"].is_file():
                res = json.loads(h["result"].read_text())
            else:
                res = {"error": f"exit code {rc}"}
        h["log"].close()
        text = (self.work / "logs" / f"{h['key']}.log").read_text(errors="replace")
        if "error" in res or h["key"] == "pytest":
            res["log_tail"] = text[-3000:]
        res["stage_seconds"] = time.monotonic() - h["began"]
        print(f"[{time.monotonic() - self.start:6.1f} s] done  {h['key']} ({res['stage_seconds']:.1f} s"
              f"{', ' + res['error'] if 'error' in res else ''})", flush=True)
        return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=450.0, help="global time guard (seconds)")
    ap.add_argument("--work", default=str(REPO / "artifacts" / "gpu-check"), help="checkpoints, bundles, logs")
    ap.add_argument("--bundles", nargs="*", default=list(BUNDLES), choices=list(BUNDLES))
    ap.add_argument("--no-pytest", action="store_true", help="skip the kernel GPU tests at the end")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--names", nargs="*", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--bench", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stage:
        return run_stage(args)
    work = Path(args.work)
    st = Stages(work, args.budget_s)
    report = {"machine": machine_facts(), "budget_s": args.budget_s, "stages": {}}
    stages = report["stages"]
    groups = {ck: [n for n in args.bundles if n.startswith(ck)] for ck in ("small", "q06")}
    h_kernels = st.launch("kernels", "kernels")
    h_build = {ck: st.launch(f"build-{ck}", "build", names=names) for ck, names in groups.items() if names}
    built, h_cpu = [], None
    for i, (ck, h) in enumerate(h_build.items()):  # small bundles' e2e runs while q06 still builds
        stages[f"build-{ck}"] = st.wait(h)
        if i == 0:
            stages["kernels"] = st.wait(h_kernels)  # the GPU to itself before any e2e stage
        done = [n for n in groups[ck] if "path" in stages[f"build-{ck}"].get(n, {})]
        built += done
        if ck == "q06" or len(h_build) == 1:
            h_cpu = st.launch("cpuref", "cpuref", names=built, threads=8) if built else None
        for name in done:
            if st.left() < 40:
                stages[f"e2e-{name}"] = {"error": "skipped: global time budget spent"}
                continue
            stages[f"e2e-{name}"] = st.wait(st.launch(f"e2e-{name}", "e2e", names=[name], bench=ck == "q06"))
    if h_cpu is not None:
        stages["cpuref"] = st.wait(h_cpu)
    if not args.no_pytest and st.left() > 90:
        stages["pytest"] = st.wait(st.launch("pytest", "pytest", cmd=[
            sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
            "tests/test_kernels_gpu.py", "tests/test_kernels_gpu_loop.py"]))
    report["elapsed_s"] = time.monotonic() - st.start
    report["summary"] = summarize(stages, work, built)
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "artifacts"
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    with open(out / "gpu_check_logs.txt", "w") as fh:
        for log in sorted((work / "logs").glob("*.log")):
            fh.write(f"===== {log.name}\n{log.read_text(errors='replace')[-20000:]}\n")
    print(f"wrote {out / 'gpu_check.json'}")
    print(table(report))


if __name__ == "__main__":
    main()
