"""The picks of a step's sampled rows on the host, for backends whose forward returns hidden rows.

For each row: its grammar state's allowed candidates (runtime/grammar/stepper.py), the head's logits
over them (sparse: those rows of the head only; dense: every row, then gathered; check: sparse picks,
dense must agree), a finite-numbers check, the greedy or sampled pick (runtime/batching/sampling.py),
then the grammar edge taken and the run of tokens the grammar forces after it (name chains, single
allowed edges), up to the row's room. A sampled row's draw is keyed by its pick's index in the answer
(runtime/batching/philox.py): forced tokens take none. A row keeping its logits takes only its pick (a step,
and its logits, a token).
"""
from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from toolcall.common.errors import EngineError
from toolcall.runtime.batching.sampling import greedy, margins, sample_rows
from toolcall.runtime.batching.step import PickRows, StepPlan, StepRecord
from toolcall.runtime.grammar.stepper import GrammarStepper

HEAD_MODES = ("sparse", "dense", "check")  # check: sparse picks, dense must agree


class Heads(Protocol):
    """The head over hidden rows (B, hidden) float32: every vocabulary row, or the given candidates."""

    def dense_logits(self, hidden: np.ndarray) -> np.ndarray: ...

    def sparse_logits(self, hidden: np.ndarray, candidates: np.ndarray) -> np.ndarray: ...


class HostPicker:
    """Picks for the sampled rows of a step from their hidden states, with one head mode."""

    def __init__(self, stepper: GrammarStepper, head: str = "sparse"):
        if head not in HEAD_MODES:
            raise ValueError(f"head mode {head!r}: expected one of {', '.join(HEAD_MODES)}")
        self.stepper, self.head = stepper, head

    def pick(self, rows: PickRows, hidden: np.ndarray, heads: Heads) -> StepRecord:
        """The record of rows (B,) from their normed hidden states (B, hidden) float32; EngineError
        ("numerics_invalid") on NaN or Inf, ("internal") where check mode's heads disagree."""
        if len(rows) == 0:  # a step of prefill chunks that complete no prompt
            return StepRecord(rows.states, [], [], [], [], [], [], time.perf_counter())
        groups = rows.groups(self.stepper)
        cand, edges, allowed = self._allowed(rows, groups)  # (B, M) token ids / edge ids, -1 padded
        safe = np.maximum(cand, 0)
        if self.head == "dense":
            logits = np.take_along_axis(heads.dense_logits(hidden), safe, axis=1)
        else:
            logits = heads.sparse_logits(hidden, safe)
        if not (np.isfinite(hidden).all() and np.isfinite(logits[allowed]).all()):  # never a silent argmax
            raise EngineError("numerics_invalid", "NaN or Inf in the hidden states or logits of this step; the "
                              "weights or the backend are broken: do not serve from this engine",
                              nonfinite_hidden=int((~np.isfinite(hidden)).sum()),
                              nonfinite_logits=int((~np.isfinite(logits[allowed])).sum()))
        gaps = margins(logits, allowed).tolist()
        now = time.perf_counter()
        picks = greedy(logits, allowed)  # (B,) the greedy rows' picks, one vectorized argmax
        drawn = [b for b, s in enumerate(rows.sampling) if s.temperature > 0]
        if drawn:  # the sampled rows in one compiled call, each drawing for its pick's index in its answer
            picks[drawn] = sample_rows(logits[drawn], allowed[drawn], [rows.sampling[b] for b in drawn],
                                       [rows.answer_index[b] for b in drawn])
        picks = picks.tolist()
        if self.head == "check":
            self._check_dense(rows, hidden, heads, cand, safe, allowed, picks)
        index = np.arange(len(rows))
        assert allowed[index, picks].all(), "a pick outside the allowed candidates"
        record = self._advance(rows, groups, edges[index, picks], gaps, now)
        for b, keep in enumerate(rows.keep_logits):
            if keep:
                record.logits[b], record.candidates[b] = logits[b].copy(), cand[b].copy()
        return record

    @staticmethod
    def _allowed(rows: PickRows, groups) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidates, edges and the allowed mask (B, M) of every row, each group by its own grammar; M: the
        widest group's columns (narrower groups padded with -1 and not allowed)."""
        if len(groups) == 1:
            stepper, _, states = groups[0]
            return stepper.allowed_mask_batch(states, None, rows.max_tools, rows.allow_empty)
        parts = [(index, stepper.allowed_mask_batch(states, None, rows.max_tools[index], rows.allow_empty[index]))
                 for stepper, index, states in groups]
        width = max(tokens.shape[1] for _, (tokens, _, _) in parts)
        cand, edges = np.full((len(rows), width), -1, np.int32), np.full((len(rows), width), -1, np.int32)
        allowed = np.zeros((len(rows), width), np.bool_)
        for index, (tokens, edge, mask) in parts:
            m = tokens.shape[1]
            cand[index, :m], edges[index, :m], allowed[index, :m] = tokens, edge, mask
        return cand, edges, allowed

    def _check_dense(self, rows: PickRows, hidden, heads: Heads, cand, safe, allowed, picks: list[int]) -> None:
        dense = np.take_along_axis(heads.dense_logits(hidden), safe, axis=1)
        greedy_picks = greedy(dense, allowed).tolist()
        dense_picks = [greedy_picks[b] if s.temperature <= 0 else picks[b] for b, s in enumerate(rows.sampling)]
        if picks != dense_picks:
            raise EngineError("internal", f"sparse and dense heads disagree: {picks} vs {dense_picks}",
                              sparse=[int(cand[b, p]) for b, p in enumerate(picks)],
                              dense=[int(cand[b, p]) for b, p in enumerate(dense_picks)])

    def _advance(self, rows: PickRows, groups, taken: np.ndarray, gaps: list[float], now: float) -> StepRecord:
        force = np.array([not keep for keep in rows.keep_logits], np.bool_)
        room = np.asarray(rows.room, np.int64)
        if len(groups) == 1:
            states, done, emitted, tools = _take(groups[0][0], groups[0][2], taken, room, force, rows.max_tools,
                                                 rows.allow_empty)
        else:  # each grammar's rows apart, scattered back to row order
            states, done, emitted, tools = ([None] * len(rows) for _ in range(4))
            for stepper, index, group_states in groups:
                parts = _take(stepper, group_states, taken[index], room[index], force[index], rows.max_tools[index],
                              rows.allow_empty[index])
                for out, part in zip((states, done, emitted, tools), parts):
                    for j, b in enumerate(index.tolist()):
                        out[b] = part[j]
        blank = [None] * len(rows)
        return StepRecord(states, done, emitted, tools, gaps, list(blank), list(blank), now)


