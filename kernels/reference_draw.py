"""numpy reference of kernels/sample_draw.cu, the sampled pick: Philox4x32-10, exp32 and the float32 top-p draw,
operation for operation as the kernel and the CPU draw (runtime/batching/sampling.py ``draw_rows``) do them.
Every float32 operation here is a numpy float32 operation (correctly rounded, no contraction)."""
from __future__ import annotations

import numpy as np

from toolcall.kernels.declarations import DRAW_MAX_CANDIDATES

F32 = np.float32
F32_MAX = F32(np.finfo(F32).max)  # an inverse temperature above it (inf) counts as it
ROUNDS = 10
MULTIPLIERS = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
KEY_STEP = np.array([0x9E3779B9, 0xBB67AE85], np.uint64)
MASK32 = np.uint64(0xFFFFFFFF)
# runtime/jit/exp32.py's constants
EXP_LOW, EXP_HIGH, LOG2E = F32(-87.3), F32(88.3), F32(1.4426950408889634)
LN2_HI, LN2_LO = F32(0.693359375), F32(-2.12194440e-4)
TAYLOR = tuple(F32(c) for c in (1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0))


def philox4x32(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10: counter (N, 4) and key (N, 2) uint32 -> (N, 4) uint32."""
    c, k = counter.astype(np.uint64), key.astype(np.uint64)
    m0, m1 = MULTIPLIERS
    for r in range(ROUNDS):
        if r:
            k = (k + KEY_STEP) & MASK32
        p0, p1 = m0 * c[:, 0], m1 * c[:, 2]
        c = np.stack([(p1 >> np.uint64(32)) ^ c[:, 1] ^ k[:, 0], p1 & MASK32,
                      (p0 >> np.uint64(32)) ^ c[:, 3] ^ k[:, 1], p0 & MASK32], axis=1)
    return c.astype(np.uint32)


def uniform(seeds: np.ndarray, tokens: np.ndarray, choice: int = 0) -> np.ndarray:
    """(N,) float32 in [0, 1): the top 24 bits of the first word of counter (token, choice, 0, 0) under key
    (seed lo, seed hi), times 2^-24."""
    seeds = np.asarray(seeds).astype(np.uint64)
    counter = np.zeros((len(seeds), 4), np.uint32)
    counter[:, 0], counter[:, 1] = np.asarray(tokens), choice
    key = np.stack([seeds & MASK32, seeds >> np.uint64(32)], axis=1).astype(np.uint32)
    return (philox4x32(counter, key)[:, 0] >> 8).astype(F32) * F32(2.0 ** -24)


def exp32(x: np.ndarray) -> np.ndarray:
    """runtime/jit/exp32.py's exp32 in numpy float32."""
    x = np.clip(np.asarray(x, F32), EXP_LOW, EXP_HIGH)
    n = np.floor(x * LOG2E + F32(0.5))
    r = (x - n * LN2_HI) - n * LN2_LO
    p = F32(1.0 / 720)
    for c in TAYLOR:
        p = p * r + c
    return p * ((n.astype(np.int32) + 127) << 23).view(F32)


def sample_draw(logits: np.ndarray, valid: np.ndarray, inv_temperature: np.ndarray, top_p: np.ndarray,
                seed: np.ndarray, token: np.ndarray) -> np.ndarray:
    """int32 [B]: each row's picked column, as sample_draw.cu's header states: -1 for a greedy row
    (inv_temperature <= 0 or NaN), a row with nothing allowed, a row refused (an allowed logit NaN or infinite,
    or a row wider than DRAW_MAX_CANDIDATES); the first kept member is always the most likely, so a top_p of 0
    (a tiny one narrowed to float32) draws greedily. logits float32 [B, width], valid [B, width] (non-zero:
    allowed), the rest [B]."""
    out = np.full(len(logits), -1, np.int32)
    u = uniform(seed, token)
    for b in range(len(logits)):
        if not inv_temperature[b] > 0 or logits.shape[1] > DRAW_MAX_CANDIDATES:
            continue
        columns = np.flatnonzero(valid[b])
        if len(columns) == 0 or not np.isfinite(logits[b, columns]).all():
            continue
        if len(columns) == 1:
            out[b] = columns[0]
            continue
        z = logits[b, columns].astype(F32)
        scale = min(F32(inv_temperature[b]), F32_MAX)
        with np.errstate(over="ignore"):  # (z - max) * a huge inverse temperature: -inf, which exp32 clamps
            e = exp32((z - z.max()) * scale)
        total = F32(0)
        for v in e:  # in column order
            total += v
        order = np.argsort(-e, kind="stable")
        limit, before, kept = F32(top_p[b]) * total, e[order[0]], 1  # the most likely always kept
        while kept < len(e) and before < limit:
            before += e[order[kept]]
            kept += 1
        threshold, running, pick = u[b] * before, F32(0), kept - 1
        for i in range(kept):
            running += e[order[i]]
            if running > threshold:
                pick = i
                break
        out[b] = columns[order[pick]]
    return out
