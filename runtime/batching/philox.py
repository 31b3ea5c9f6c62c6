"""The counter-based generator of sampled answers: Philox4x32-10 (Salmon et al., "Parallel random numbers:
as easy as 1, 2, 3", SC 2011; the Random123 known-answer vectors are tests/test_philox.py's).

A draw is a pure function of (seed, choice, token): key = the request's seed (low word, high word),
counter = (the answer token's index, the choice's index, 0, 0). So a sequence's draws never depend on the
batch, the step it lands in, or how many tokens the grammar forced before it, and a GPU computing the same
32-bit multiplies and xors draws the same numbers. The uniform is the first output
word's top 24 bits as float32 in [0, 1): exact, the same on both.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from toolcall.common import numba_target  # noqa: F401  (the one compile target: common/numba_target.py)

ROUNDS = 10
M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # the round multipliers
W0, W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)  # the key schedule's increments (golden ratio, sqrt(3) - 1)
MASK32 = np.uint64(0xFFFFFFFF)
UNIT = np.float32(2.0 ** -24)


@njit(inline="always", cache=True)
def philox4x32(c0, c1, c2, c3, k0, k1):
    """The four output words (uint32) of counter (c0..c3) under key (k0, k1), ten rounds."""
    c0, c1, c2, c3 = np.uint32(c0), np.uint32(c1), np.uint32(c2), np.uint32(c3)
    k0, k1 = np.uint32(k0), np.uint32(k1)
    for r in range(ROUNDS):
        if r > 0:
            k0, k1 = np.uint32(k0 + W0), np.uint32(k1 + W1)
        p0 = M0 * np.uint64(c0)  # 32 x 32 -> 64-bit products: hi and lo words
        p1 = M1 * np.uint64(c2)
        hi0, lo0 = np.uint32(p0 >> np.uint64(32)), np.uint32(p0 & MASK32)
        hi1, lo1 = np.uint32(p1 >> np.uint64(32)), np.uint32(p1 & MASK32)
        c0, c1, c2, c3 = np.uint32(hi1 ^ c1 ^ k0), lo1, np.uint32(hi0 ^ c3 ^ k1), lo0
    return c0, c1, c2, c3


@njit(inline="always", cache=True)
def uniform(seed, choice, token):
    """float32 in [0, 1): the draw of answer token ``token`` (its index in the answer) of choice ``choice``
    (0 while a request asks one choice) of a request seeded ``seed`` (0 <= seed < 2^63)."""
    s = np.uint64(seed)
    x0, _, _, _ = philox4x32(np.uint32(token), np.uint32(choice), np.uint32(0), np.uint32(0),
                             np.uint32(s & MASK32), np.uint32(s >> np.uint64(32)))
    return np.float32(x0 >> np.uint32(8)) * UNIT
