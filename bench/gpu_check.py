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

The rehearsal, on a machine without a GPU: `python3 bench/gpu_check.py --device sim` runs every stage that checks
answers with the same code on the simulated device (runtime/cuda/devices.py; the kernels as PTX on the CPU
executor): the kernel cases the executor runs in CI and the WHILE loops, the small and tool bundles (the 0.6B shape's 28 layers would take hours
there), their end to end against the CPU reference (tool-fp8 again with the mma family), the bit gates and a
burst of 64 clients through `runtime serve --device sim`. The timed stages (bench, kernel-times, engine, pytest)
are skipped and no device record is written: bench/device/ holds measurements from cards only. Its stage limits
and budget are the simulated device's (SIM_TIMEOUTS, --budget-s 10800): it takes about an hour and a half on two
cores (bench/RESULTS.md).
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
from gpu_check_stages import BUNDLES  # noqa: E402

# seconds per stage process, each also capped by what is left of the budget
TIMEOUTS = {"build": 330, "kernels": 200, "kernels-while": 60, "cpuref": 300, "e2e": 150, "bench": 120,
            "kernel-times": 120, "gates": 120, "serving": 240, "engine": 90, "pytest": 180}
# on the simulated device (--device sim) a launch takes milliseconds to a second of CPU: the answer stages' limits
SIM_TIMEOUTS = {**TIMEOUTS, "kernels": 1200, "kernels-while": 300, "e2e": 1500, "gates": 7200, "serving": 3600}
SIM_BUDGET_S = 10800.0
# stages that time a card (or need one): skipped on the simulated device, with this reason in the report
TIMED = ("bench", "kernel-times", "engine", "pytest")
SIM_SKIPPED = "skipped: timing, measured on a card only (--device sim checks answers)"
SIM_CLIENTS, SIM_DISTINCT = 64, 16  # the simulated serving burst: clients, distinct bodies (each also run alone)
# stages that are other programs: no "complete" in their results
EXTERNAL = ("pytest", "kernel-times", "gates", "serving", "engine")
SERVING_BUNDLE = "tool-fp8"  # the gates', the burst's and the engine's bundle: the shipped tool model, real answers
# bundles whose e2e and bench stages run again with the tensor-core linear kernels (runtime load --gpu-kernels
# mma), as "<bundle>+mma": the Qwen3-0.6B shape, prompts long enough for the wide tiling (T >= 64); the nvfp4
# kernels of the family are judged by the kernels stage's table (a second bundle would cost the budget a minute)
MMA_VARIANTS = ("q06-fp8",)
SIM_MMA_VARIANTS = ("tool-fp8",)  # on the simulated device (no q06): its 256-token prompt takes 64-row chunks
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
                      device=args.device)
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
        self.timeouts = SIM_TIMEOUTS if device == "sim" else TIMEOUTS
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
    ap.add_argument("--budget-s", type=float, default=None,
                    help=f"global time guard (seconds) [default: 450; {SIM_BUDGET_S:.0f} with --device sim]")
    ap.add_argument("--work", default=None, help="checkpoints, bundles, logs [default: artifacts/gpu-check, "
                                                 "artifacts/gpu-check-sim with --device sim]")
    ap.add_argument("--bundles", nargs="*", default=None, choices=list(BUNDLES),
                    help="[default: all; with --device sim those without the 0.6B shape]")
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
    sim = args.device == "sim"
    if args.budget_s is None:
        args.budget_s = SIM_BUDGET_S if sim else 450.0
    args.work = args.work or str(REPO / "artifacts" / ("gpu-check-sim" if sim else "gpu-check"))
    if args.bundles is None:
        args.bundles = [n for n in BUNDLES if not (sim and n.startswith("q06"))]
    only = set(args.only.split(",")) if args.only else None
    want = lambda kind: only is None or kind in only  # noqa: E731
    work = Path(args.work)
    st = Stages(work, args.budget_s, args.cases, args.while_timeout_s, args.device)
    report = {"machine": machine_facts(), "device": args.device, "budget_s": args.budget_s, "stages": {}}
    stages, built = report["stages"], []
    record_dir = None if sim else Path(args.device_record)  # a simulation measures no card
    if sim:
        for kind in TIMED:
            if want(kind):
                stages[kind] = {"skipped": SIM_SKIPPED}
        want = lambda kind: (only is None or kind in only) and kind not in TIMED  # noqa: E731

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
    variants = [f"{n}+mma" for n in (SIM_MMA_VARIANTS if sim else MMA_VARIANTS) if n in built]
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
    elif want("serving") and SERVING_BUNDLE in built and st.left() > 120:  # runtime serve, 2,048 clients (sim: 64)
        burst = ["--clients", str(SIM_CLIENTS), "--distinct", str(SIM_DISTINCT), "--timeout", "3000"] if sim \
            else ["--clients", "2048"]
        done("serving", st.launch("serving", "serving", cmd=[
            sys.executable, str(REPO / "bench" / "serve_burst.py"), str(serving), "--device", args.device, *burst,
            "--json", str(work / "logs" / "serving.json")]))
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
