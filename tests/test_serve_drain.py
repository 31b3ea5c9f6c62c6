"""SIGTERM drains a `runtime serve` subprocess: admitted requests all answered, new ones refused with 503, no
connection reset (a burst arriving at the instant of SIGTERM included), exit 0. The tests wait on events
(the server's ready line, its metrics, the clients' own progress), never on sleeps."""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
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


@contextmanager
def running_server(bundle, *args):
    """(process, port) of `runtime serve BUNDLE --port 0 ARGS` once it printed its ready line; killed on the
    way out if still running."""
    proc = subprocess.Popen([sys.executable, "-c", "from toolcall.runtime.cli import main; main()", "serve",
                             str(bundle), "--port", "0", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(120)
    try:
        assert lines and lines[0].startswith("ready: "), (lines, proc.poll())
        yield proc, int(re.search(r"127\.0\.0\.1:(\d+)", lines[0]).group(1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_sigterm_finishes_every_admitted_request_then_exits_0(tiny_bundle):
    from toolcall.runtime.engine import Engine

    solo = {t: r.token_ids for t, r in zip(TEXTS, Engine.load(tiny_bundle).run(TEXTS))}
    with running_server(tiny_bundle) as (proc, port):
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
        assert late[0] == 503 and late[1]["error"]["code"] == "draining", late  # the listener is still open
        for text, (status, body) in zip(texts, results):
            assert status == 200 and body["token_ids"] == solo[text], (status, body)
        print(f"{in_flight:.0f} of {n} requests were in flight at SIGTERM")
        assert "Traceback" not in proc.stderr.read()


def test_a_bundle_that_fails_to_load_ends_serve_with_its_refusal_code(tmp_path):
    from toolcall.common.errors import EXIT_CODES

    out = subprocess.run([sys.executable, "-c", "from toolcall.runtime.cli import main; main()", "serve", str(tmp_path / "none"),
                          "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == EXIT_CODES["missing_contract"], out.stderr
    assert "[missing_contract]" in out.stderr and "Traceback" not in out.stderr and not out.stdout


def exchange(port: int, body: bytes, connected: threading.Barrier) -> str:
    """One client of the burst: connect, wait for the others to have connected, send, read the answer's status
    line; what came back ("200", "503 Retry-After", ...) or the connection error's name."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    except OSError as e:
        return type(e).__name__
    try:
        connected.wait(120)
        sock.sendall(b"POST /v1/discover HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = sock.recv(65536)
            if not chunk:
                return f"closed after {len(raw)} bytes"
            raw += chunk
        head = raw.split(b"\r\n\r\n")[0].decode().lower()
        status = head.split()[1]
        return status + (" Retry-After" if status == "503" and "\r\nretry-after:" in head else "")
    except OSError as e:
        return type(e).__name__
    finally:
        sock.close()


def test_a_burst_at_the_instant_of_sigterm_gets_an_http_answer_each(tiny_bundle):
    """300 connections open (many still in the accept queue), SIGTERM, then all send: each is answered 200 or
    503 with Retry-After, none reset or refused, and the server exits 0 once they are done and the grace
    (3 s here, for a loaded machine) has passed."""
    n = 300
    with running_server(tiny_bundle, "--drain-grace", "3") as (proc, port):
        connected = threading.Barrier(n + 1)
        body = json.dumps({"request": TEXTS[0]}).encode()
        with ThreadPoolExecutor(n) as pool:
            replies = [pool.submit(exchange, port, body, connected) for _ in range(n)]
            connected.wait(120)  # every client has its connection (accepted or queued) but sent nothing yet
            proc.send_signal(signal.SIGTERM)
            results = [f.result(180) for f in replies]
        assert proc.wait(120) == 0
        outcomes = {r: results.count(r) for r in set(results)}
        assert set(outcomes) <= {"200", "503 Retry-After"}, outcomes
        print(f"burst at SIGTERM: {outcomes}")
        assert "Traceback" not in proc.stderr.read()
