"""Choosing the next token among a row's allowed candidates: greedy, or seeded temperature/top-p."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy; otherwise softmax(logits/temperature) cut to top_p, drawn with ``seed``."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


MAX_TEMPERATURE = 1e4


def sampling_problem(temperature: float, top_p: float, seed: int) -> str | None:
    """Why these sampling options cannot be used, or None. NaN, infinities and subnormals are
    refused: logits / a subnormal temperature overflow to inf, and inf - inf is NaN."""
    if not (temperature == 0.0 or (math.isfinite(temperature) and sys.float_info.min <= temperature
                                   <= MAX_TEMPERATURE)):
        return (f"temperature {temperature!r}: expected 0 (greedy) or a normal number in "
                f"[{sys.float_info.min:.3g}, {MAX_TEMPERATURE:g}]")
    if not (math.isfinite(top_p) and sys.float_info.min <= top_p <= 1.0):
        return f"top_p {top_p!r}: expected a normal number in (0, 1]"
    if not 0 <= seed < 2**63:
        return f"seed {seed}: expected an integer in [0, 2^63)"
    return None


def greedy(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """(B,) index of the best allowed candidate per row; ties go to the first (lowest token id)."""
    masked = np.where(allowed, logits, -np.inf)
    return np.argmax(masked, axis=1)


def margins(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """(B,) top-1 minus top-2 allowed logit (inf where only one candidate is allowed)."""
    masked = np.where(allowed, logits, -np.inf)
    if masked.shape[1] < 2:
        return np.full(len(masked), np.inf)
    top2 = np.partition(masked, masked.shape[1] - 2, axis=1)[:, -2:]  # (B, 2): second best, best
    gap = top2[:, 1] - top2[:, 0]
    return np.where(np.isfinite(gap), gap, np.inf)


def sample_row(logits: np.ndarray, allowed: np.ndarray, params: Sampling, rng: np.random.Generator) -> int:
    """Index into the row's candidates; the rng is the sequence's own, so the batch never matters."""
    if params.temperature <= 0.0:
        return int(greedy(logits[None], allowed[None])[0])
    idx = np.flatnonzero(allowed)
    if len(idx) == 1:  # a forced token (inside a tool name): what _draw gives, its one draw still taken
        rng.random()
        return int(idx[0])
    return _draw(logits, idx, params, rng)


def _draw(logits: np.ndarray, idx: np.ndarray, params: Sampling, rng: np.random.Generator) -> int:
    """The temperature/top-p draw among the candidates ``idx`` (one ``rng.random()``)."""
    z = logits[idx].astype(np.float64) / params.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")  # most likely first; ties keep token order
    keep = np.cumsum(p[order]) - p[order] < params.top_p  # the smallest prefix reaching top_p
    order = order[keep]
    q = p[order] / p[order].sum()
    return int(idx[order[min(np.searchsorted(np.cumsum(q), rng.random(), side="right"), len(q) - 1)]])
