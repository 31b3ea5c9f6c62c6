"""The one GPU check: builds its bundles, checks kernel parity and token identity, times decode,
and keeps every record it gathered, whatever breaks.

Run on the GPU machine from the repository root (no `pip install -e` needed). jsonschema and its
three dependencies come as wheels in .whl/ (git-ignored), fetched on the development machine first:

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \\
        jsonschema jsonschema-specifications referencing rpds-py

and carried with this exact device call (one run; 540 s leaves room for a second in 15 minutes):

    run(carry=[".whl"], timeout_s=540, command="python3 -m pip install -q --no-index --no-deps --no-compile
        --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site &&
        PYTHONUNBUFFERED=1 GPU_CHECK_COMMIT=<git rev-parse --short HEAD> python3 bench/gpu_check.py")

Before any stage the script checks those four modules import (exit 52, device_check_setup,
naming the missing wheels, if not). Stages run in their own processes, each with a timeout
under one global budget (--budget-s, default 450 s); each writes its result file after every
job, so a stage that times out, crashes or exits non-zero still reports every record gathered
(marked "partial"). Order:
  kernels (GPU, graph-free cases, both linear families' table of T and batch neighbours, and
  host-stepped loops) beside build-small, build-tool and
  build-q06 (CPU);
  kernels-while (the WHILE-graph jobs alone, a short stage that exits hard after its timeout);
  cpuref (CPU reference tokens) beside the untimed e2e stages (graph-free paths first, then
  Engine.load with its canary and the decode graph; the q06 bundles again with the tensor-core linear
  kernels, as "<bundle>+mma"); then, with the CPU quiet, the timed bench stages of the q06 bundles (and
  their +mma runs); bench/gpu_kernel_times.py (every decode kernel's device time at
  Qwen3-0.6B's T = 1 shapes); on the tool-fp8 bundle bench/bit_gates.py (a row's bits alone and in
  twelve company), bench/engine_alone.py (the burst's 2,048 requests handed to the engine) and, where
  the serving wheels were carried, bench/serve_burst.py (`runtime serve` on 127.0.0.1, 2,048 clients,
  answers against the same requests alone, then a no-op engine's ceiling); the kernel GPU tests through
  pytest if time is left. The serving stage's wheels (the device image has none of them), fetched
  beside jsonschema's into .whl/ with the same pip download options:
      aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl idna fastapi
      fastapi-offline starlette pydantic pydantic-core annotated-types typing-inspection anyio sniffio
      uvicorn h11 httptools uvloop prometheus-client
Speed targets are judged only for bundles whose tokens equal the CPU reference on every path.

The rehearsal without a GPU, `python3 bench/gpu_check.py --device sim`: the stages that check answers, with the
same code, on the simulated device (runtime/cuda/devices.py; PTX on the CPU executor): the executor's CI kernel
cases, the WHILE loops, the small and tool bundles end to end, the bit gates, a burst of 64 through `runtime serve
--device sim`; no timed stage, no device record (bench/device/ holds cards' figures). bench/gpu_check_plans.py
holds each device's plan; bench/RESULTS.md the rehearsal's time.
The report (gpu_check.json, gpu_check_table.txt, gpu_check_logs.txt under $OUT, else
artifacts/) is rewritten after every stage, and so is the device record (bench/device_record.py:
bench/device/<card>.json, --device-record, and a copy in $OUT/device/ to bring back and commit); the
table prints last.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()

from gpu_check_record import Recorder, arm_deadline, missing_wheels, read_result  # noqa: E402
from gpu_check_report import machine_facts, summarize, table  # noqa: E402
from device_record import write_record  # noqa: E402
from gpu_check_plans import PLANS  # noqa: E402
from gpu_check_stages import BUNDLES  # noqa: E402

# stages that are other programs: no "complete" in their results
EXTERNAL = ("pytest", "kernel-times", "gates", "serving", "engine")
SERVING_BUNDLE = "tool-fp8"  # the gates', the burst's and the engine's bundle: the shipped tool model, real answers
SERVE_MODULES = ("aiohttp", "fastapi", "uvicorn", "prometheus_client")  # the serving stage's (carried as wheels)
RESERVE_S = 15  # kept for the summary and the JSON
SETUP_EXIT = 52  # common/errors.py EXIT_CODES["device_check_setup"]


def run_stage(args) -> None:
    """Child side: one stage, its records written to --result after every job."""
    arm_deadline(args.deadline_s)  # exits hard even when blocked in a driver call
    work, rec = Path(args.work), Recorder(args.result)
    if args.stage == "build":
        from gpu_check_stages import stage_build
        stage_build(work, args.names, rec)
    elif args.stage in ("kernels", "kernels-while"):
        from gpu_check_stages import stage_kernels
        stage_kernels(rec, graphs=args.stage == "kernels-while", cases=args.cases, while_timeout_s=args.while_timeout_s,
                      device=args.device, ci_only=PLANS[args.device].ci_kernels)
    elif args.stage == "cpuref":
        from gpu_check_stages import stage_cpuref
        stage_cpuref(work, args.names, rec)
    elif args.stage == "e2e":
        from gpu_check_e2e import stage_e2e
        stage_e2e(work, args.names[0], rec, device=args.device)
    else:
        from gpu_check_e2e import stage_bench
        stage_bench(work, args.names[0], rec)
    rec.put("complete", True)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: a device left busy by a stuck graph must not block the exit


class Stages:
    """Starts stage processes and waits for them within the global deadline."""

    def __init__(self, work: Path, budget_s: float, cases: str | None, while_timeout_s: float, device: str):
        self.work, self.deadline, self.start = work, time.monotonic() + budget_s, time.monotonic()
        self.cases, self.while_timeout_s, self.device = cases, while_timeout_s, device
        self.timeouts = PLANS[device].timeouts
        (work / "logs").mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - RESERVE_S - time.monotonic()

    def launch(self, key: str, stage: str, names=(), threads: int | None = None, cmd=None):
        log = open(self.work / "logs" / f"{key}.log", "w")
        result = self.work / "logs" / f"{key}.json"
        result.unlink(missing_ok=True)
        path = os.pathsep.join([str(checkout.import_folder(REPO)), os.environ.get("PYTHONPATH", "")])
        env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
        if threads:
            env.update({v: str(threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
        timeout = max(1.0, min(self.timeouts[stage], self.left()))
        if cmd is None:
            cmd = [sys.executable, str(Path(__file__)), "--stage", stage, "--work", str(self.work), "--result",
                   str(result), "--deadline-s", f"{max(1.0, timeout - 2):.0f}",
                   "--while-timeout-s", str(self.while_timeout_s), "--device", self.device,
                   *(["--names", *names] if names else []),
                   *(["--cases", self.cases] if self.cases else [])]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        print(f"[{time.monotonic() - self.start:6.1f} s] start {key}", flush=True)
        return dict(key=key, proc=proc, log=log, result=result, began=time.monotonic(), timeout=timeout)

    def wait(self, h) -> dict:
        limit = max(1.0, min(h["timeout"] - (time.monotonic() - h["began"]), self.left()))
        error = None
        try:
            rc = h["proc"].wait(timeout=limit)
        except subprocess.TimeoutExpired:
            h["proc"].kill()
            rc = h["proc"].wait()
            error = f"timeout: killed after {time.monotonic() - h['began']:.0f} s"
        res = read_result(h["result"]) or {}
        if error is None and rc != 0:
            error = f"exit code {rc}" + (" (stopped: the device is stuck)" if "stuck" in res else "")
        if error is None and not res.get("complete") and h["key"] not in EXTERNAL:
            error = "exit code 0 without a complete result"
        if error is not None:
            res["error"], res["partial"] = error, bool(res)
        h["log"].close()
        text = (self.work / "logs" / f"{h['key']}.log").read_text(errors="replace")
        if "error" in res or h["key"] == "pytest":
            res["log_tail"] = text[-3000:]
        res["stage_seconds"] = time.monotonic() - h["began"]
        print(f"[{time.monotonic() - self.start:6.1f} s] done  {h['key']} ({res['stage_seconds']:.1f} s"
              f"{', ' + res['error'] if 'error' in res else ''})", flush=True)
        return res


def write_report(report: dict, work: Path, built: list[str], start: float, record_dir: Path | None = None) -> str:
    """gpu_check.json, the table and the stage logs under $OUT (else artifacts/), rewritten whole; with ``record_dir``
    the device record merged into it (bench/device_record.py) and copied to $OUT/device/."""
    report["elapsed_s"] = time.monotonic() - start
    try:
        report["summary"] = summarize(report["stages"], work, built)
        text = table(report)
    except Exception as e:  # a summary bug must not lose the raw stages
        report["summary_error"] = f"{type(e).__name__}: {e}"
        text = f"summary failed: {report['summary_error']}"
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "artifacts"
    out.mkdir(parents=True, exist_ok=True)
    for name, body in (("gpu_check.json", json.dumps(report, indent=1, default=str)), ("gpu_check_table.txt", text)):
        tmp = out / (name + ".tmp")
        tmp.write_text(body)
        os.replace(tmp, out / name)
    with open(out / "gpu_check_logs.txt", "w") as fh:
        for log in sorted((work / "logs").glob("*.log")):
            fh.write(f"===== {log.name}\n{log.read_text(errors='replace')[-20000:]}\n")
    if record_dir is not None and "summary" in report:
        try:
            written = write_record(report, record_dir, out, time.strftime("%Y-%m-%d", time.gmtime()), REPO)
            report["device_record"] = str(written) if written else "nothing measured"
        except Exception as e:  # the record must not lose the report
            report["device_record"] = f"failed: {type(e).__name__}: {e}"
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    from toolcall.runtime.cuda.devices import DEVICES, NATIVE
    ap.add_argument("--device", choices=list(DEVICES), default=NATIVE,
                    help="sim: the rehearsal on the simulated device (answers only; no device record); "
                         "native: this machine's GPU")
    ap.add_argument("--budget-s", type=float, default=None, help="global time guard (seconds) [default: " + "; ".join(
        f"{plan.budget_s:.0f} on {device}" for device, plan in PLANS.items()) + "]")
    ap.add_argument("--work", default=None, help="checkpoints, bundles, logs [default: artifacts/FOLDER, " + "; ".join(
        f"{plan.work} on {device}" for device, plan in PLANS.items()) + "]")
    ap.add_argument("--bundles", nargs="*", default=None, choices=list(BUNDLES),
                    help="[default: all; on sim those without the 0.6B shape]")
    ap.add_argument("--only", help="comma-separated stage kinds to run (build, kernels, kernels-while, cpuref, e2e, "
                                   "bench, kernel-times, gates, engine, serving, pytest); default all")
    ap.add_argument("--cases", help="only the kernel cases whose id contains one of these comma-separated parts")
    ap.add_argument("--while-timeout-s", type=float, default=20.0, help="wait for one WHILE graph to end")
    ap.add_argument("--no-pytest", action="store_true", help="skip the kernel GPU tests at the end")
    ap.add_argument("--device-record", default=str(REPO / "bench" / "device"),
                    help="folder of the device records (<card>.json, merged after every stage; GPU-RECORD.md)")
    for hidden in ("--stage", "--result", "--deadline-s"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--names", nargs="*", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stage:
        args.deadline_s = float(args.deadline_s or 600)
        return run_stage(args)
    missing = missing_wheels(REPO / ".whl")
    if missing:
        print(f"device_check_setup: jsonschema and its dependencies do not import and .whl/ lacks {missing}; fetch "
              "them as this script's docstring says and pass carry=['.whl'] to the device run", flush=True)
        sys.exit(SETUP_EXIT)
    plan = PLANS[args.device]
    args.budget_s = plan.budget_s if args.budget_s is None else args.budget_s
    work = Path(args.work or REPO / "artifacts" / plan.work)
    args.bundles = list(plan.bundles) if args.bundles is None else args.bundles
    only = set(args.only.split(",")) if args.only else None
    st = Stages(work, args.budget_s, args.cases, args.while_timeout_s, args.device)
    report = {"machine": machine_facts(), "device": args.device, "budget_s": args.budget_s, "stages": {}}
    stages, built = report["stages"], []
    stages.update({kind: {"skipped": why} for kind, why in plan.skipped.items() if only is None or kind in only})
    want = lambda kind: (only is None or kind in only) and kind not in plan.skipped  # noqa: E731
    record_dir = Path(args.device_record) if plan.records else None

    def done(key: str, h) -> None:
        stages[key] = st.wait(h)
        write_report(report, work, built, st.start, record_dir)

    groups = {ck: [n for n in args.bundles if n.startswith(ck)] for ck in ("small", "tool", "q06")}
    h_kernels = st.launch("kernels", "kernels") if want("kernels") else None
    h_build = {ck: st.launch(f"build-{ck}", "build", names=names)
               for ck, names in groups.items() if names and want("build")}
    if h_kernels is not None:
        done("kernels", h_kernels)
    if want("kernels-while"):  # the GPU to itself; a loop that never ends costs this stage only
        done("kernels-while", st.launch("kernels-while", "kernels-while"))
    for ck, h in h_build.items():
        done(f"build-{ck}", h)
    for ck in groups:
        res = stages.get(f"build-{ck}") or {}
        built += [n for n in groups[ck] if "path" in (res.get(n) or {})]
    if not h_build:  # bundles of an earlier run in --work
        built += [n for n in args.bundles if (work / n / "contract.json").is_file()]
    write_report(report, work, built, st.start, record_dir)
    h_cpu = st.launch("cpuref", "cpuref", names=built, threads=8) if built and want("cpuref") else None
    variants = [f"{n}+mma" for n in plan.mma_variants if n in built]
    for name in built + variants if want("e2e") else []:  # untimed: may run beside the CPU reference
        if st.left() < 40:
            stages[f"e2e-{name}"] = {"error": "skipped: global time budget spent"}
            continue
        done(f"e2e-{name}", st.launch(f"e2e-{name}", "e2e", names=[name]))
    if h_cpu is not None:
        done("cpuref", h_cpu)  # before any timing: nothing else loads the CPU while the bench runs
    for name in [n for n in built + variants if n.startswith("q06")] if want("bench") else []:
        if st.left() < 40:
            stages[f"bench-{name}"] = {"error": "skipped: global time budget spent"}
            continue
        done(f"bench-{name}", st.launch(f"bench-{name}", "bench", names=[name]))
    if want("kernel-times") and st.left() > 60:  # every decode kernel's device time, full and programmatic edges
        done("kernel-times", st.launch("kernel-times", "kernel-times", cmd=[
            sys.executable, str(REPO / "bench" / "gpu_kernel_times.py"), "--json",
            str(work / "logs" / "kernel-times.json")]))
    serving = work / SERVING_BUNDLE
    if want("gates") and SERVING_BUNDLE in built and st.left() > 60:  # a row's bits alone and in twelve company
        done("gates", st.launch("gates", "gates", cmd=[
            sys.executable, str(REPO / "bench" / "bit_gates.py"), str(serving), "--device", args.device, "--json",
            str(work / "logs" / "gates.json")]))
    if want("engine") and SERVING_BUNDLE in built and st.left() > 60:  # the engine alone: the burst's requests
        done("engine", st.launch("engine", "engine", cmd=[
            sys.executable, str(REPO / "bench" / "engine_alone.py"), str(serving), "--repeats", "3", "--json",
            str(work / "logs" / "engine.json")]))
    missing_serve = [m for m in SERVE_MODULES if importlib.util.find_spec(m) is None]
    if want("serving") and SERVING_BUNDLE in built and missing_serve:
        stages["serving"] = {"error": f"skipped: {', '.join(missing_serve)} not importable (carry the serving "
                                      "wheels: this script's docstring)"}
    elif want("serving") and SERVING_BUNDLE in built and st.left() > 120:  # runtime serve, the plan's burst
        done("serving", st.launch("serving", "serving", cmd=[
            sys.executable, str(REPO / "bench" / "serve_burst.py"), str(serving), "--device", args.device,
            *plan.burst, "--json", str(work / "logs" / "serving.json")]))
    if want("pytest") and not args.no_pytest and st.left() > 90:
        done("pytest", st.launch("pytest", "pytest", cmd=[
            sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
            "tests/test_kernels_gpu.py", "tests/test_kernels_gpu_loop.py", "tests/test_kernels_gpu_linear.py",
            "tests/test_kernels_gpu_attention.py",
            "tests/test_sampling.py"]))
    text = write_report(report, work, built, st.start, record_dir)
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "artifacts"
    print(f"wrote {out / 'gpu_check.json'}")
    print(text)


if __name__ == "__main__":
    main()
