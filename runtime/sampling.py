"""Choosing the next token among a row's allowed candidates: greedy, or seeded temperature/top-p."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy; otherwise softmax(logits/temperature) cut to top_p, drawn with ``seed``."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


def greedy(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """(B,) index of the best allowed candidate per row; ties go to the first (lowest token id)."""
    masked = np.where(allowed, logits, -np.inf)
    return np.argmax(masked, axis=1)


def margins(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """(B,) top-1 minus top-2 allowed logit (inf where only one candidate is allowed)."""
    masked = np.sort(np.where(allowed, logits, -np.inf), axis=1)
    gap = masked[:, -1] - masked[:, -2] if masked.shape[1] > 1 else np.full(len(masked), np.inf)
    return np.where(np.isfinite(gap), gap, np.inf)


def sample_row(logits: np.ndarray, allowed: np.ndarray, params: Sampling, rng: np.random.Generator) -> int:
    """Index into the row's candidates; the rng is the sequence's own, so the batch never matters."""
    if params.temperature <= 0.0:
        return int(greedy(logits[None], allowed[None])[0])
    idx = np.flatnonzero(allowed)
    z = logits[idx].astype(np.float64) / params.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")  # most likely first; ties keep token order
    keep = np.cumsum(p[order]) - p[order] < params.top_p  # the smallest prefix reaching top_p
    order = order[keep]
    q = p[order] / p[order].sum()
    return int(idx[order[min(np.searchsorted(np.cumsum(q), rng.random(), side="right"), len(q) - 1)]])
