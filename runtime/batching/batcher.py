"""The decode loop: mixed prefill/decode steps, grammar-bounded heads, sampling.

Incremental: ``submit`` a request at any time (a handle back), ``step`` (admit what fits,
run one step, return the requests that finished), ``abort`` a handle (its pages freed at
once). New requests join between steps. Each step is a set of rows (token, slot,
position): the decode rows of every sequence that is answering, then prefill chunks of
admitted prompts up to ``max_tokens_per_step``, so a long prompt never blocks short ones.
A sequence's tokens depend only on its own rows, grammar state and sampling seed, never
on what else shares the step. ``generate(list)`` is a loop over the same core. A step is three
parts: ``plan`` (admission, the rows and their controls: runtime/batching/step.py), the backend's step
(the model, then each sampled row's pick and grammar state: runtime/backends.py) and ``land`` (the
record applied, retirement); runtime/batching/lanes.py overlaps several batchers' parts.

Forced tokens (the grammar allows one candidate: inside a tool name) need no logits: after a
pick they are appended at once (they take no draw: a sampled pick is keyed by its index in the
answer), and the next step feeds them as one chunk of decode rows, its last row
sampled: the same tokens in fewer steps, with fewer head rows. A request that keeps its
logits (``keep_logits``: canary, parity and bit tests) takes every token in its own step. A chunk's
rows that an earlier identical request already computed are copied, not computed
(runtime/batching/answer_cache.py).
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from toolcall.common.errors import RequestError
from toolcall.runtime.batching.picks import HostPicker
from toolcall.runtime.batching.sampling import Sampling, sample_rows, sampling_problem
from toolcall.runtime.batching.scheduler import Request, Scheduler, Sequence
from toolcall.runtime.batching.step import PickRows, StepPlan, StepRecord
from toolcall.runtime.grammar.stepper import GrammarStepper
from toolcall.runtime.grammar.trie import Grammar


@dataclass
class Result:
    token_ids: list[int]
    tools: list[str]
    finish: str  # "done" (END taken) or "length" (max_output_tokens reached first)
    min_margin: float  # smallest top-1 minus top-2 allowed logit over the steps
    ttft_s: float  # admission to first output token
    total_s: float
    # keep_logits only: per output step, the head's float32 logits (K,) over that step's candidate
    # token ids (K,) (-1 padded, the grammar's allowed edges in token order), exactly as sampled from.
    step_logits: list[np.ndarray] | None = None
    step_candidates: list[np.ndarray] | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    cached_prompt_tokens: int = 0  # prompt tokens taken from shared or cached KV pages, not prefilled

    def to_dict(self) -> dict:
        return {"tools": self.tools, "token_ids": self.token_ids, "finish": self.finish,
                "min_margin": self.min_margin, "ttft_ms": 1e3 * self.ttft_s, "total_ms": 1e3 * self.total_s,
                "prompt_token_ids": self.prompt_token_ids, "cached_prompt_tokens": self.cached_prompt_tokens}


class StepBatcher:
    """Runs requests to completion on a backend (runtime/backends.py) over its paged KV pool."""

    def __init__(self, model, kv, grammar: Grammar, *, max_input_tokens: int, max_output_tokens: int,
                 max_tokens_per_step: int, prefill_chunk: int, head: str = "sparse"):
        self.model, self.kv, self.grammar, self.head = model, kv, grammar, head
        self.stepper = GrammarStepper(grammar)
        self.picker = HostPicker(self.stepper, head)
        self.max_input_tokens, self.max_output_tokens = max_input_tokens, max_output_tokens
        self.max_tokens_per_step, self.prefill_chunk = max_tokens_per_step, prefill_chunk
        self.scheduler = Scheduler(kv, self.stepper, max_output_tokens)
        self._handles = itertools.count()
        # the draw compiled (or loaded from numba's cache) here, at load, not at a first sampled pick
        sample_rows(np.zeros((1, 2), np.float32), np.ones((1, 2), bool), [Sampling(1.0)], [0])

    @classmethod
    def for_limits(cls, model, kv, grammar: Grammar, limits, head: str = "sparse") -> "StepBatcher":
        """A batcher sized as a contract's ``limits`` say."""
        return cls(model, kv, grammar, max_input_tokens=limits.max_input_tokens,
                   max_output_tokens=limits.max_output_tokens, max_tokens_per_step=limits.max_tokens_per_step,
                   prefill_chunk=limits.prefill_chunk, head=head)

    def validate(self, request: Request) -> None:
        """Raises RequestError for a request that can never run under these limits."""
        n = len(request.prompt_ids)
        if n == 0:
            raise RequestError("request_invalid", "the prompt is empty; send at least one token")
        if n > self.max_input_tokens:
            raise RequestError("prompt_too_long", f"the prompt has {n} tokens; the contract allows "
                               f"{self.max_input_tokens}", limit=self.max_input_tokens, got=n)
        vocab = self.model.cfg.vocab_size
        bad = [t for t in request.prompt_ids if not 0 <= t < vocab]
        if bad:
            raise RequestError("request_invalid", f"prompt token ids {bad[:8]} are outside the vocabulary "
                               f"[0, {vocab})", vocab_size=vocab, bad_ids=bad[:8])
        if request.tools is not None:
            (self.stepper if request.grammar is None else request.grammar).check_subset(request.tools)
        problem = sampling_problem(request.sampling.temperature, request.sampling.top_p, request.sampling.seed)
        if problem:
            raise RequestError("request_invalid", f"sampling: {problem[1]}", field=problem[0],
                               temperature=repr(request.sampling.temperature), top_p=repr(request.sampling.top_p),
                               seed=request.sampling.seed)
        self._check_controls(request)

    def _check_controls(self, request: Request) -> None:
        """The answer's limits lie within the contract's and the catalog's."""
        for field, value, most in (("max_output_tokens", request.max_output_tokens, self.max_output_tokens),
                                   ("max_tools", request.max_tools, self.grammar.max_tools)):
            if value is not None and not (isinstance(value, int) and 1 <= value <= most):
                raise RequestError("request_invalid", f"{field} must be a whole number from 1 to {most} (this "
                                   f"bundle's limit); got {value!r}", field=field, got=repr(value), limit=most)

    def check(self, request: Request) -> None:
        """``validate`` plus the pool check: RequestError("kv_pages") for a request needing more
        pages than the pool has in all beside its pinned prefix pages (shared pages counted once).
        Reads only the limits and the pinned pages, fixed after load (safe from any thread)."""
        self.validate(request)
        self.kv.check_fits(len(request.prompt_ids) + self.scheduler.answer_limit(request), request.prompt_ids)

    def submit(self, request: Request, queue: bool = True, checked: bool = False) -> int:
        """Validates and enqueues a request; returns its handle. Raises RequestError for a request
        that can never run under these limits (prompt, vocabulary, sampling, pages in the pool).

        ``queue``: a request that does not fit now (slots or KV pages busy) waits for a sequence
        to finish; without it, it is refused with ``too_many_sequences``/``kv_pages`` at admission.
        ``checked``: the caller already ran ``check`` on this request (it is not run twice).
        """
        if not checked:
            self.check(request)
        handle = next(self._handles)
        self.scheduler.enqueue(handle, request, queue)
        return handle

    @property
    def busy(self) -> bool:
        """Requests are waiting or running."""
        return bool(self.scheduler.waiting or self.scheduler.running)

    def counts(self) -> tuple[int, int, int]:
        """(waiting requests, their prompt tokens, running sequences)."""
        s = self.scheduler
        return len(s.waiting), s.waiting_tokens, len(s.running)

    def step(self) -> list[tuple[int, Result | RequestError]]:
        """Admits what fits, runs one step, retires finished sequences (pages freed); returns the
        (handle, Result) of each request that finished and the (handle, RequestError) of each refused."""
        plan = self.plan()
        try:
            record = self.model.step(plan, self.kv, self.picker) if plan.running else None
        except BaseException:  # a failed step leaves half-written rows: nothing running survives it
            self.scheduler.abort_all()
            raise
        return self.land(plan, record)

    def plan(self) -> StepPlan:
        """The first third of ``step`` (engine thread): admits what fits and lays out the step's rows."""
        refused: list[tuple[int, Result | RequestError]] = list(self.scheduler.admit())
        running = list(self.scheduler.running)
        return self._rows(refused, running)

    def step_call(self, plan: StepPlan) -> Callable[[], object]:
        """The second third split for runtime/batching/lanes.py: the backend lays the step out now (engine
        thread) and returns the call that computes it (a lane's worker); ``record`` finishes it."""
        return self.model.step_call(plan, self.kv)

    def record(self, plan: StepPlan, computed: object) -> StepRecord:
        """The backend's record of a computed step (engine thread)."""
        return self.model.step_record(plan, computed, self.picker)

    def land(self, plan: StepPlan, record: StepRecord | None) -> list[tuple[int, Result | RequestError]]:
        """The last third (engine thread): the picks applied to their sequences, finished ones retired."""
        finished = plan.refused
        running = set(map(id, self.scheduler.running))  # an abort since the plan retired some already
        if record is not None:
            self._apply(plan.samplers, record)
        for seq in plan.prefilled:  # after the pick: its finite-numbers check passed
            if id(seq) in running:
                self.kv.register_prompt(seq.slot)
        for seq in [s for s in plan.running if id(s) in running and self._finished(s)]:
            self.scheduler.retire(seq)
            finished.append((seq.handle, self._result(seq)))
        return finished

    def abort(self, handle: int) -> bool:
        """Drops a waiting or running request, freeing its slot and pages now; False if not known
        (already finished or never submitted)."""
        return self.scheduler.abort(handle)

    def abort_all(self) -> None:
        self.scheduler.abort_all()

    def generate(self, requests: list[Request], queue: bool = True) -> list[Result | RequestError]:
        """Every request's Result, or the RequestError that refused it (others are unaffected).

        ``queue``: as for ``submit``.
        """
        results: list[Result | RequestError | None] = [None] * len(requests)
        index: dict[int, int] = {}
        for i, req in enumerate(requests):
            try:
                index[self.submit(req, queue)] = i
            except RequestError as e:
                results[i] = e
        try:
            while self.busy:
                for handle, res in self.step():
                    results[index[handle]] = res
        finally:
            for handle in index:  # an exception mid-loop must not leak pages
                self.abort(handle)
        return results  # type: ignore[return-value]

    def _finished(self, seq: Sequence) -> bool:
        return seq.done or len(seq.output) >= seq.max_output

    def _rows(self, refused: list, active: list[Sequence]) -> "StepPlan":
        tokens, slots, positions, samplers = [], [], [], []  # samplers: (sequence, row) pairs picking a token
        prefilled: list[Sequence] = []  # prompts this step completes
        answering = [seq for seq in active if seq.prefilled == len(seq.prompt)]
        spare = self.max_tokens_per_step - len(answering)  # rows past one each (the build keeps this >= 0)
        for seq in answering:  # each has output tokens not yet fed: the last pick and the forced ones after it
            n = min(len(seq.output) - seq.fed, 1 + spare)
            spare -= n - 1
            copied = self.kv.copy_answer_rows(seq.slot, seq.output, seq.fed, n)  # rows a repeat need not compute
            start = len(seq.prompt) + seq.fed
            tokens.extend(seq.output[seq.fed + copied:seq.fed + n])
            slots.extend([seq.slot] * (n - copied))
            positions.extend(range(start + copied, start + n))
            seq.fed += n
            if seq.fed == len(seq.output):  # a chunk cut short by the budget picks nothing this step
                samplers.append((seq, len(tokens) - 1))
        answer_rows = len(tokens)
        budget = self.max_tokens_per_step - len(tokens)
        for seq in active:
            if seq.prefilled < len(seq.prompt) and budget > 0:
                n = min(self.prefill_chunk, len(seq.prompt) - seq.prefilled, budget)
                tokens.extend(seq.prompt[seq.prefilled:seq.prefilled + n].tolist())
                slots.extend([seq.slot] * n)
                positions.extend(range(seq.prefilled, seq.prefilled + n))
                seq.prefilled += n
                budget -= n
                if seq.prefilled == len(seq.prompt):
                    samplers.append((seq, len(tokens) - 1))
                    prefilled.append(seq)
        seqs = [s for s, _ in samplers]
        steppers = None if all(s.stepper is self.stepper for s in seqs) else [s.stepper for s in seqs]  # own tools
        states = self._states(seqs) if steppers is None else [s.state for s in seqs]
        picks = PickRows(states, [s.sampling for s in seqs], [len(s.output) for s in seqs],
                         [s.max_output - len(s.output) for s in seqs], [s.step_logits is not None for s in seqs],
                         np.array([s.max_tools for s in seqs], np.int64),
                         np.array([s.allow_empty for s in seqs], np.bool_),
                         steppers)
        return StepPlan(refused, active, np.asarray(tokens, np.int64), np.asarray(slots, np.int64),
                        np.asarray(positions, np.int64), seqs, np.asarray([r for _, r in samplers], np.int64),
                        prefilled, picks, answer_rows)  # outputs: the sampled rows

    def _states(self, seqs: list[Sequence]) -> np.ndarray:
        states = np.empty(len(seqs), self.stepper.dtype)  # (np.stack of 0-d records is 10x slower)
        for b, seq in enumerate(seqs):
            states[b] = seq.state
        return states

    def _apply(self, seqs: list[Sequence], record: StepRecord) -> None:
        """Each sampled sequence takes its row of the record: state, emitted tokens (the pick and the run the
        grammar forced after it: they ride in its next step's rows), closed tools, margin, kept logits."""
        for b, seq in enumerate(seqs):
            if not seq.output:
                seq.first_token_at = record.picked_at
            seq.state = record.states[b]
            seq.done = record.done[b]
            seq.output.extend(record.tokens[b])
            seq.tools.extend(seq.stepper.grammar.tool_names[t] for t in record.closed[b])
            seq.min_margin = min(seq.min_margin, record.margins[b])
            if seq.step_logits is not None:
                seq.step_logits.append(record.logits[b])
                seq.step_candidates.append(record.candidates[b])

    def _result(self, seq: Sequence) -> Result:
        done = seq.done
        return Result(list(seq.output), list(seq.tools), "done" if done else "length", seq.min_margin,
                      seq.first_token_at - seq.start, time.perf_counter() - seq.start,
                      seq.step_logits, seq.step_candidates, seq.prompt.tolist(), seq.cached)
