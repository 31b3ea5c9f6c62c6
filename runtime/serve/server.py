"""The uvicorn server: open-files limit raised, a deep listen backlog, and a SIGTERM drain that resets nothing.

SIGTERM: stop admitting (/health and new requests answer 503 with Retry-After) while the listener stays
open and keeps accepting, so every connection, in flight or arriving, gets an HTTP answer; once every
admitted request is answered, nothing has arrived for the grace (``ServeConfig.drain_grace_s``, at
least 1 s) and the kernel's accept queue is empty, the listener closes and the process exits 0. A second
SIGTERM, or SIGINT, stops at once the uvicorn way. A bundle that fails to load ends the process with its
refusal's exit code.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import logging
import resource
import signal
import socket
import struct
import sys
import time

import prometheus_client
import uvicorn

from toolcall.runtime.backends import DEVICES, LoadOptions
from toolcall.runtime.bundle.machine import available_cpus, serving_threads
from toolcall.runtime.serve.app import create_app
from toolcall.runtime.serve.state import ServeConfig, ServeState

BACKLOG = 4096


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc()  # glibc: malloc_trim; None elsewhere (musl, macOS)


def raise_open_files() -> tuple[int, int]:
    """Raises the soft RLIMIT_NOFILE to the hard limit; returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def accept_queue(sock: socket.socket) -> int | None:
    """Connections waiting in a listening socket's accept queue (Linux: tcp_info's tcpi_unacked of a listener,
    the u32 after 8 bytes of flags and four u32); None where the kernel does not say."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 32)
    except (AttributeError, OSError):
        return None
    return struct.unpack_from("I", info, 24)[0] if len(info) >= 28 else None


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM drains the engine, answering arrivals, before the graceful shutdown."""

    def __init__(self, config: uvicorn.Config, state: ServeState, announce=None):
        super().__init__(config)
        self.state, self.announce, self._announced = state, announce, False
        self._trimmed_at = 0
        self._activity = (0, 0)  # (requests seen, connections open) at the last change
        self._quiet_since = 0.0  # monotonic time of the last arrival, SIGTERM or change of connections

    def handle_exit(self, sig, frame) -> None:
        if sig == signal.SIGTERM and self.state.phase in ("ready", "loading") and not self.should_exit:
            if self.state.phase == "loading":
                self.should_exit = True  # nothing admitted yet: leave now, still exit 0
                return
            self._quiet_since = time.monotonic()
            self.state.begin_drain()
            return
        super().handle_exit(sig, frame)

    def _drain_done(self) -> bool:
        """Every admitted request answered, nothing arrived for the grace, no connection waiting to be accepted."""
        now = time.monotonic()
        activity = (self.server_state.total_requests, len(self.server_state.connections))
        if activity != self._activity:
            self._activity, self._quiet_since = activity, now
        if not self.state.drained or now - self._quiet_since < self.state.config.drain_grace_s:
            return False
        waiting = [accept_queue(s) for server in self.servers for s in server.sockets]
        return not any(waiting)

    def _trim_when_idle(self) -> None:
        """Once idle after traffic, hands freed heap memory back to the OS (glibc keeps it otherwise:
        a burst of thousands of connections would leave the RSS at its high-water mark)."""
        served = self.server_state.total_requests
        if served != self._trimmed_at and not self.server_state.connections and self.state.drained:
            self._trimmed_at = served
            gc.collect()  # request objects caught in reference cycles, before the trim
            if _LIBC is not None:
                _LIBC.malloc_trim(0)

    @property
    def port(self) -> int:
        return self.servers[0].sockets[0].getsockname()[1]

    async def on_tick(self, counter: int) -> bool:
        state = self.state
        if counter % 10 == 0:
            self._trim_when_idle()
        if state.phase == "failed":
            self.should_exit = True
        elif state.phase == "draining" and self._drain_done():
            self.should_exit = True
        elif state.phase == "ready" and not self._announced and self.started:
            self._announced = True
            if self.announce is not None:
                self.announce(self)
        return await super().on_tick(counter)


# The engine thread gives up the GIL in every kernel (nogil) and must take it back ~100 times a step;
# while the event loop runs Python it waits up to the switch interval each time (5 ms by default).
GIL_SWITCH_S = 0.0005


def serve(load, host: str, port: int, config: ServeConfig, announce=None) -> ServeState:
    """Serves until SIGTERM/SIGINT; the state at the end (``failure``: the load's refusal)."""
    raise_open_files()
    sys.setswitchinterval(GIL_SWITCH_S)
    prometheus_client.disable_created_metrics()  # process-wide: no *_created series (vLLM has none)
    state = ServeState(load, config)
    uv = uvicorn.Config(create_app(state), host=host, port=port, backlog=BACKLOG, loop="uvloop", http="httptools",
                        lifespan="on", log_level="warning", access_log=False, timeout_keep_alive=30,
                        proxy_headers=False)  # nothing reads client addresses: no X-Forwarded-* rewrite per request
    server = DrainingServer(uv, state, announce)
    server.run()
    return state


def serve_threads(threads: int | None) -> int:
    """The engine's kernel threads: as given, else ``serving_threads`` of the CPUs this process may use."""
    return threads if threads is not None else serving_threads(available_cpus())


def main(path: str, host: str, port: int, config: ServeConfig, head: str = "sparse", threads: int | None = None,
         load=None, label: str = "", gpu_kernels: str = LoadOptions.gpu_kernels,
         device: str = LoadOptions.device) -> None:
    """`runtime serve`: prints one ready line on stdout once bound, errors as one line on stderr. ``load``:
    another engine's loader in place of the bundle's (a benchmark's no-op engine), named ``label``;
    ``gpu_kernels``: the GPU kernel family, ``device``: native or sim (Engine.load)."""
    from toolcall.runtime.engine import Engine

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    stale_s = DEVICES[device].stale_s
    if stale_s is not None:
        config = dataclasses.replace(config, stale_s=max(config.stale_s, stale_s))
    if load is None:
        def load():
            return Engine.load(path, head=head, threads=serve_threads(threads), gpu_kernels=gpu_kernels,
                               device=device)

    def announce(server: DrainingServer) -> None:
        e = server.state.engine
        on = ", simulated device" if getattr(e, "device", None) == "sim" else ""
        print(f"ready: http://{host}:{server.port} serving {e.folder.name} ({e.contract.target.name}, "
              f"{e.contract.precision.weights}{on}{', ' + label if label else ''}); loaded in {e.load_seconds:.2f} s",
              flush=True)

    state = serve(load, host, port, config, announce)
    if state.failure is not None:
        print(f"error: {state.failure}", file=sys.stderr, flush=True)
        sys.exit(state.failure.exit_code)
    sys.exit(0)
