"""The serving state: the bound engine, its engine loop, the phase (loading/ready/draining), answers.

``answer`` is the one path every endpoint takes: build the Request, submit it to the
engine loop, await its ticket while watching for the client going away (then the request
is aborted and its pages freed), and return the Result or raise its typed error.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import threading
from dataclasses import dataclass
from typing import Callable

from toolcall.common.errors import EngineError, RequestError
from toolcall.runtime.batching.lanes import Lanes
from toolcall.runtime.batching.sampling import Sampling
from toolcall.runtime.bundle.machine import available_cpus
from toolcall.runtime.serve.engine_thread import EngineThread, Ticket, stopped_error
from toolcall.runtime.serve.kernel_threads import KernelThreads, adaptive_kernel_threads
from toolcall.runtime.serve.metrics import ServeMetrics

log = logging.getLogger("toolcall.runtime.serve")


@dataclass(frozen=True)
class ServeConfig:
    """Server limits; None: sized from the contract (see ``queue_bounds``)."""

    max_waiting_requests: int | None = None
    max_waiting_tokens: int | None = None
    request_timeout_s: float = 60.0
    max_body_bytes: int = 64 * 1024
    stale_s: float = 30.0  # engine heartbeat older than this: not ready
    adaptive_threads: bool = True  # the fast CPU engine's kernel threads follow the spare CPU (kernel_threads.py)
    lanes: int | None = None  # step groups whose kernels overlap (runtime/batching/lanes.py); None: ``serving_lanes``
    served_model_names: tuple[str, ...] = ()  # the names clients use (vLLM's --served-model-name); (): the folder's
    drain_grace_s: float = 1.0  # after SIGTERM: answer (503) what keeps arriving this long after the last answer


def queue_bounds(limits, config: ServeConfig) -> tuple[int, int]:
    """Waiting-queue bounds: 32 requests per sequence slot, and a quarter of each queued
    request's max_input_tokens on average, unless the config gives them."""
    requests = config.max_waiting_requests or 32 * limits.max_sequences
    tokens = config.max_waiting_tokens or max(limits.max_input_tokens, requests * limits.max_input_tokens // 4)
    return requests, tokens


async def _disconnected(receive) -> None:
    """Returns when the client goes away (the request body is already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


# Full (generation 2) collections are considered after this many generation-1 ones (Python's default: 10)
FULL_COLLECTION_AFTER = 100


def freeze_long_lived_objects() -> None:
    """Moves every object alive now (the loaded engine, numba's dispatchers, the imported modules) out
    of the garbage collector's view (gc.freeze), and makes full collections 10x rarer. Each full
    collection holds the GIL while it walks every tracked object: a 2,048-request burst ran 4 of
    them, 750 ms in all, up to 256 ms each, and the engine thread stood still through every one; with
    the freeze alone, 4 of 358 ms (the burst's own objects); with both, none in a burst."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)


def serving_lanes(model, config: ServeConfig, cpus: int) -> tuple[int, int]:
    """(lanes, kernel threads per lane) for this engine's backend on ``cpus`` CPUs: ``config.lanes`` if
    given, else 2 on 2 or more CPUs unless ``--threads`` fixed the threads (then 1, as given). The CPUs
    (or the given threads) are split between the lanes. Backends without lanes (CUDA, the numpy
    reference) step as one lane."""
    if not model.lanes_supported:
        return 1, 0
    fixed = not config.adaptive_threads  # --threads given: model.threads is that
    lanes = config.lanes if config.lanes is not None else (1 if fixed or cpus < 2 else 2)
    lanes = max(1, lanes)
    return lanes, max(1, (model.threads if fixed else cpus) // lanes)


class ServeState:
    """Owns the engine once loaded; ``phase`` is loading -> ready -> draining (or failed)."""

    def __init__(self, load: Callable[[], object], config: ServeConfig = ServeConfig()):
        self.load_fn, self.config = load, config
        self.engine = None
        self.engine_thread: EngineThread | None = None
        self.phase = "loading"
        self.failure: EngineError | None = None
        self.metrics = ServeMetrics(lambda: self.engine_thread, lambda: self.model_names[0], lambda: self.engine)
        self.kernel_threads: KernelThreads | None = None
        self.loop_thread = threading.main_thread().native_id  # the event loop's; the app's lifespan sets it
        self._lock = threading.Lock()

    def load(self) -> None:
        """Loads (and canary-gates) the engine and starts its loop; on a typed failure ``phase``
        becomes failed and ``failure`` holds the error."""
        try:
            engine = self.load_fn()
        except EngineError as e:
            self.failure, self.phase = e, "failed"
            return
        freeze_long_lived_objects()
        requests, tokens = queue_bounds(engine.contract.limits, self.config)
        self.engine = engine
        generator = engine.generator
        lanes, threads = serving_lanes(engine.model, self.config, available_cpus())
        if lanes > 1:  # each lane's forward on its own thread, the CPUs split between them
            generator = Lanes.of(engine.generator, lanes)
            for lane in generator.lanes:
                lane.model.threads = min(threads, lane.model.max_threads)  # numba's pool caps it
            try:  # the lanes' own path (fused layer loop), compiled and proven before the port is ready
                engine.check_canary(generator)
            except EngineError as e:
                generator.close()
                engine.close()
                self.failure, self.phase = e, "failed"
                return
        elif self.config.adaptive_threads:
            self.kernel_threads = adaptive_kernel_threads(engine.model, self.loop_thread)

        def stop() -> None:
            if lanes > 1:
                generator.close()
            engine.close()

        self.engine_thread = EngineThread(generator, max_waiting_requests=requests, max_waiting_tokens=tokens,
                                          on_step=self._on_step, on_start=engine.model.bind_thread, on_stop=stop,
                                          on_fail=self._engine_failed).start()
        with self._lock:
            if self.phase == "loading":
                self.phase = "ready"

    def _engine_failed(self, error: BaseException) -> None:
        """The engine thread stopped on ``error`` (a device fault): the replica is failed for good (/health 503, new
        requests 503) and the server exits with the error's code (server.py)."""
        with self._lock:
            self.failure = error if isinstance(error, EngineError) else EngineError(
                "internal", f"the engine thread stopped: {type(error).__name__}: {error}")
            self.phase = "failed"

    def _on_step(self, seconds: float, finished: list[Ticket]) -> None:
        self.metrics.step_took(seconds)
        if self.kernel_threads is not None:  # the engine thread, between steps
            self.engine.generator.model.threads = self.kernel_threads.update()

    def begin_drain(self) -> None:
        """Stops admitting (503 on /health and on new requests); admitted requests finish."""
        with self._lock:
            self.phase = "draining"
        if self.engine_thread is not None:
            self.engine_thread.stop_admitting()

    @property
    def drained(self) -> bool:
        return self.engine_thread is None or self.engine_thread.in_flight == 0

    def ready(self) -> bool:
        thread = self.engine_thread
        return self.phase == "ready" and thread is not None and thread.alive(self.config.stale_s)

    def close(self) -> None:
        """Ends the engine thread (which closes the engine on its way out)."""
        if self.engine_thread is not None:
            self.engine_thread.close(timeout=30)

    @property
    def model_names(self) -> tuple[str, ...]:
        """The names this server answers to (the first is the metrics' model_name), the bundle id aside:
        the configured ones, else the bundle folder's name (before the load: "loading")."""
        if self.config.served_model_names:
            return self.config.served_model_names
        return (self.engine.folder.name,) if self.engine is not None else ("loading",)

    def not_admitting(self) -> RequestError:
        if self.phase == "failed" and self.engine is not None:  # it was serving: its engine thread stopped
            return stopped_error(self.failure)
        what = {"loading": "is still loading the bundle", "draining": "is shutting down",
                "failed": "failed to load its bundle"}.get(self.phase, "is not ready")
        return RequestError("draining", f"the server {what} and admits no requests; retry shortly or on "
                            "another replica", phase=self.phase, retry_after_s=1)

    async def answer(self, http_request, text: str, sampling: Sampling, tools: list | None,
                     timeout_s: float | None, **controls) -> tuple[Ticket, object]:
        """(ticket, Result) for one request, or raises its RequestError (the HTTP edge counts it). ``tools``:
        names or Tools (Engine.request); ``controls``: the answer's rules (Engine.request's only, max_tools,
        require_tool, max_output_tokens)."""
        if self.phase != "ready" or self.engine_thread is None:
            raise self.not_admitting()
        timeout = timeout_s if timeout_s is not None else self.config.request_timeout_s
        if tools is None:
            request = self.engine.request(text, sampling, None, **controls)
        else:  # a new tool list builds its trie and prompt encoder (~10-20 ms for 26 tools): off the event loop
            request = await asyncio.to_thread(self.engine.request, text, sampling, tools, **controls)
        aio = asyncio.get_running_loop()
        future = aio.create_future()

        def done(t: Ticket) -> None:  # engine thread
            self.metrics.finished(t)
            aio.call_soon_threadsafe(_resolve, future, t)

        ticket = self.engine_thread.submit(request, done, timeout)
        gone = asyncio.ensure_future(_disconnected(http_request.receive))
        try:
            # the engine answers every ticket (deadline included); the extra seconds only guard its thread
            await asyncio.wait({future, gone}, timeout=timeout + 30, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not future.done():
            self.engine_thread.abort(ticket, None if gone.done() else RequestError(
                "deadline_exceeded", f"no answer within {timeout:.3g} s", timeout_s=timeout))
            if not gone.done():
                await asyncio.wait({future}, timeout=5)
            if not future.done():
                raise RequestError("request_aborted", "the client went away; the request was dropped")
        if isinstance(ticket.result, RequestError):
            raise ticket.result
        return ticket, ticket.result


def _resolve(future: asyncio.Future, ticket: Ticket) -> None:
    if not future.done():
        future.set_result(ticket)