def _take(stepper: GrammarStepper, states: np.ndarray, taken, room, force, max_tools, allow_empty):
    """One grammar's rows take their edges and forced runs: (new states, done flags, emitted tokens and closed
    tools per row)."""
    new, tokens, n_tokens, closed, n_closed = stepper.take_and_force(states, taken, room, force, max_tools,
                                                                     allow_empty)
    emitted = [row[:n] for row, n in zip(tokens.tolist(), n_tokens.tolist())]
    tools = [row[:n] for row, n in zip(closed.tolist(), n_closed.tolist())]
    return new, stepper.done_batch(new).tolist(), emitted, tools


class HostStep:
    """Backend mixin (runtime/backends.py): the step's sampled rows' hidden states come back to the host,
    where ``HostPicker`` picks. A backend that lays a step out apart from computing it overrides
    ``step_call`` (runtime/cpu/fast_model.py)."""

    def step(self, plan: StepPlan, kv, picker: HostPicker) -> StepRecord:
        hidden = self.forward(plan.tokens, plan.slots, plan.positions, kv, outputs=plan.outputs)
        return picker.pick(plan.picks, hidden, self)

    def step_call(self, plan: StepPlan, kv):
        return lambda: self.forward(plan.tokens, plan.slots, plan.positions, kv, outputs=plan.outputs)

    def step_record(self, plan: StepPlan, computed: np.ndarray, picker: HostPicker) -> StepRecord:
        return picker.pick(plan.picks, computed, self)  # computed: the sampled rows' hidden states
