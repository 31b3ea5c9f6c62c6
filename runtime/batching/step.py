"""One engine step across the backend boundary: the plan the step batcher lays out (``StepPlan``, with the
per-row controls of its sampled rows in ``PickRows``) and what the backend gives back for those rows
(``StepRecord``: each row's emitted tokens and grammar state).

A backend whose forward returns hidden rows to the host picks with ``HostPicker`` (runtime/batching/
picks.py); one that keeps the grammar and sampling on the device fills the same record there.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolcall.runtime.batching.sampling import Sampling


@dataclass
class PickRows:
    """The sampled rows of a step (B of them, in row order) and what their picks need. Rows answer under the
    bundle's grammar unless ``steppers`` names each row's own (a request that brought its tools)."""

    states: np.ndarray | list  # (B,) grammar states: one structured array (runtime/grammar/stepper.py
    # state_dtype) when every row has the bundle's grammar, else a list of each row's 0-d record
    sampling: list[Sampling]
    answer_index: list[int]  # each row's pick is its answer's token of this index (a sampled row's draw counter)
    room: list[int]  # output tokens each row may still emit (its answer's limit minus those emitted)
    keep_logits: list[bool]  # a row that keeps its logits takes one token a step (no forced run)
    max_tools: np.ndarray  # (B,) int64: the most tools each row's answer may name
    allow_empty: np.ndarray  # (B,) bool: the empty answer allowed
    steppers: list | None = None  # (B,) each row's GrammarStepper; None: every row the bundle's

    def __len__(self) -> int:
        return len(self.sampling)

    def groups(self, default) -> list[tuple[object, np.ndarray, np.ndarray]]:
        """(stepper, row indices (G,) int64, their states (G,) structured) per grammar, ``default`` (the bundle's
        GrammarStepper) for rows without their own; one group holding every row when all share one."""
        if self.steppers is None:
            return [(default, np.arange(len(self)), self.states)]
        rows: dict[int, list[int]] = {}
        for b, stepper in enumerate(self.steppers):
            rows.setdefault(id(stepper), []).append(b)
        out = []
        for index in rows.values():
            stepper = self.steppers[index[0]]
            states = np.empty(len(index), stepper.dtype)
            for j, b in enumerate(index):
                states[j] = self.states[b]
            out.append((stepper, np.asarray(index, np.int64), states))
        return out


@dataclass
class StepPlan:
    """One step's rows, laid out before the forward runs: tokens, slots and positions (T,) int64, the rows
    whose hidden state is sampled ``outputs`` (R,) with their controls ``picks``, and the bookkeeping the
    batcher lands afterwards (``refused`` requests, the ``running`` sequences, ``samplers``: the sequences
    of the sampled rows in row order, ``prefilled``: prompts complete once the forward ran). The answering
    sequences' rows come first (``answer_rows`` of them), then the prompt chunks."""

    refused: list
    running: list
    tokens: np.ndarray
    slots: np.ndarray
    positions: np.ndarray
    samplers: list
    outputs: np.ndarray
    prefilled: list
    picks: PickRows
    answer_rows: int


@dataclass
class StepRecord:
    """Each sampled row's outcome (B rows, the plan's ``picks`` order): its new grammar ``states`` (B,; laid out
    as ``PickRows.states``) and ``done`` flags, the ``tokens`` it emitted (the pick, then any the grammar forced),
    the tool indices it ``closed``, the ``margins`` (top-1 minus top-2 allowed logit), and for rows that keep
    their logits the head's float32 ``logits`` over the step's ``candidates`` (token ids, -1 padded); ``picked_at``:
    perf_counter time of the picks."""

    states: np.ndarray | list
    done: list[bool]
    tokens: list[list[int]]
    closed: list[list[int]]
    margins: list[float]
    logits: list[np.ndarray | None]
    candidates: list[np.ndarray | None]
    picked_at: float
