"""Device faults on the simulated device (kernels/sim/faults.py), injected through TOOLCALL_SIM_FAULTS as
`runtime ... --device sim` reads it: a load refused an allocation frees everything it took; a fault while serving
marks the replica failed (every in-flight request answered 503 device_failed, /health 503, later requests 503) and
`runtime serve` exits with the device error's code. A synthetic two-layer model keeps each load short."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import compile_test_bundle
from test_serve import LiveServer, assert_error

from toolcall.common.errors import EXIT_CODES, CudaError
from toolcall.kernels.sim.faults import ENV, Fault, faults_from_env
from toolcall.runtime.cuda import devices
from toolcall.runtime.engine import Engine
from toolcall.runtime.serve.state import ServeConfig, ServeState

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["Book a flight to Paris", "Send an email to Bob", "Convert 20 euros to yen"]


@pytest.fixture(scope="module")
def gpu_bundle(tmp_path_factory, tiny_checkpoint):
    return compile_test_bundle(tiny_checkpoint, tmp_path_factory.mktemp("bundles") / "tiny-fp8-h200", target="h200")


@pytest.fixture
def sim_devices(monkeypatch):
    """The SimGpus Engine.load makes from now on (the sim device's factory wrapped)."""
    made, sim = [], devices.DEVICES["sim"]

    def make(contract):
        gpu = sim.gpu(contract)
        made.append(gpu)
        return gpu
    monkeypatch.setitem(devices.DEVICES, "sim", replace(sim, gpu=make))
    return made


@pytest.fixture(scope="module")
def load_calls(gpu_bundle):
    """The device calls a load of the bundle makes, by operation (deterministic: same bundle, same calls)."""
    engine = Engine.load(gpu_bundle, device="sim")
    calls = dict(engine.model.gpu.faults.calls)
    engine.close()
    return calls


def test_faults_parse_from_the_environment_and_refuse_a_malformed_one():
    assert faults_from_env({ENV: "illegal_address:launch:40, out_of_memory:alloc:0"}) == (
        Fault("illegal_address", "launch", 40), Fault("out_of_memory", "alloc", 0))
    assert faults_from_env({}) == ()
    for bad in ("illegal_address:launch", "launch_failed:copy:1", "out_of_memory:launch:1", "nope:launch:1",
                "illegal_address:launch:-1"):
        with pytest.raises(Exception) as err:
            faults_from_env({ENV: bad})
        assert getattr(err.value, "code", None) == "usage", bad


def test_a_load_refused_each_allocation_in_turn_leaves_nothing_allocated(gpu_bundle, load_calls, sim_devices,
                                                                          monkeypatch):
    assert load_calls["alloc"] >= 3
    for k in range(load_calls["alloc"]):
        monkeypatch.setenv(ENV, f"out_of_memory:alloc:{k}")
        with pytest.raises(CudaError, match="CUDA_ERROR_OUT_OF_MEMORY") as err:
            Engine.load(gpu_bundle, device="sim")
        assert err.value.details["call"] == "cuMemAlloc"
        assert sim_devices[-1].allocated_bytes == 0, f"a load refused its allocation {k} left memory behind"


def post(port, text, timeout=120):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/discover", json.dumps({"request": text}).encode(),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize("fault", ["illegal_address:launch", "launch_failed:launch", "illegal_address:copy"])
def test_a_device_fault_while_serving_fails_the_replica(gpu_bundle, load_calls, fault, monkeypatch):
    """The fault lands in the first serving step (a few calls past the load's): every request in flight is answered
    503 device_failed, /health turns 503 for good, later requests are refused the same way."""
    kind, operation = fault.split(":")
    monkeypatch.setenv(ENV, f"{kind}:{operation}:{load_calls[operation] + 2}")
    engine = Engine.load(gpu_bundle, device="sim")
    state = ServeState(lambda: engine, ServeConfig(lanes=1))
    with LiveServer(state) as srv:
        status, _, body = srv.call("GET", "/health")
        assert (status, body) == (200, {"status": "ready", "device": "sim"})
        assert srv.call("GET", "/v1/models")[2]["data"][0]["device"] == "sim"
        assert 'device="sim"' in next(line for line in srv.call("GET", "/metrics")[2].splitlines()
                                      if line.startswith("toolcall:engine_info"))
        with ThreadPoolExecutor(len(TEXTS)) as pool:
            answers = list(pool.map(lambda t: post(srv.port, t), TEXTS))
        for status, body in answers:
            assert_error(status, body, 503, "device_failed")
            assert body["error"]["details"]["error"] == {"illegal_address": "CUDA_ERROR_ILLEGAL_ADDRESS",
                                                          "launch_failed": "CUDA_ERROR_LAUNCH_FAILED"}[kind]
        assert state.phase == "failed" and state.failure.code == "cuda_error"
        status, headers, body = srv.call("GET", "/health")
        assert_error(status, body, 503, "device_failed")
        assert headers["Retry-After"] == "1"
        assert_error(*post(srv.port, TEXTS[0]), 503, "device_failed")
    assert state.engine_thread.in_flight == 0


def test_runtime_serve_exits_with_the_device_error_after_answering(gpu_bundle, load_calls):
    """The process: the request in flight answered 503 device_failed, then exit 50 (cuda_error) so the orchestrator
    restarts it; nothing hangs (every wait bounded)."""
    env = {**os.environ, ENV: f"illegal_address:launch:{load_calls['launch'] + 2}"}
    proc = subprocess.Popen([sys.executable, "-c", "from toolcall.runtime.cli import main; main()", "serve",
                             str(gpu_bundle), "--port", "0", "--device", "sim"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(240)
        assert lines and lines[0].startswith("ready:") and "simulated device" in lines[0], lines
        port = int(re.search(r"127\.0\.0\.1:(\d+)", lines[0]).group(1))
        assert_error(*post(port, TEXTS[0]), 503, "device_failed")
        assert proc.wait(60) == EXIT_CODES["cuda_error"]
        err = proc.stderr.read()
        assert "device: simulated H200" in err and "CUDA_ERROR_ILLEGAL_ADDRESS" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_the_device_is_chosen_explicitly_and_says_so(gpu_bundle, tiny_bundle):
    """--device sim checks a GPU bundle against the device it presents; without it a machine without a GPU refuses
    the bundle (no_gpu); a CPU bundle has nothing to simulate (usage); `builder verify --simulate` passes the canary
    on the simulated device and says so once on stderr."""
    from click.testing import CliRunner

    from toolcall.kernels.launch import probe_gpu
    from toolcall.runtime.cli import main as runtime_cli

    runner = CliRunner()
    ok = runner.invoke(runtime_cli, ["check", str(gpu_bundle), "--device", "sim", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["device"] == "sim", ok.output
    if not probe_gpu()[0]:
        native = runner.invoke(runtime_cli, ["check", str(gpu_bundle), "--json"])
        assert native.exit_code == EXIT_CODES["no_gpu"], native.output
    cpu = runner.invoke(runtime_cli, ["check", str(tiny_bundle), "--device", "sim", "--json"])
    assert cpu.exit_code == EXIT_CODES["usage"] and "runs GPU bundles" in cpu.stdout, cpu.output
    verified = subprocess.run([sys.executable, "-c", "from toolcall.builder.cli import main; main()", "verify",
                               str(gpu_bundle), "--simulate", "--json"], cwd=ROOT, capture_output=True, text=True,
                              timeout=600)
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["checks"][-1] == "simulate"
    assert verified.stderr.count("device: simulated H200") == 1, verified.stderr


@pytest.mark.parametrize("device, given, deadline", [("sim", [], 3600.0), ("native", [], 60.0),
                                                     ("sim", ["--request-timeout", "5"], 5.0)])
def test_a_served_requests_default_deadline_follows_the_device(gpu_bundle, monkeypatch, device, given, deadline):
    """`runtime serve --device sim` gives a request without timeout_s the simulated device's deadline (steps take
    seconds there: a burst of 64 would time out at 60 s); --request-timeout still decides where it is given."""
    pytest.importorskip("fastapi")
    from click.testing import CliRunner

    import toolcall.runtime.serve.server as server
    from toolcall.runtime.cli import main as runtime_cli

    seen = {}
    monkeypatch.setenv("PYTHONMALLOC", "pymalloc")  # set: `runtime serve` does not re-execute the process
    monkeypatch.setattr(server, "main", lambda path, host, port, config, **kw: seen.update(config=config, **kw))
    result = CliRunner().invoke(runtime_cli, ["serve", str(gpu_bundle), "--device", device, *given])
    assert result.exit_code == 0, result.output
    assert seen["device"] == device and seen["config"].request_timeout_s == deadline
