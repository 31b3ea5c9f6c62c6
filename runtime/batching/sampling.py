"""Choosing the next token among a row's allowed candidates: greedy, or seeded temperature/top-p.

A sampled pick is a pure function of the row's logits over its candidates, its options and (seed, the
answer token's index): the uniform comes from the counter-based generator (runtime/batching/philox.py) and
the probabilities are float32 in one fixed order (``draw_rows``), so a row's answer never depends on its
batch, and a device doing the same operations draws the same tokens."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np
from numba import njit

from toolcall.common import numba_target  # noqa: F401  (the one compile target: common/numba_target.py)
from toolcall.runtime.batching.philox import uniform
from toolcall.runtime.jit.exp32 import exp32


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy; otherwise softmax(logits/temperature) cut to top_p, drawn with ``seed`` (the key
    of runtime/batching/philox.py)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


MAX_TEMPERATURE = 1e4


def sampling_problem(temperature: float, top_p: float, seed: int) -> tuple[str, str] | None:
    """(the field, why) these sampling options cannot be used, or None. A temperature that is NaN, infinite
    or subnormal is refused: logits / a subnormal temperature overflow to inf, and inf - inf is NaN.
    Any top_p in (0, 1] is honoured, however small: the draw narrows it to float32 (1e-300 becomes 0)
    and always keeps the most likely candidate, so a tiny top_p draws as greedy does (``draw_rows``).
    The seed keys the generator as a uint64 (runtime/batching/philox.py): [0, 2^63) is what every edge
    (CLI, HTTP, the batcher) accepts."""
    if not (temperature == 0.0 or (math.isfinite(temperature) and sys.float_info.min <= temperature
                                   <= MAX_TEMPERATURE)):
        return "temperature", (f"temperature {temperature!r}: expected 0 (greedy) or a normal number in "
                               f"[{sys.float_info.min:.3g}, {MAX_TEMPERATURE:g}]")
    if not 0.0 < top_p <= 1.0:  # NaN fails both comparisons
        return "top_p", f"top_p {top_p!r}: expected a number in (0, 1]"
    if not 0 <= seed < 2**63:
        return "seed", f"seed {seed}: expected an integer in [0, 2^63)"
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


F32_MAX = np.float32(np.finfo(np.float32).max)


def inverse_temperature(temperature: float) -> np.float32:
    """1 / temperature as the draw's float32 multiplier, held at the largest finite float32 (a temperature under
    ~3e-39: the draw is then greedy but for exact ties, and no 0 * inf appears)."""
    return np.float32(min(1.0 / temperature, float(F32_MAX)))


def sample_row(logits: np.ndarray, allowed: np.ndarray, params: Sampling, token: int) -> int:
    """Index into the row's candidates for answer token ``token`` (its index in the answer)."""
    if params.temperature <= 0.0:
        return int(greedy(logits[None], allowed[None])[0])
    return int(sample_rows(logits[None], allowed[None], [params], [token])[0])


def sample_rows(logits: np.ndarray, allowed: np.ndarray, params: list[Sampling], tokens: list[int]) -> np.ndarray:
    """(B,) indices into each sampled row's candidates (every ``params`` with temperature > 0), each drawn for
    its answer token ``tokens[b]`` (the index in its answer): one ``draw_rows`` call."""
    inv_temperature = np.array([inverse_temperature(q.temperature) for q in params], np.float32)
    top_p = np.array([q.top_p for q in params], np.float32)
    seeds = np.array([q.seed for q in params], np.uint64)
    return draw_rows(np.ascontiguousarray(logits, np.float32), np.ascontiguousarray(allowed), inv_temperature,
                     top_p, seeds, np.asarray(tokens, np.int64))


@njit(cache=True, nogil=True)
def draw_rows(logits, allowed, inv_temperature, top_p, seeds, tokens):  # pragma: no cover - compiled
    """(B,) the temperature/top-p draw per row, in float32 and one fixed order (the algorithm a GPU repeats op
    for op):
      over the row's allowed candidates i in token order: e_i = exp32((logit_i - max) * inv_temperature),
      total = e_0 + e_1 + ... in that order;
      the kept prefix: most likely first (a stable sort: ties in token order), the first member always, then
      taken while the mass before the next member is below top_p * total; ``before`` its mass (a top_p that
      is 0 in float32, e.g. 1e-300 narrowed, keeps the first member only: greedy over e);
      u = philox.uniform(seed, 0, token); the pick: the first kept member whose running mass exceeds
      u * before (the last kept one if rounding leaves none).
    One candidate: that one, without a draw. logits (B, K) float32, allowed (B, K) bool, inv_temperature and
    top_p (B,) float32 (inv_temperature above the largest float32 counts as it), seeds (B,) uint64, tokens
    (B,) int64. A row reads only its allowed entries, in order, so its pick never depends on the batch's other
    rows or width. -1: a row with nothing allowed (never the grammar's case), or refused: one of its allowed
    logits is NaN or infinite (no arithmetic on it, no index from it; the engine refuses such a step,
    numerics_invalid). kernels/sample_draw.cu and kernels/reference_draw.py do the same, bit for bit."""
    rows, width = logits.shape
    out = np.full(rows, -1, np.int64)
    idx = np.empty(width, np.int64)  # the allowed columns, in token order
    e = np.empty(width, np.float32)
    order = np.empty(width, np.int64)  # positions into idx, most likely first
    for b in range(rows):
        n = 0
        finite = True
        top = np.float32(-np.inf)
        for k in range(width):
            if allowed[b, k]:
                idx[n] = k
                n += 1
                if not np.isfinite(logits[b, k]):
                    finite = False
                elif logits[b, k] > top:
                    top = logits[b, k]
        if n == 0 or not finite:  # nothing allowed, or refused: out[b] stays -1
            continue
        if n == 1:
            out[b] = idx[0]
            continue
        scale = min(inv_temperature[b], F32_MAX)
        total = np.float32(0.0)
        for i in range(n):
            e[i] = exp32((logits[b, idx[i]] - top) * scale)
            total += e[i]
            order[i] = i
        for i in range(1, n):  # stable insertion sort, descending e (n is a few dozen at most)
            x, j = order[i], i
            while j > 0 and e[order[j - 1]] < e[x]:
                order[j] = order[j - 1]
                j -= 1
            order[j] = x
        limit = top_p[b] * total
        kept, before = 1, e[order[0]]  # the most likely always: 0 + e is e, so any limit > 0 draws as before
        while kept < n and before < limit:
            before += e[order[kept]]
            kept += 1
        threshold = uniform(seeds[b], 0, tokens[b]) * before
        running, pick = np.float32(0.0), kept - 1
        for i in range(kept):
            running += e[order[i]]
            if running > threshold:
                pick = i
                break
        out[b] = idx[order[pick]]
    return out
