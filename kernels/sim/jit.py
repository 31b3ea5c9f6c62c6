"""numba loops for the executor's hottest per-lane work, each the exact elementwise twin of the numpy it
replaces (same bits, same order of effects): the round-to-nearest f32 fma (numerics.fma_f32) and the
racecheck / initcheck shadow updates of a shared access (shared.py).

Compiled once for fixed signatures and cached beside this file (numba ``cache=True``; numba falls back to its
user-wide cache dir, or NUMBA_CACHE_DIR, when __pycache__ is not writable); fastmath off, so no contraction
of a multiply and an add into one rounding.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from toolcall.common import numba_target  # noqa: F401  (the one compile target: common/numba_target.py)

TINY = 2.0 ** -125  # below it a sum may round twice on its way to an f32 subnormal


@njit("float32[::1](float32[::1], float32[::1], float32[::1])", cache=True, nogil=True)
def fma_rn(a, b, c):
    """a * b + c per lane (1-d, one length), rounded once to nearest even; NaN as 0x7FFFFFFF. The f64 product
    is exact; the f64 sum s rounds to f32 correctly unless s lies exactly halfway between two f32 values or
    below the f32 normal range, where s is redone rounded to odd from TwoSum's error e (53 >= 24 + 2)."""
    out = np.empty(a.size, np.float32)
    out_bits = out.view(np.uint32)
    cell = np.empty(1, np.float64)  # a float64 and its bits
    cell_bits = cell.view(np.uint64)
    for i in range(a.size):
        p = np.float64(a[i]) * np.float64(b[i])
        c64 = np.float64(c[i])
        s = p + c64
        cell[0] = s
        bits = cell_bits[0]
        if (bits & np.uint64(0x1FFFFFFF)) == np.uint64(0x10000000) or (abs(s) < TINY and s != 0):
            bb = s - p
            e = (p - (s - bb)) + (c64 - bb) if np.isfinite(s) else 0.0
            if e != 0 and (bits & np.uint64(1)) == 0:  # inexact and even: one step toward the exact sum
                cell_bits[0] = bits + np.uint64(1) if (e > 0) == (s > 0) else bits - np.uint64(1)
                s = cell[0]
        r = np.float32(s)
        if np.isnan(r):
            out_bits[i] = np.uint32(0x7FFFFFFF)
        else:
            out[i] = r
    return out


# ---- racecheck / initcheck (shared.py): granules g[x * per : (x + 1) * per] are lane x's ----
# The numpy these replace gathers the shadow for every granule before it scatters (duplicates: the last wins),
# so each loop below reads only what the one before it left.

@njit(inline="always")
def _unsynced(other_tid, other_b, other_w, tid, b, w):
    """An access by ``other_tid`` under barrier counts (other_b, other_w) not separated from this one."""
    return other_tid != -1 and other_b == b and (other_tid // 32 != tid // 32 or other_w == w)


SHADOW = "int32[::1], int32[::1], int32[::1]"  # a thread id and the block and warp barrier counts it ran under


@njit(f"boolean[::1](int64[::1], int64, int32[::1], int32[::1], int32[::1], {SHADOW}, {SHADOW}, boolean[::1])",
      cache=True, nogil=True)
def write_races(g, per, tid, bsync, wsync, w_tid, w_b, w_w, r_tid, r_b, r_w, r_multi):
    """A store's granules ``g``: which race (an unsynced earlier write or read by another thread, or another lane
    of this store), with the writer ids already set to this store's (as the fault message reads them)."""
    bad = np.empty(g.size, np.bool_)
    for x in range(tid.size):
        for k in range(x * per, (x + 1) * per):
            j = g[k]
            raw = _unsynced(w_tid[j], w_b[j], w_w[j], tid[x], bsync[x], wsync[x]) and w_tid[j] != tid[x]
            war = _unsynced(r_tid[j], r_b[j], r_w[j], tid[x], bsync[x], wsync[x]) and (r_tid[j] != tid[x] or r_multi[j])
            bad[k] = raw or war
    for x in range(tid.size):
        for k in range(x * per, (x + 1) * per):
            w_tid[g[k]] = tid[x]
    for x in range(tid.size):
        for k in range(x * per, (x + 1) * per):
            bad[k] = bad[k] or w_tid[g[k]] != tid[x]  # another lane of this store wrote the granule too
    return bad


@njit(f"void(int64[::1], int64, int32[::1], int32[::1], int32[::1], {SHADOW}, boolean[::1])", cache=True, nogil=True)
def wrote(g, per, tid, bsync, wsync, w_tid, w_b, w_w, written):
    """A store that did not race: its barrier counts on its granules, now written."""
    for x in range(tid.size):
        for k in range(x * per, (x + 1) * per):
            w_b[g[k]], w_w[g[k]], written[g[k]] = bsync[x], wsync[x], True


@njit(f"Tuple((boolean[::1], boolean[::1]))(int64[::1], int64, int32[::1], int32[::1], int32[::1], {SHADOW}, "
      "boolean[::1])", cache=True, nogil=True)
def read_races(g, per, tid, bsync, wsync, w_tid, w_b, w_w, written):
    """A load's granules ``g``: which an unsynced earlier write by another thread races, and which were never
    written."""
    bad = np.empty(g.size, np.bool_)
    unwritten = np.empty(g.size, np.bool_)
    for x in range(tid.size):
        for k in range(x * per, (x + 1) * per):
            j = g[k]
            bad[k] = _unsynced(w_tid[j], w_b[j], w_w[j], tid[x], bsync[x], wsync[x]) and w_tid[j] != tid[x]
            unwritten[k] = not written[j]
    return bad, unwritten


@njit(f"void(int64[::1], int64, int32[::1], int32[::1], int32[::1], {SHADOW}, boolean[::1])", cache=True, nogil=True)
def read(g, per, tid, bsync, wsync, r_tid, r_b, r_w, r_multi):
    """A load that did not race: the first reader since the last barrier, and whether another thread read too. A
    granule's read is fresh when no unsynced read precedes it; fresh reads start the record over."""
    fresh = np.empty(g.size, np.bool_)
    multi = np.empty(g.size, np.bool_)
    for x in range(tid.size):
        for k in range(x * per, (x + 1) * per):
            j = g[k]
            fresh[k] = not _unsynced(r_tid[j], r_b[j], r_w[j], tid[x], bsync[x], wsync[x])
            multi[k] = False if fresh[k] else (r_multi[j] or r_tid[j] != tid[x])
    for x in range(tid.size):
        for k in range(x * per, (x + 1) * per):
            j = g[k]
            r_multi[j] = multi[k]
            r_b[j], r_w[j] = bsync[x], wsync[x]
            if fresh[k]:
                r_tid[j] = tid[x]
    for x in range(tid.size):
        for k in range(x * per, (x + 1) * per):
            if fresh[k]:
                multi[k] = r_multi[g[k]] or r_tid[g[k]] != tid[x]
    for k in range(g.size):
        if fresh[k]:
            r_multi[g[k]] = multi[k]
