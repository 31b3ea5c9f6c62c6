"""The decode loop: admission, mixed prefill/decode steps, grammar-bounded heads, sampling.

Each step is a set of rows (token, slot, position): one decode row for every sequence
that is answering, then prefill chunks of waiting prompts up to ``max_tokens_per_step``,
so a long prompt never blocks short ones. A sequence's tokens depend only on its own
rows, grammar state and sampling seed, never on what else shares the step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from common.errors import EngineError, RequestError
from .grammar import Grammar
from .grammar_stepper import GrammarStepper, decode_tools
from .sampling import Sampling, margins, sample_row

HEAD_MODES = ("sparse", "dense", "check")  # check: sparse picks, dense must agree


@dataclass(frozen=True)
class Request:
    prompt_ids: tuple[int, ...]
    sampling: Sampling = Sampling()
    keep_logits: bool = False  # Result.step_logits/step_candidates filled (canary, parity and bit tests)


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


@dataclass
class _Sequence:
    index: int
    slot: int
    prompt: np.ndarray  # (P,) int64 token ids
    sampling: Sampling
    rng: np.random.Generator
    state: np.ndarray  # 0-d grammar state
    prefilled: int = 0
    output: list[int] = field(default_factory=list)
    min_margin: float = float("inf")
    start: float = 0.0
    first_token_at: float = 0.0
    step_logits: list[np.ndarray] | None = None  # kept only for Request.keep_logits
    step_candidates: list[np.ndarray] | None = None
    cached: int = 0  # prompt tokens the KV pool shared or copied at admission


class Generator:
    """Runs requests to completion on a model (CpuModel interface) over a paged KV pool."""

    def __init__(self, model, kv, grammar: Grammar, *, max_input_tokens: int, max_output_tokens: int,
                 max_tokens_per_step: int, prefill_chunk: int, head: str = "sparse"):
        assert head in HEAD_MODES
        self.model, self.kv, self.grammar, self.head = model, kv, grammar, head
        self.stepper = GrammarStepper(grammar)
        self.max_input_tokens, self.max_output_tokens = max_input_tokens, max_output_tokens
        self.max_tokens_per_step, self.prefill_chunk = max_tokens_per_step, prefill_chunk

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
        if request.sampling.temperature < 0 or not 0 < request.sampling.top_p <= 1:
            raise RequestError("request_invalid", "sampling needs temperature >= 0 and 0 < top_p <= 1",
                               temperature=request.sampling.temperature, top_p=request.sampling.top_p)

    def generate(self, requests: list[Request], queue: bool = True) -> list[Result | RequestError]:
        """Every request's Result, or the RequestError that refused it (others are unaffected).

        ``queue``: a request that does not fit now (slots or KV pages busy) waits for a
        sequence to finish; without it, it is refused with ``too_many_sequences``/``kv_pages``.
        """
        results: list[Result | RequestError | None] = [None] * len(requests)
        pending: list[int] = []
        for i, req in enumerate(requests):
            try:
                self.validate(req)
                self.kv.check_fits(len(req.prompt_ids) + self.max_output_tokens, req.prompt_ids)
                pending.append(i)
            except RequestError as e:
                results[i] = e
        active: list[_Sequence] = []
        try:
            while pending or active:
                pending = self._admit(requests, pending, active, results, queue)
                if active:
                    self._step(active)
                for seq in [s for s in active if self._finished(s)]:
                    active.remove(seq)
                    self.kv.release(seq.slot)
                    results[seq.index] = self._result(seq)
        finally:
            for seq in active:  # an exception mid-loop must not leak pages (nor cache half-written ones)
                self.kv.release(seq.slot, cache=False)
        return results  # type: ignore[return-value]

    def _admit(self, requests, pending, active, results, queue) -> list[int]:
        waiting = []
        for i in pending:
            req = requests[i]
            try:
                slot = self.kv.admit(len(req.prompt_ids) + self.max_output_tokens, req.prompt_ids)
            except RequestError as e:
                if queue and e.code in ("too_many_sequences", "kv_pages"):
                    waiting.append(i)
                    continue
                results[i] = e
                continue
            active.append(_Sequence(i, slot, np.asarray(req.prompt_ids, np.int64), req.sampling,
                                    np.random.default_rng(req.sampling.seed), self.stepper.initial_state(),
                                    start=time.perf_counter(), step_logits=[] if req.keep_logits else None,
                                    step_candidates=[] if req.keep_logits else None,
                                    prefilled=int(self.kv.cached_tokens[slot]),  # shared/copied prefix
                                    cached=int(self.kv.cached_tokens[slot])))
        return waiting

    def _finished(self, seq: _Sequence) -> bool:
        return self.stepper.done(seq.state) or len(seq.output) >= self.max_output_tokens

    def _step(self, active: list[_Sequence]) -> None:
        tokens, slots, positions, samplers = [], [], [], []  # samplers: (sequence, row) pairs picking a token
        for seq in active:
            if seq.prefilled == len(seq.prompt):
                tokens.append(seq.output[-1])
                slots.append(seq.slot)
                positions.append(len(seq.prompt) + len(seq.output) - 1)
                samplers.append((seq, len(tokens) - 1))
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
        hidden = self.model.forward(np.asarray(tokens, np.int64), np.asarray(slots, np.int64),
                                    np.asarray(positions, np.int64), self.kv)
        if samplers:
            self._pick([s for s, _ in samplers], hidden[[r for _, r in samplers]])

    def _pick(self, seqs: list[_Sequence], hidden: np.ndarray) -> None:
        states = np.stack([s.state for s in seqs])
        cand, _, allowed = self.stepper.allowed_mask_batch(states)  # (B, M) token ids, -1 padded
        safe = np.maximum(cand, 0)
        if self.head == "dense":
            logits = np.take_along_axis(self.model.dense_logits(hidden), safe, axis=1)
        else:
            logits = self.model.sparse_logits(hidden, safe)
        gaps = margins(logits, allowed)
        now = time.perf_counter()
        picks = [sample_row(logits[b], allowed[b], s.sampling, s.rng) for b, s in enumerate(seqs)]
        if self.head == "check":
            dense = np.take_along_axis(self.model.dense_logits(hidden), safe, axis=1)
            dense_picks = [sample_row(dense[b], allowed[b], s.sampling, np.random.default_rng(0))
                           if s.sampling.temperature <= 0 else picks[b] for b, s in enumerate(seqs)]
            if picks != dense_picks:
                raise EngineError("internal", f"sparse and dense heads disagree: {picks} vs {dense_picks}",
                                  sparse=[int(cand[b, p]) for b, p in enumerate(picks)],
                                  dense=[int(cand[b, p]) for b, p in enumerate(dense_picks)])
        for b, seq in enumerate(seqs):
            token = int(cand[b, picks[b]])
            seq.state = self.stepper.advance(seq.state, token)
            seq.output.append(token)
            seq.min_margin = min(seq.min_margin, float(gaps[b]))
            if seq.step_logits is not None:
                seq.step_logits.append(logits[b].copy())
                seq.step_candidates.append(cand[b].copy())
            if len(seq.output) == 1:
                seq.first_token_at = now

    def _result(self, seq: _Sequence) -> Result:
        done = self.stepper.done(seq.state)
        tools = decode_tools(self.grammar, seq.output, require_done=False)
        return Result(list(seq.output), tools, "done" if done else "length", seq.min_margin,
                      seq.first_token_at - seq.start, time.perf_counter() - seq.start,
                      seq.step_logits, seq.step_candidates, seq.prompt.tolist(), seq.cached)
