"""SIGTERM drains a `runtime serve` subprocess: admitted requests all answered, new ones refused, exit 0."""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["Book a flight to Paris", "What's the weather in Oslo tomorrow?", "Send an email to Bob",
         "Convert 20 euros to yen", "Remind me to call Alice on Friday", "Find a hotel in Rome"]


def post(port, body, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/discover", json.dumps(body).encode(), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    except ConnectionRefusedError:
        return "refused", None
    finally:
        conn.close()


def metric(port, name) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(float(v) for v in re.findall(rf"^toolcall:{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_sigterm_finishes_every_admitted_request_then_exits_0(tiny_bundle):
    from toolcall.runtime.engine import Engine

    solo = {t: r.token_ids for t, r in zip(TEXTS, Engine.load(tiny_bundle).run(TEXTS))}
    proc = subprocess.Popen([sys.executable, "-c", "from toolcall.runtime.cli import main; main()", "serve", str(tiny_bundle),
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        assert lines and lines[0].startswith("ready: "), (lines, proc.poll())
        port = int(re.search(r"127\.0\.0\.1:(\d+)", lines[0]).group(1))
        environ = Path(f"/proc/{proc.pid}/environ")
        if environ.exists():  # re-executed on the C allocator, same pid (see runtime/cli.py _use_system_allocator)
            assert f"PYTHONMALLOC={os.environ.get('PYTHONMALLOC') or 'malloc'}".encode() in environ.read_bytes().split(b"\0")
        n = 96
        texts = [TEXTS[i % len(TEXTS)] for i in range(n)]
        with ThreadPoolExecutor(n) as pool:
            replies = [pool.submit(post, port, {"request": t}) for t in texts]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # every request inside the server (answered, running or waiting)
                inside = sum(metric(port, m) for m in ("request_success_total", "num_requests_running",
                                                       "num_requests_waiting"))
                if inside >= n:
                    break
                time.sleep(0.005)
            in_flight = n - metric(port, "request_success_total")
            proc.send_signal(signal.SIGTERM)
            late = post(port, {"request": TEXTS[0]}, timeout=30)
            results = [f.result(60) for f in replies]
        assert proc.wait(60) == 0
        assert late[0] == "refused" or (late[0] == 503 and late[1]["error"]["code"] == "draining"), late
        for text, (status, body) in zip(texts, results):
            assert status == 200 and body["token_ids"] == solo[text], (status, body)
        print(f"{in_flight:.0f} of {n} requests were in flight at SIGTERM")
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_bundle_that_fails_to_load_ends_serve_with_its_refusal_code(tmp_path):
    from toolcall.common.errors import EXIT_CODES

    out = subprocess.run([sys.executable, "-c", "from toolcall.runtime.cli import main; main()", "serve", str(tmp_path / "none"),
                          "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == EXIT_CODES["missing_contract"], out.stderr
    assert "[missing_contract]" in out.stderr and "Traceback" not in out.stderr and not out.stdout
