"""Admission and queues: requests waiting for a slot, running sequences, and the KV pages they hold.

A submitted request waits (FIFO) until a sequence slot and the KV pages for its whole
lifetime (prompt plus maximum answer) are free; it is then admitted as a running sequence.
While a slot is free, every waiting request is tried at each admission pass, in arrival
order, so a small request is not held behind one that does not fit its pages yet; with no
slot free a pass tries none (thousands may wait: a refusal built per request per step
measured 6-10% of the engine thread in a 2,048-request burst). A finished or aborted sequence
gives its slot and pages back at once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from toolcall.common.errors import RequestError
from toolcall.runtime.batching.sampling import Sampling
from toolcall.runtime.grammar.stepper import GrammarStepper

SHORTAGE_CODES = ("too_many_sequences", "kv_pages")  # refusals a queueing request waits out


@dataclass(frozen=True)
class Request:
    """One request's prompt and its answer's controls: ``grammar`` the GrammarStepper of the tools the request
    brought (runtime/grammar/request_tools.py; None: the bundle's catalog), ``tools`` the indices (in that
    grammar) the answer may name (None: every tool), ``max_tools`` the most it may name (None: the grammar's),
    ``require_tool`` forbids the empty answer, ``max_output_tokens`` caps the answer (None: the contract's)."""

    prompt_ids: tuple[int, ...]
    sampling: Sampling = Sampling()
    keep_logits: bool = False  # Result.step_logits/step_candidates filled (canary, parity and bit tests)
    tools: tuple[int, ...] | None = None
    max_tools: int | None = None
    require_tool: bool = False
    max_output_tokens: int | None = None
    grammar: GrammarStepper | None = None


@dataclass(eq=False)  # identity: running.remove(seq) compares no fields (and never a prompt array)
class Sequence:
    handle: int
    slot: int
    prompt: np.ndarray  # (P,) int64 token ids
    sampling: Sampling
    state: np.ndarray  # 0-d grammar state
    prefilled: int = 0  # prompt tokens whose K/V are in the slot's pages
    output: list[int] = field(default_factory=list)
    fed: int = 0  # output tokens whose K/V are in the slot's pages (the rest ride in the next step's rows)
    tools: list[str] = field(default_factory=list)  # names closed so far, in order
    min_margin: float = float("inf")
    start: float = 0.0  # admission time (perf_counter)
    first_token_at: float = 0.0
    step_logits: list[np.ndarray] | None = None  # kept only for Request.keep_logits
    step_candidates: list[np.ndarray] | None = None
    cached: int = 0  # prompt tokens the KV pool shared or copied at admission (prefill starts there)
    done: bool = False  # the grammar state is terminal (END taken); set with ``state``
    max_output: int = 0  # the answer's token limit (the request's, else the contract's)
    max_tools: int = 0  # the answer's tool limit (the request's, else the catalog's)
    allow_empty: bool = True  # the empty answer allowed (the catalog's rule, unless the request needs a tool)
    stepper: GrammarStepper | None = None  # the grammar the answer walks: the request's own tools', else the bundle's


@dataclass
class _Waiting:
    request: Request
    queue: bool  # False: refuse instead of waiting when slots or pages are short


class Scheduler:
    """Waiting requests by handle (arrival order) and running sequences over a paged KV pool."""

    def __init__(self, kv, stepper: GrammarStepper, max_output_tokens: int):
        self.kv, self.stepper, self.max_output_tokens = kv, stepper, max_output_tokens
        self.waiting: dict[int, _Waiting] = {}  # insertion order = arrival order
        self.running: list[Sequence] = []
        self.waiting_tokens = 0  # prompt tokens of the waiting requests
        self._refusable = 0  # waiting requests with queue=False (refused, not kept, when nothing fits)
        self.max_running: int | None = None  # a cap below the pool's slots (a lane's share, runtime/batching/lanes.py)

    def enqueue(self, handle: int, request: Request, queue: bool = True) -> None:
        assert handle not in self.waiting
        self.waiting[handle] = _Waiting(request, queue)
        self.waiting_tokens += len(request.prompt_ids)
        self._refusable += not queue

    def admit(self) -> list[tuple[int, RequestError]]:
        """Admits every waiting request that fits now; returns the (handle, error) of those refused."""
        refused = []
        if not self._slot_free() and not self._refusable:  # nothing can be admitted or refused this pass
            return refused
        for handle, w in list(self.waiting.items()):
            if not self._slot_free():  # no slot left: the rest wait, without a refusal built per request
                if not self._refusable:
                    break
                if w.queue:
                    continue
            try:
                if self.max_running is not None and len(self.running) >= self.max_running:
                    raise RequestError("too_many_sequences", f"all {self.max_running} sequences of this lane are "
                                       "busy; retry when a sequence finishes", limit=self.max_running)
                slot = self.kv.admit(len(w.request.prompt_ids) + self.answer_limit(w.request), w.request.prompt_ids)
            except RequestError as e:
                if w.queue and e.code in SHORTAGE_CODES:
                    continue
                self._unqueue(handle)
                refused.append((handle, e))
                continue
            self._unqueue(handle)
            self.running.append(self.start(handle, w.request, slot))
        return refused

    def answer_limit(self, request: Request) -> int:
        """The most tokens the request's answer may take (its own cap, else the contract's)."""
        return self.max_output_tokens if request.max_output_tokens is None else request.max_output_tokens

    def _slot_free(self) -> bool:
        return bool(self.kv.free_slots) and (self.max_running is None or len(self.running) < self.max_running)

    def start(self, handle: int, request: Request, slot: int) -> Sequence:
        """The running sequence of an admitted request, its prompt not yet prefilled."""
        keep = [] if request.keep_logits else None
        cached = int(self.kv.cached_tokens[slot])  # shared or copied prefix: no prefill needed
        stepper = self.stepper if request.grammar is None else request.grammar
        return Sequence(handle, slot, np.asarray(request.prompt_ids, np.int64), request.sampling,
                        stepper.initial_state(request.tools),
                        prefilled=cached, start=time.perf_counter(), step_logits=keep,
                        step_candidates=None if keep is None else [], cached=cached,
                        max_output=self.answer_limit(request),
                        max_tools=stepper.grammar.max_tools if request.max_tools is None else request.max_tools,
                        allow_empty=bool(stepper.grammar.allow_empty) and not request.require_tool, stepper=stepper)

    def retire(self, seq: Sequence, cache: bool = True) -> None:
        """Removes a running sequence and frees its slot and pages. ``cache``: its prompt's full pages
        (and, from its prompt's first sequence, its answer's rows) stay reusable by later prompts (only
        when the whole prompt was prefilled)."""
        self.running.remove(seq)
        self.kv.release(seq.slot, cache=cache and seq.prefilled == len(seq.prompt), answer=seq.output[:seq.fed])

    def abort(self, handle: int) -> bool:
        """Drops a waiting request or a running sequence (pages freed now); False if unknown."""
        if handle in self.waiting:
            self._unqueue(handle)
            return True
        for seq in self.running:
            if seq.handle == handle:
                self.retire(seq, cache=False)
                return True
        return False

    def abort_all(self) -> None:
        for seq in list(self.running):  # after a failed step pages may be half written: never cached
            self.retire(seq, cache=False)
        for handle in list(self.waiting):
            self._unqueue(handle)

    def _unqueue(self, handle: int) -> None:
        w = self.waiting.pop(handle)
        self.waiting_tokens -= len(w.request.prompt_ids)
        self._refusable -= not w.queue
