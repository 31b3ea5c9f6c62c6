"""The sampled pick: Philox4x32-10 against its published known answers, and the compiled float32 draw
against a numpy reference of the same algorithm (runtime/batching/philox.py, sampling.py ``draw_rows``)."""
from __future__ import annotations

import numpy as np
import pytest

from toolcall.runtime.batching import sampling
from toolcall.runtime.batching.sampling import Sampling, draw_rows, inverse_temperature

# Random123's kat_vectors, "philox4x32 10": counter (4 words), key (2 words), output (4 words)
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox_reference(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10 in numpy: counter (N, 4) and key (N, 2) uint32 -> (N, 4) uint32."""
    c = counter.astype(np.uint64)
    k = key.astype(np.uint64)
    m0, m1, mask = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57), np.uint64(0xFFFFFFFF)
    for r in range(10):
        if r:
            k = (k + np.array([0x9E3779B9, 0xBB67AE85], np.uint64)) & mask
        p0, p1 = m0 * c[:, 0], m1 * c[:, 2]
        c = np.stack([(p1 >> np.uint64(32)) ^ c[:, 1] ^ k[:, 0], p1 & mask,
                      (p0 >> np.uint64(32)) ^ c[:, 3] ^ k[:, 1], p0 & mask], axis=1)
    return c.astype(np.uint32)


def uniform_reference(seeds: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """(N,) float32: the top 24 bits of the first word of counter (token, 0, 0, 0) under key (seed lo, seed hi)."""
    seeds = seeds.astype(np.uint64)
    counter = np.zeros((len(seeds), 4), np.uint32)
    counter[:, 0] = tokens
    key = np.stack([seeds & np.uint64(0xFFFFFFFF), seeds >> np.uint64(32)], axis=1).astype(np.uint32)
    return (philox_reference(counter, key)[:, 0] >> 8).astype(np.float32) * np.float32(2.0 ** -24)


def exp32_reference(x: np.ndarray) -> np.ndarray:
    """runtime/exp32.py's exp32, operation for operation in numpy float32."""
    f = np.float32
    x = np.clip(x.astype(f), f(-87.3), f(88.3))
    n = np.floor(x * f(1.4426950408889634) + f(0.5))
    r = (x - n * f(0.693359375)) - n * f(-2.12194440e-4)
    p = f(1.0 / 720)
    for c in (1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0):
        p = p * r + f(c)
    return p * ((n.astype(np.int32) + 127) << 23).view(f)


def draw_reference(logits, allowed, params: Sampling, token: int) -> int:
    """sampling.draw_rows's documented algorithm for one row, in numpy float32."""
    idx = np.flatnonzero(allowed)
    if len(idx) == 1:
        return int(idx[0])
    z = logits[idx]
    with np.errstate(over="ignore"):  # a tiny temperature: (z - max) * 3.4e38 is -inf, which exp32 clamps
        e = exp32_reference((z - z.max()) * inverse_temperature(params.temperature))
    total = np.float32(0)
    for v in e:  # in token order
        total += v
    order = np.argsort(-e, kind="stable")
    limit, before, kept = np.float32(params.top_p) * total, np.float32(0), 0
    while kept < len(e) and before < limit:
        before += e[order[kept]]
        kept += 1
    threshold = uniform_reference(np.array([params.seed]), np.array([token]))[0] * before
    running = np.float32(0)
    for i in range(kept):
        running += e[order[i]]
        if running > threshold:
            return int(idx[order[i]])
    return int(idx[order[kept - 1]])


def float64_draw(logits, allowed, params: Sampling, u: float) -> int:
    """The textbook draw: float64 softmax, cut to top_p, inverse CDF at u (what the float32 draw approximates)."""
    idx = np.flatnonzero(allowed)
    z = logits[idx].astype(np.float64) / params.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    order = order[np.cumsum(p[order]) - p[order] < params.top_p]
    q = p[order] / p[order].sum()
    return int(idx[order[min(np.searchsorted(np.cumsum(q), u, side="right"), len(q) - 1)]])


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_philox_gives_the_published_known_answers(counter, key, expected):
    from numba import njit

    from toolcall.runtime.batching.philox import philox4x32

    @njit
    def run(c, k):
        return philox4x32(c[0], c[1], c[2], c[3], k[0], k[1])

    assert tuple(int(w) for w in run(np.array(counter, np.uint32), np.array(key, np.uint32))) == expected
    assert tuple(philox_reference(np.array([counter], np.uint32), np.array([key], np.uint32))[0]) == expected


def test_uniform_equals_the_numpy_reference():
    from numba import njit

    from toolcall.runtime.batching.philox import uniform

    @njit
    def many(seeds, tokens, out):
        for i in range(len(seeds)):
            out[i] = uniform(seeds[i], 0, tokens[i])

    rng = np.random.default_rng(3)
    seeds = np.concatenate([[0, 1, 2**32 - 1, 2**32, 2**63 - 1], rng.integers(0, 2**63, 2000, dtype=np.uint64)])
    tokens = np.concatenate([[0, 1, 2, 3, 2**31], rng.integers(0, 4096, 2000)])
    out = np.empty(len(seeds), np.float32)
    many(seeds.astype(np.uint64), tokens.astype(np.int64), out)
    assert (out == uniform_reference(seeds, tokens)).all()
    assert out.min() >= 0 and out.max() < 1 and abs(out.mean() - 0.5) < 0.02


DRAW_CASES = [  # (candidates, allowed share, temperature, top_p)
    (4, 1.0, 0.8, 1.0), (4, 1.0, 0.8, 0.95), (4, 1.0, 0.8, 1e-3), (64, 0.5, 1.3, 0.9), (64, 0.1, 0.2, 1.0),
    (40, 1.0, 5.0, 0.5), (7, 0.6, 1e-3, 1.0), (128, 0.3, 100.0, 0.99), (9, 1.0, 1e-300, 1.0),
]


@pytest.mark.parametrize("width, share, temperature, top_p", DRAW_CASES)
def test_draw_rows_picks_what_the_reference_picks(width, share, temperature, top_p):
    """The compiled batch draw against the numpy reference, 200 rows a case; a row alone, in a batch, or
    padded wider (more disallowed columns) picks the same candidate; and the float32 draw picks what the
    float64 textbook draw picks with the same uniform but for rows where the two land on either side of a
    boundary (at most 2 of 200)."""
    rng = np.random.default_rng(width)
    logits = (rng.standard_normal((200, width)) * 3).astype(np.float32)
    logits[:, 1::5] = logits[:, :1]  # some ties
    allowed = rng.random((200, width)) < share
    allowed[np.arange(200), rng.integers(0, width, 200)] = True
    params = [Sampling(temperature, top_p, int(s)) for s in rng.integers(0, 2**63, 200, dtype=np.uint64)]
    tokens = rng.integers(0, 64, 200).tolist()
    batch = sampling.sample_rows(logits, allowed, params, tokens)
    wide = sampling.sample_rows(np.pad(logits, ((0, 0), (0, 9))), np.pad(allowed, ((0, 0), (0, 9))), params, tokens)
    for b in range(0, 200, 13):
        assert sampling.sample_row(logits[b], allowed[b], params[b], tokens[b]) == batch[b]
    assert (wide == batch).all() and allowed[np.arange(200), batch].all()
    assert batch.tolist() == [draw_reference(logits[b], allowed[b], params[b], tokens[b]) for b in range(200)]
    u = uniform_reference(np.array([q.seed for q in params], np.uint64), np.array(tokens))
    textbook = [float64_draw(logits[b], allowed[b], params[b], float(u[b])) for b in range(200)]
    assert sum(a != b for a, b in zip(batch.tolist(), textbook)) <= 2


def test_a_one_candidate_row_is_that_candidate_and_draws_nothing():
    logits = np.array([[3.0, -1.0, 0.5, 7.0]], np.float32)
    for only in range(4):
        allowed = (np.arange(4) == only)[None]
        out = draw_rows(logits, allowed, np.ones(1, np.float32), np.ones(1, np.float32), np.array([5], np.uint64),
                        np.zeros(1, np.int64))
        assert out.tolist() == [only]


def test_each_answer_token_has_its_own_draw():
    """Over 4,000 answer-token indices of one seed, a fair coin between two equal logits lands both ways about
    evenly; and the same index always draws the same way."""
    logits, allowed = np.zeros((4000, 2), np.float32), np.ones((4000, 2), bool)
    params = [Sampling(1.0, 1.0, 77)] * 4000
    picks = sampling.sample_rows(logits, allowed, params, list(range(4000)))
    assert 1800 < picks.sum() < 2200
    assert (sampling.sample_rows(logits, allowed, params, list(range(4000))) == picks).all()
