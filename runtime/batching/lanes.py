"""Lanes: the engine's sequences in N groups whose steps overlap, so the CPUs never wait on one step's Python.

A step is three parts (runtime/batching/batcher.py): ``plan`` (admission, the rows; Python, holds the GIL),
``forward`` (the kernels; numba releases the GIL, but takes it at each parallel launch, hence the lanes'
fused serial loop: runtime/cpu/fused_forward.py) and ``land`` (the picks, retirement; Python). With one
group, the kernels of a step and its Python alternate, and a second core is idle during the Python or,
with two kernel threads, waits at launches and barriers whenever the event loop holds the GIL or the core.
Lanes split the running sequences into N groups, each a StepBatcher over the same KV pool and weights
(its own step buffers: the backend's ``split``), and step them in turn: lane i's forward runs on a worker thread while the engine thread lands and
plans the other lanes. The engine thread also lays each forward out (``StepBatcher.step_call``: views, embedding rows,
the rows' pages; Python it runs holding the GIL anyway), so a worker runs only the nogil layer loop and
takes the GIL just to enter and return, instead of queueing for it behind the engine thread and the
event loop before every forward. (numba's thread count is per thread: laying a forward out sets the
engine thread's to the lane's, which only the dense head's parallel kernel, a test path, would feel.)
The kernels of different lanes never synchronize, so a lane whose thread is preempted delays no one else.

What stays as one engine: one KV pool, one page allocator, touched only on the engine thread (admission
and retirement happen in plan/land, never while another thread could read the same pages: a lane's
forward reads only its own sequences' pages and the shared read-only ones); one handle space; a request
goes to the lane with the fewest requests. An abort of a sequence whose lane has a forward in flight is
applied when that forward lands (its pages are being written until then), and the sequence is not
reported. Answers do not change: a sequence's tokens depend only on its own rows (tests/test_lanes.py).
"""
from __future__ import annotations

import itertools
from concurrent.futures import Future, ThreadPoolExecutor

from toolcall.common.errors import RequestError
from toolcall.runtime.batching.batcher import Result, StepBatcher
from toolcall.runtime.batching.scheduler import Request
from toolcall.runtime.batching.step import StepPlan


