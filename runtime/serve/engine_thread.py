"""The engine thread: one thread owns the generator (model, KV pool) and runs its step loop.

Callers on any thread ``submit`` a Request (a Ticket back, answered through its callback on
the engine thread), ``abort`` a ticket, or stop admitting to drain. Submissions and aborts
go through an inbox under one lock; the engine thread takes them between steps, so the
generator is only ever touched by that thread. With nothing to do the thread sleeps on a
condition variable (woken by submit, abort or close; it wakes at most every ``beat_s``
to refresh its heartbeat), never busy-waits.

The waiting queue is bounded by requests and by their prompt tokens: a submit past either
bound is refused with ``queue_full`` (the server's 429). Each ticket may carry a deadline:
one that passes while waiting or running is aborted (pages freed) and answered
``deadline_exceeded``.

A step that fails is answered to the requests it held and serving goes on, unless the failure is the
device's (a CudaError: after a fault the CUDA context is lost and every later call fails too): then the
thread stops, answers every request it holds ``device_failed`` and calls ``on_fail`` (the server marks the
replica failed and exits non-zero, so the orchestrator restarts it on a fresh context).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from toolcall.common.errors import CudaError, EngineError, RequestError
from toolcall.runtime.batching.batcher import Result, StepBatcher
from toolcall.runtime.batching.scheduler import Request

log = logging.getLogger("toolcall.runtime.serve.engine_thread")


@dataclass(eq=False)
class Ticket:
    """One submitted request. ``on_done(ticket)`` runs once, on the engine thread, when ``result``
    (a Result, or the RequestError that ended it) is set. Times are ``time.perf_counter()``."""

    request: Request
    on_done: Callable[["Ticket"], None]
    submitted: float
    deadline: float | None
    handle: int | None = None  # the generator's, once the engine thread has taken it
    result: Result | RequestError | None = None
    finished: float = 0.0
    cancel: RequestError | None = field(default=None, repr=False)


class EngineThread:
    """The step loop of one generator on its own thread, with a bounded waiting queue."""

    def __init__(self, generator: StepBatcher, *, max_waiting_requests: int, max_waiting_tokens: int,
                 on_step: Callable[[float, list[Ticket]], None] | None = None, beat_s: float = 1.0,
                 on_start: Callable[[], None] | None = None, on_stop: Callable[[], None] | None = None,
                 on_fail: Callable[[BaseException], None] | None = None):
        """``on_start``/``on_stop`` run on the engine thread before its first and after its last
        step (a GPU engine makes its context current there, and frees its memory from there);
        ``on_fail(error)`` when the thread stops on an error (every held request already answered)."""
        self.generator = generator
        self.on_start, self.on_stop, self.on_fail = on_start, on_stop, on_fail
        self.max_waiting_requests, self.max_waiting_tokens = max_waiting_requests, max_waiting_tokens
        self.on_step, self.beat_s = on_step, beat_s
        self._cond = threading.Condition()
        self._inbox: list[Ticket] = []
        self._inbox_tokens = 0
        self._aborts: list[Ticket] = []
        self._live: dict[int, Ticket] = {}  # generator handle -> ticket (engine thread only)
        self._deadlines: list[tuple[float, int, Ticket]] = []  # heap (engine thread only)
        self._order = itertools.count()
        self._stopping = False
        self.admitting = True
        # Published under the lock after every step, read by any thread (metrics, health):
        self.in_flight = 0  # submitted, not yet answered
        self.waiting, self.waiting_tokens, self.running = 0, 0, 0
        self._publish_pool()
        self.heartbeat = time.monotonic()
        self.turns = 0  # loop turns taken (a test checks the idle thread does not spin)
        self.rate = 0.0  # requests finished per second, smoothed over steps
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> "EngineThread":
        self._thread.start()
        return self

    # ---- any thread ----
    def submit(self, request: Request, on_done: Callable[[Ticket], None], timeout_s: float | None = None) -> Ticket:
        """Queues a request; raises RequestError: its own fault (invalid, can never fit), ``queue_full``
        or ``draining``. ``on_done`` is called exactly once with the answered ticket."""
        self.generator.check(request)
        now = time.perf_counter()
        ticket = Ticket(request, on_done, now, None if timeout_s is None else now + timeout_s)
        tokens = len(request.prompt_ids)
        with self._cond:
            if not self.admitting:
                raise RequestError("draining", "the server is shutting down and admits no new requests; "
                                   "retry on another replica")
            waiting = self.waiting + len(self._inbox)
            queued_tokens = self.waiting_tokens + self._inbox_tokens
            if waiting + 1 > self.max_waiting_requests or queued_tokens + tokens > self.max_waiting_tokens:
                raise RequestError("queue_full", f"the waiting queue holds {waiting} requests with {queued_tokens} "
                                   f"prompt tokens; its bounds are {self.max_waiting_requests} requests and "
                                   f"{self.max_waiting_tokens} tokens; retry after a moment",
                                   waiting=waiting, waiting_tokens=queued_tokens, prompt_tokens=tokens,
                                   max_waiting=self.max_waiting_requests, max_waiting_tokens=self.max_waiting_tokens,
                                   retry_after_s=self.retry_after_s())
            self._inbox.append(ticket)
            self._inbox_tokens += tokens
            self.in_flight += 1
            self._cond.notify()
        return ticket

    def abort(self, ticket: Ticket, error: RequestError | None = None) -> None:
        """Drops a ticket (waiting or running; its pages are freed on the next loop turn); it is
        answered with ``error`` (default ``request_aborted``) unless it finished first."""
        with self._cond:
            if ticket.cancel is None:
                ticket.cancel = error or RequestError("request_aborted",
                                                      "the client went away; the request was dropped")
                self._aborts.append(ticket)
                self._cond.notify()

    def stop_admitting(self) -> None:
        with self._cond:
            self.admitting = False

    def retry_after_s(self) -> int:
        """Seconds a refused caller should wait: the queue's length over the recent finishing rate (1..60)."""
        waiting = self.waiting + len(self._inbox)
        return int(min(60, max(1, -(-waiting // max(1.0, self.rate)))))

    def alive(self, stale_s: float = 30.0) -> bool:
        """The thread runs and has beaten within ``stale_s`` (a step or an idle wake-up)."""
        return self._thread.is_alive() and time.monotonic() - self.heartbeat < stale_s

    def close(self, timeout: float | None = None) -> None:
        """Answers nothing new; the thread ends once every admitted request is answered."""
        with self._cond:
            self.admitting = False
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    # ---- engine thread ----
    def _run(self) -> None:
        try:
            if self.on_start is not None:
                self.on_start()
            self._loop()
        except BaseException as e:  # the thread is gone: refuse new work, answer what is held
            log.error("engine thread stopped: %s: %s", type(e).__name__, e)
            with self._cond:
                self.failure, self.admitting = e, False
                held = self._inbox + list(self._live.values())
                self._inbox = []
            for t in held:
                self._finish(t, stopped_error(e))
            if self.on_fail is not None:
                self.on_fail(e)
        finally:
            if self.on_stop is not None:
                try:
                    self.on_stop()
                except Exception as e:  # noqa: BLE001 (freeing after a lost context fails too; nothing is left to do)
                    log.error("engine teardown failed: %s: %s", type(e).__name__, e)

    def _loop(self) -> None:
        gen = self.generator
        while True:
            with self._cond:
                self.turns += 1
                self.heartbeat = time.monotonic()
                while not (self._inbox or self._aborts or gen.busy or self._stopping):
                    self._cond.wait(self.beat_s)
                    self.turns += 1
                    self.heartbeat = time.monotonic()
                if self._stopping and not (self._inbox or self._aborts or gen.busy):
                    return
                inbox, self._inbox, self._inbox_tokens = self._inbox, [], 0
                aborts, self._aborts = self._aborts, []
                # the inbox's requests count as waiting until the generator holds them
                self.waiting += len(inbox)
                self.waiting_tokens += sum(len(t.request.prompt_ids) for t in inbox)
            for t in inbox:
                self._take(t)
            for t in aborts:
                if t.handle is not None and t.handle in self._live and gen.abort(t.handle):
                    self._finish(self._live.pop(t.handle), t.cancel)
            self._expire()
            finished: list[Ticket] = []
            if gen.busy:
                start = time.perf_counter()
                try:
                    done = gen.step()
                except CudaError:  # the device failed: no later step can run (_run answers what is held)
                    raise
                except Exception as e:  # the step failed: answer everything it held, keep serving
                    log.error("engine step failed: %s: %s", type(e).__name__, e)
                    self.failure = e
                    err = e if isinstance(e, EngineError) else EngineError("internal", f"engine step failed: "
                                                                          f"{type(e).__name__}: {e}")
                    done = [(h, err) for h in list(self._live)]
                    gen.abort_all()
                elapsed = time.perf_counter() - start
                for handle, res in done:
                    ticket = self._live.pop(handle)
                    self._finish(ticket, res)
                    finished.append(ticket)
                self.rate = 0.9 * self.rate + 0.1 * (len(done) / max(elapsed, 1e-6))
                if self.on_step is not None:
                    self.on_step(elapsed, finished)
            with self._cond:
                self.waiting, self.waiting_tokens, self.running = gen.counts()
                self._publish_pool()

    def _publish_pool(self) -> None:
        kv = self.generator.kv
        self.free_pages, self.pages_in_use = kv.free_pages, kv.pages_in_use
        self.prefix_query_tokens, self.prefix_hit_tokens = kv.prefix_query_tokens, kv.prefix_hit_tokens

    def _take(self, t: Ticket) -> None:
        if t.cancel is not None:
            self._finish(t, t.cancel)
            return
        try:
            t.handle = self.generator.submit(t.request, checked=True)  # submit() ran check()
        except RequestError as e:
            self._finish(t, e)
            return
        self._live[t.handle] = t
        if t.deadline is not None:
            heapq.heappush(self._deadlines, (t.deadline, next(self._order), t))

    def _expire(self) -> None:
        if len(self._deadlines) > 2 * len(self._live) + 64:  # drop answered tickets: memory stays flat
            self._deadlines = [d for d in self._deadlines if d[2].result is None]
            heapq.heapify(self._deadlines)
        now = time.perf_counter()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, t = heapq.heappop(self._deadlines)
            if t.result is None and t.handle in self._live and self.generator.abort(t.handle):
                self._live.pop(t.handle)
                limit = t.deadline - t.submitted
                self._finish(t, RequestError("deadline_exceeded", f"the request did not finish within its "
                                             f"{limit:.3g} s deadline; it was dropped (raise timeout_s, or retry "
                                             "when the server is less busy)", timeout_s=round(limit, 6)))

    def _finish(self, t: Ticket, result: Result | RequestError) -> None:
        if t.result is not None:
            return
        t.result, t.finished = result, time.perf_counter()
        with self._cond:
            self.in_flight -= 1
        try:
            t.on_done(t)
        except Exception as e:  # a caller's callback must not take the engine down
            log.error("result callback failed: %s: %s", type(e).__name__, e)


def stopped_error(cause: BaseException) -> RequestError:
    """What the requests held by a stopped engine thread are answered: ``device_failed`` after a device fault,
    else ``draining``; both 503, the replica serves nothing more."""
    if isinstance(cause, CudaError):
        return RequestError("device_failed", f"the replica's device failed ({cause.code}: {cause.message}); it "
                            "serves no more requests: retry on another replica", reason=cause.code, retry_after_s=1,
                            **{k: v for k, v in cause.details.items() if k in ("call", "error", "kernel")})
    return RequestError("draining", f"the engine thread stopped ({type(cause).__name__}); this replica serves no "
                        "more requests", retry_after_s=1)
