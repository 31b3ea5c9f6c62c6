"""bench/gpu_check.py against a stand-in driver (tests/fake_libcuda.c, first on the loader path of
the check's processes): the real cuda-bindings and the real binding structs, kernels that do not
run, and injected faults. Whatever breaks, the check must come back within its budget with every
record gathered before the fault, say what broke, and rewrite its report.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import fake_cuda
import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(fake_cuda.unavailable() is not None, reason=f"{fake_cuda.unavailable()}")


@pytest.fixture(scope="module")
def libdir(tmp_path_factory):
    return fake_cuda.build(tmp_path_factory.mktemp("fake-libcuda"))


def gpu_check(tmp: Path, libdir: Path, budget_s: float, *args, **faults) -> tuple[dict, str, float]:
    """Runs the check on the stand-in; (the JSON report, the printed output, wall seconds)."""
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    env = fake_cuda.env(libdir, log=tmp / "calls.log", **faults)
    env["OUT"] = str(out)
    t = time.monotonic()
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--work", str(tmp / "work"),
                        "--budget-s", str(budget_s), "--device-record", str(tmp / "records"), *args], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=budget_s + 60)
    wall = time.monotonic() - t
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((out / "gpu_check.json").read_text()), r.stdout, wall


def test_the_stand_in_drives_the_real_bindings(libdir, tmp_path):
    """Device facts, memory, a kernel launch with packed arguments, and a WHILE graph built with the
    real CUgraphNodeParams, all through cuda-bindings; the call log names each call."""
    code = ("import numpy as np\n"
            "from toolcall.kernels.launch import Gpu\n"
            "from toolcall.kernels.declarations import Launch\n"
            "from toolcall.kernels.runner import KernelRunner, Out, run_while_graph\n"
            "g = Gpu(); print(g.name, g.arch)\n"
            "r = KernelRunner(g); x = np.arange(16, dtype=np.float32).reshape(2, 8)\n"
            "a = g.upload(x); assert (g.download(a, x.shape, x.dtype) == x).all()\n"
            "r.run('swiglu', gate=x, up=x, in_stride=8, y=Out(np.zeros_like(x)), y_stride=8, T=2, n=8)\n"
            "args = dict(gate=a, up=a, in_stride=8, y=a, y_stride=8, T=2, n=8)\n"
            "run_while_graph(r, lambda h: [Launch('swiglu', args)])\n"
            "from cuda.bindings import driver as drv\n"
            "from toolcall.kernels.graph_nodes import add_kernel_node\n"
            "from toolcall.kernels.launch import check\n"
            "k = r.kernel('swiglu'); pk, hold = k.pack(args)\n"
            "gr = check(drv.cuGraphCreate(0), 'cuGraphCreate')\n"
            "n1 = add_kernel_node(drv, gr, [], k.function, (1, 2, 1), (256, 1, 1), pk.ctypes.data, 'swiglu', True)\n"
            "add_kernel_node(drv, gr, [n1], k.function, (1, 2, 1), (256, 1, 1), pk.ctypes.data, 'swiglu', True)\n"
            "check(drv.cuGraphInstantiate(gr, 0), 'cuGraphInstantiate')\n"
            "g.close(); print('closed')\n")
    env = fake_cuda.env(libdir, log=tmp_path / "calls.log")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["NVIDIA", "H200", "sm_90", "closed"]
    log = (tmp_path / "calls.log").read_text()
    for line in ("cuLaunchKernel swiglu 1x2x1 256", "cuGraphConditionalHandleCreate default 1 flags 1",
                 "cuGraphAddNode WHILE deps 0", "cuGraphAddKernelNode swiglu 1x2x1 deps 0", "cuGraphLaunch (WHILE)",
                 "cuGraphAddDependencies 1 -> 2 programmatic"):
        assert line in log, line


def test_an_illegal_address_keeps_the_records_before_it(libdir, tmp_path):
    """The 6th launch faults (sticky, as on hardware): the records before it are kept, the later
    jobs and gpu.close() report the error, and the stage still completes and is reported."""
    report, printed, wall = gpu_check(tmp_path, libdir, 120, "--only", "kernels", "--cases",
                                      "rows,fp8_e4m3-T1,loop-host", fail_launch=6)
    k = report["stages"]["kernels"]
    assert k.get("complete") and "error" not in k and wall < 120
    # fp8_e4m3-T1 (1 launch + its batch-of-one launch) and rows (3 launches + 1 + 1) run before the fault
    assert {r["case"] for r in k["records"]} >= {"fp8_e4m3-T1-in1024-out48", "rows"}
    assert len(k["records"]) == 6
    assert all("ILLEGAL_ADDRESS" in e for e in k["errors"].values()) and set(k["errors"]) >= {"loop-host-wide"}
    assert "ILLEGAL_ADDRESS" in k["close_error"]
    assert "launch 6 faults" in (tmp_path / "calls.log").read_text()
    assert "kernel parity: 6 checks" in printed


@pytest.mark.parametrize("while_timeout_s", [2, 1000])
def test_a_while_loop_that_never_ends_costs_only_its_stage(libdir, tmp_path, while_timeout_s):
    """A WHILE graph that never completes: with a short wait the job reports graph_stuck and the
    stage stops itself (exit 3); with a wait longer than the stage the stage's own deadline ends
    the process. Either way the parent reads the partial result within the budget."""
    report, printed, wall = gpu_check(tmp_path, libdir, 45, "--only", "kernels-while", "--while-timeout-s",
                                      str(while_timeout_s), while_forever=True)
    k = report["stages"]["kernels-while"]
    assert k["partial"] and k["device"] == "NVIDIA H200" and k["cases"] == 2 and wall < 45
    if while_timeout_s == 2:
        assert k["error"] == "exit code 3 (stopped: the device is stuck)"
        assert "graph_stuck" in k["errors"]["loop-while-graph-prefix"] and "loop-while-graph-prefix" in k["stuck"]
    else:
        assert k["error"] == "exit code 1" and "Timeout" in k["log_tail"] and "run_while_graph" in k["log_tail"]
    assert "cuGraphLaunch (WHILE)" in (tmp_path / "calls.log").read_text()
    assert "kernels-while" in printed


def test_kernel_times_stage_reports_every_kernel_both_ways(libdir, tmp_path):
    """bench/gpu_kernel_times.py as a stage: its rows reach the JSON and the table (stand-in timings)."""
    report, printed, wall = gpu_check(tmp_path, libdir, 120, "--only", "kernel-times")
    stage = report["stages"]["kernel-times"]
    assert "error" not in stage and wall < 120
    names = [r["name"] for r in stage["rows"]]
    assert names[0] == "embed_gather (floor)" and "fp8_e4m3 layer (28 layers)" in names
    assert all(r["us"] > 0 and r["us_pdl"] > 0 for r in stage["rows"])
    assert "attention_decode pos 511" in printed and "us pdl" in printed


@pytest.mark.slow
def test_e2e_runs_the_graph_free_paths_first_and_reports_after_every_stage(libdir, tmp_path):
    """An h200 bundle on the stand-in: the graph-free paths run and are saved before Engine.load
    (whose canary fails here: kernels do not run); speed is never judged on wrong tokens."""
    sys.path.insert(0, str(REPO / "bench"))
    import gpu_check_stages as stages

    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.bundle.contract import BuildOptions
    stages.synth_small(tmp_path / "ckpt")
    options = BuildOptions(precision="fp8_e4m3", target="h200", max_sequences=4, max_input_tokens=256,
                           max_output_tokens=None, page_size=32, max_tokens_per_step=64, prefill_chunk=64,
                           memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
    compile_bundle(tmp_path / "ckpt", stages.CATALOG, options, tmp_path / "work" / "small-fp8")
    report, printed, wall = gpu_check(tmp_path, libdir, 200, "--only", "e2e,cpuref", "--bundles", "small-fp8")
    e = report["stages"]["e2e-small-fp8"]
    keys = list(e)
    assert keys.index("generator") < keys.index("host_loop") < keys.index("hidden_saved") < keys.index("load")
    assert len(e["generator"]["tokens"]) == len(report["stages"]["cpuref"]["small-fp8"]["tokens"]) == 5
    assert e["load"]["error"].startswith("Refusal: [canary_failed]") and "graph" not in e
    row = report["summary"]["bundles"]["small-fp8"]
    assert row["tokens_match_cpu"] is False and row["vs_cpu"]["graph"]["missing"]
    log = (tmp_path / "calls.log").read_text().splitlines()
    assert "small-fp8" in printed and wall < 200
    # again with a fault 5 launches before the graph-free part ends: what ran before it is kept
    start = log.index("cuModuleLoadData")  # the e2e stage's model (the parent's machine facts come first)
    first_close = log.index("cuDevicePrimaryCtxRelease", start)
    n = sum(ln.startswith("cuLaunchKernel ") for ln in log[:first_close]) - 5
    assert n > 100
    (tmp_path / "calls.log").unlink()
    report, _, wall = gpu_check(tmp_path, libdir, 120, "--only", "e2e", "--bundles", "small-fp8", fail_launch=n)
    e = report["stages"]["e2e-small-fp8"]
    assert e["complete"] and wall < 120
    assert len(e["generator"]["tokens"]) == len(e["generator_check_head"]["tokens"]) == 5
    faulted = [k for k, v in e.items() if isinstance(v, dict) and "ILLEGAL_ADDRESS" in v.get("error", "")]
    assert faulted and "ILLEGAL_ADDRESS" in e["graph_free_close_error"] and "load" not in e


def _bench_stages(gpu_tokens):
    cpu = {"tokens": [[1, 2, 3], [4, 5]], "margins": [0.5, 0.5]}
    e2e = {p: {"tokens": gpu_tokens} if p.startswith("gen") else gpu_tokens
           for p in ("generator", "generator_check_head", "host_loop", "graph")}
    bench = {"step_graph_ms": 0.2, "tokens_per_s": 5000.0, "in_loop_ms": 0.2, "host_loop_ms": 1.0,
             "answer_graph_wall_ms": 2.0, "answer_host_wall_ms": 9.0}
    return {"cpuref": {"q06-fp8": cpu, "q06-nvfp4": cpu}, "e2e-q06-fp8": {"load": {"seconds": 1}, **e2e},
            "e2e-q06-nvfp4": {"load": {"seconds": 1}, **e2e}, "bench-q06-fp8": {"bench": bench},
            "bench-q06-nvfp4": {"bench": dict(bench, step_graph_ms=0.21)}}


@pytest.mark.parametrize("gpu_tokens,verdict", [([[1, 2, 3], [4, 5]], True), ([[1, 2, 3], [4, 6]], None)])
def test_speed_targets_are_judged_only_on_the_cpu_tokens(tmp_path, gpu_tokens, verdict):
    """5,000 tok/s on wrong tokens is not a PASS: the targets say NOT JUDGED and why."""
    sys.path.insert(0, str(REPO / "bench"))
    from gpu_check_report import summarize, table
    s = summarize(_bench_stages(gpu_tokens), tmp_path, ["q06-fp8", "q06-nvfp4"])
    for key in ("fp8_tokens_per_s", "graph_faster_than_host", "nvfp4_vs_fp8"):
        assert s["targets"][key]["pass"] is verdict and s["targets"][key]["judged"] is (verdict is not None)
    lines = table({"machine": {}, "budget_s": 1, "stages": {}, "summary": s}).splitlines()
    target_lines = [ln for ln in lines if ln.startswith("target ")]
    assert len(target_lines) == 3
    assert all(("PASS" if verdict else "NOT JUDGED") in ln for ln in target_lines)


def test_the_wheel_pre_check_names_what_is_missing(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "bench"))
    import importlib.util

    import gpu_check_record as record
    (tmp_path / "jsonschema-4.25.1-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "rpds_py-0.27.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl").write_bytes(b"")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # as on a bare device machine
    assert record.missing_wheels(tmp_path) == ["jsonschema_specifications-*-py3-none-any.whl",
                                               "referencing-*-py3-none-any.whl", "rpds_py-*-cp312-*manylinux*.whl"]