class Lanes:
    """The StepBatcher interface (submit, step, abort, busy, counts, kv, grammar) over N lane StepBatchers."""

    def __init__(self, lanes: list[StepBatcher]):
        assert len(lanes) >= 2 and all(g.kv is lanes[0].kv for g in lanes)
        self.lanes = lanes
        self.kv, self.grammar, self.model = lanes[0].kv, lanes[0].grammar, lanes[0].model
        handles = itertools.count()
        for g in lanes:
            g._handles = handles  # one handle space
        self._lane_of: dict[int, int] = {}  # handle -> lane, until reported or aborted
        self._flight: list[tuple[StepPlan, Future] | None] = [None] * len(lanes)
        self._deferred: list[set[int]] = [set() for _ in lanes]  # aborts waiting for the lane's forward
        self._pool = ThreadPoolExecutor(len(lanes), thread_name_prefix="lane")

    @classmethod
    def of(cls, generator: StepBatcher, lanes: int) -> "Lanes":
        """``lanes`` StepBatchers sharing ``generator``'s pool, grammar and weights, each with 1/lanes of its
        step's rows and sequence slots (its backend's ``split``: the step buffers add up to the contract's
        workspace)."""
        rows = generator.max_tokens_per_step // lanes
        assert rows >= 1 and generator.prefill_chunk >= 1 and generator.model.lanes_supported
        out = []
        for backend in generator.model.split(lanes, rows):
            g = StepBatcher(backend, generator.kv, generator.grammar,
                            max_input_tokens=generator.max_input_tokens, max_output_tokens=generator.max_output_tokens,
                            max_tokens_per_step=rows, prefill_chunk=min(generator.prefill_chunk, rows),
                            head=generator.head)
            # its share of the slots (else the first lane planned takes them all); one decode row each fits its step
            g.scheduler.max_running = max(1, min(rows, generator.kv.max_seqs // lanes))
            out.append(g)
        return cls(out)

    def validate(self, request: Request) -> None:
        self.lanes[0].validate(request)

    def check(self, request: Request) -> None:
        self.lanes[0].check(request)

    def submit(self, request: Request, queue: bool = True, checked: bool = False) -> int:
        """As StepBatcher.submit; the request joins the lane holding the fewest requests (ties: the lowest)."""
        lane = min(range(len(self.lanes)), key=lambda i: self._load(i))
        handle = self.lanes[lane].submit(request, queue, checked)
        self._lane_of[handle] = lane
        return handle

    def _load(self, i: int) -> int:
        s = self.lanes[i].scheduler
        return len(s.waiting) + len(s.running)

    @property
    def busy(self) -> bool:
        return any(g.busy for g in self.lanes) or any(f is not None for f in self._flight)

    def counts(self) -> tuple[int, int, int]:
        c = [g.counts() for g in self.lanes]
        return sum(x[0] for x in c), sum(x[1] for x in c), sum(x[2] for x in c)

    def step(self) -> list[tuple[int, Result | RequestError]]:
        """Each lane in turn: its forward in flight lands (picks, retirement), then its next step is
        planned and its forward started on a worker; returns what finished or was refused."""
        finished: list[tuple[int, Result | RequestError]] = []
        for i, lane in enumerate(self.lanes):
            try:
                finished += self._land(i)
                plan = lane.plan()
                compute = lane.step_call(plan) if plan.running else None  # laid out here, under the GIL
            except BaseException:
                self._fail()
                raise
            finished += plan.refused
            plan.refused = []
            if compute is not None:
                self._flight[i] = (plan, self._pool.submit(compute))
        for handle, _ in finished:
            self._lane_of.pop(handle, None)
        return finished

    def _land(self, i: int) -> list[tuple[int, Result | RequestError]]:
        flight, self._flight[i] = self._flight[i], None
        if flight is None:
            return []
        plan, future = flight
        computed = future.result()  # a failed forward raises here
        lane = self.lanes[i]
        try:
            record = lane.record(plan, computed)
        except BaseException:  # a failed pick: the step's rows are half-landed, nothing running survives
            lane.scheduler.abort_all()
            raise
        for handle in self._deferred[i]:
            lane.abort(handle)
        self._deferred[i].clear()
        return lane.land(plan, record)

    def abort(self, handle: int) -> bool:
        """As StepBatcher.abort; a running sequence of a lane with a forward in flight is dropped when that
        forward lands (pages freed then) and is never reported."""
        i = self._lane_of.get(handle)
        if i is None:
            return False
        lane = self.lanes[i]
        flight = self._flight[i]
        if flight is not None and handle not in lane.scheduler.waiting and \
                any(seq.handle == handle for seq in lane.scheduler.running):
            self._deferred[i].add(handle)
            del self._lane_of[handle]
            return True
        del self._lane_of[handle]
        return lane.abort(handle)

    def abort_all(self) -> None:
        self._drain()
        for g in self.lanes:
            g.abort_all()
        self._lane_of.clear()

    def _drain(self) -> None:
        """Waits for every forward in flight (errors dropped): no page is freed under a running kernel."""
        for i, flight in enumerate(self._flight):
            if flight is not None:
                try:
                    flight[1].result()
                except BaseException:
                    pass
            self._flight[i] = None
            self._deferred[i].clear()

    def _fail(self) -> None:
        """A step failed part-way: half-written rows, so nothing running survives (as StepBatcher.step)."""
        self._drain()
        for g in self.lanes:
            g.scheduler.abort_all()
        self._lane_of.clear()

    def generate(self, requests: list[Request], queue: bool = True) -> list[Result | RequestError]:
        """As StepBatcher.generate (the same loop), over the lanes."""
        try:
            return StepBatcher.generate(self, requests, queue)  # type: ignore[arg-type]
        finally:
            self.abort_all()  # no forward left in flight

    def close(self) -> None:
        self._drain()
        self._pool.shutdown(wait=True)
