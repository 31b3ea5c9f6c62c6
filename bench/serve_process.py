"""The server under test of the serving benches: `runtime serve` in a subprocess on 127.0.0.1 (or a no-op engine's
server, bench/noop_engine.py), and the process readings they report (RSS, CPU seconds by thread)."""
from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import threading
from pathlib import Path

import checkout  # (bench/checkout.py: this checkout as `toolcall`)

ROOT = Path(__file__).resolve().parents[1]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of a process's main thread and of all its other threads."""
    tick = os.sysconf("SC_CLK_TCK")
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended meanwhile
            continue
        t = (int(fields[11]) + int(fields[12])) / tick  # utime, stime: fields 14 and 15 of stat
        if int(task.name) == pid:
            main += t
        else:
            other += t
    return main, other


def client_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Server:
    """`runtime serve` in a subprocess on 127.0.0.1, port read from its ready line."""

    def __init__(self, bundle: str, noop: bool, request_timeout_s: float, threads: int | None = None,
                 lanes: int | None = None, root: Path = ROOT, device: str = "native", ready_s: float = 120.0):
        bundle = str(Path(bundle).resolve())  # the server runs in ``root``, not in the caller's directory
        if noop:  # the same server with bench/noop_engine.py's engine
            cmd = [sys.executable, str(Path(__file__).with_name("noop_engine.py")), bundle, "--port", "0",
                   "--request-timeout", str(request_timeout_s)]
        else:
            cmd = [sys.executable, "-c", "from toolcall.runtime.cli import main; main()", "serve", bundle, "--port",
                   "0", "--request-timeout", str(request_timeout_s)] + \
                ([] if threads is None else ["--threads", str(threads)]) + ([] if lanes is None else ["--lanes", str(lanes)]) \
                + ["--device", device]
        env = {**os.environ, "PYTHONPATH": str(checkout.import_folder(root))}  # ``root``'s code as toolcall
        self.proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        line = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(ready_s)
        if not line or not line[0].startswith("ready: "):
            self.proc.kill()
            raise SystemExit(f"server did not get ready: {line} {self.proc.stderr.read()[-2000:]}")
        self.port = int(re.search(r"127\.0\.0\.1:(\d+)", line[0]).group(1))
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9
