"""Choosing the next token among a row's allowed candidates: greedy, or seeded temperature/top-p."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np
from numba import njit

from toolcall.runtime import numba_target  # noqa: F401  (the one compile target: runtime/numba_target.py)


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
    return int(sample_rows(logits[None], allowed[None], [params], [rng])[0])


def sample_rows(logits: np.ndarray, allowed: np.ndarray, params: list[Sampling], rngs: list) -> np.ndarray:
    """(B,) indices into each sampled row's candidates (every ``params`` with temperature > 0): one
    ``draw_rows`` call, one draw from each row's own rng."""
    temperature = np.array([q.temperature for q in params], np.float64)
    top_p = np.array([q.top_p for q in params], np.float64)
    u = np.array([rng.random() for rng in rngs], np.float64)
    return draw_rows(np.ascontiguousarray(logits, np.float32), np.ascontiguousarray(allowed), temperature, top_p, u)


@njit(cache=True, nogil=True)
def draw_rows(logits, allowed, temperature, top_p, u):  # pragma: no cover - compiled
    """(B,) the temperature/top-p draw per row: softmax(logits / temperature) over the row's allowed
    candidates, cut to the smallest most-likely-first prefix reaching top_p (ties in token order),
    drawn with the row's uniform ``u`` in [0, 1). One candidate: that one (its draw still taken by the
    caller). logits (B, K) float32, allowed (B, K) bool, temperature/top_p/u (B,) float64. A row reads
    only its allowed entries, in order, so its pick never depends on the batch's other rows or width;
    -1 for a row with nothing allowed (never the grammar's case)."""
    rows, width = logits.shape
    out = np.full(rows, -1, np.int64)
    idx = np.empty(width, np.int64)  # the allowed columns, in token order
    p = np.empty(width, np.float64)
    order = np.empty(width, np.int64)  # positions into idx, most likely first
    for b in range(rows):
        n = 0
        for k in range(width):
            if allowed[b, k]:
                idx[n] = k
                n += 1
        if n <= 1:
            if n == 1:
                out[b] = idx[0]
            continue
        top = -np.inf
        for i in range(n):
            p[i] = np.float64(logits[b, idx[i]]) / temperature[b]
            top = max(top, p[i])
        total = 0.0
        for i in range(n):
            p[i] = np.exp(p[i] - top)
            total += p[i]
        for i in range(n):
            p[i] /= total
            order[i] = i
        for i in range(1, n):  # stable insertion sort, descending p (n is a few dozen at most)
            x, j = order[i], i
            while j > 0 and p[order[j - 1]] < p[x]:
                order[j] = order[j - 1]
                j -= 1
            order[j] = x
        kept, before = 0, 0.0  # the prefix whose mass before each member is below top_p
        while kept < n and before < top_p[b]:
            before += p[order[kept]]
            kept += 1
        threshold, running, pick = u[b] * before, 0.0, kept - 1
        for i in range(kept):
            running += p[order[i]]
            if running > threshold:
                pick = i
                break
        out[b] = idx[order[pick]]
    return out
