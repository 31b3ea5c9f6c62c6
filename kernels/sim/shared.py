"""A batch's shared memory: one window per block, with racecheck and initcheck shadows.

Shadow state, per granule (the narrowest shared access the function makes: 2 or 4 bytes): written yet (initcheck),
the last writer and the first reader since the last barrier with the barrier counts they ran under, and
whether more than one thread read it. Barrier counts: per block (``bar.sync``) and per warp (``bar.warp.sync``,
and every ``bar.sync``). Two accesses of one granule by different threads, one a write, race unless a
barrier separates them: a ``bar.sync`` of the block, or for two threads of one warp a ``bar.warp.sync``.
Bank conflicts (stats): a warp instruction's 4-byte words in 32 banks; its wavefronts are the most distinct
words any bank serves.
"""
from __future__ import annotations

import numpy as np

from toolcall.kernels.sim import jit

NO_THREAD = -1
# the shadow arrays, one value a granule: (name, dtype, value at a batch's start)
SHADOWS = (("written", bool, False), ("w_tid", np.int32, NO_THREAD), ("w_block_sync", np.int32, 0),
           ("w_warp_sync", np.int32, 0), ("r_tid", np.int32, NO_THREAD), ("r_block_sync", np.int32, 0),
           ("r_warp_sync", np.int32, 0), ("r_multi", bool, False))


def _windows(prog, blocks: int, stride: int, granule: int, sanitize: bool) -> dict:
    """The windows' bytes (and shadows), rows of one block, kept on the program and reused by its later batches
    (fresh pages cost more than the accesses, and a kernel may declare far more shared memory than it touches):
    the first ``dirty`` bytes of each row, all the last batch touched, go back to their start values here, so a
    batch starts as on fresh arrays."""
    pool = prog.__dict__.setdefault("shared_pool", {})
    if pool.get("key") != (stride, granule, sanitize) or pool["blocks"] < blocks:
        pool.clear()
        pool.update(key=(stride, granule, sanitize), blocks=blocks, dirty=0,
                    bytes=np.zeros((blocks, stride), np.uint8))
        for name, dt, start in SHADOWS if sanitize else ():
            pool[name] = np.full((blocks, stride // granule), start, dt)
    else:
        pool["bytes"][:, :pool["dirty"]] = 0
        for name, dt, start in SHADOWS if sanitize else ():
            pool[name][:, :-(-pool["dirty"] // granule)] = start
        pool["dirty"] = 0
    return pool


class SharedMemory:
    def __init__(self, batch, size: int, sanitize: bool):
        self.batch, self.size, self.sanitize = batch, size, sanitize
        self.stride = max(-(-size // 16) * 16, 16)
        nb = batch.n_blocks
        self.block_syncs = np.zeros(nb, np.int32)
        self.warp_syncs = np.zeros(batch.n_warps, np.int32)
        self.granule = batch.prog.shared_granule
        self.pool = _windows(batch.prog, nb, self.stride, self.granule, sanitize)
        self.bytes = self.pool["bytes"][:nb].reshape(-1)  # block b's window at b * stride
        for name, _, _ in SHADOWS if sanitize else ():
            setattr(self, name, self.pool[name][:nb].reshape(-1))  # block b's granules at b * stride / granule

    def block_barrier(self, blocks: np.ndarray) -> None:
        self.block_syncs[blocks] += 1
        warps_per_block = self.batch.n_warps // self.batch.n_blocks
        self.warp_syncs[(blocks[:, None] * warps_per_block + np.arange(warps_per_block)).reshape(-1)] += 1

    def warp_barrier(self, warps: np.ndarray) -> None:
        self.warp_syncs[warps] += 1

    def _where(self, lanes, addr, nbytes, kind):
        B = self.batch
        B._aligned(lanes, addr, nbytes, "shared")
        bad = (addr.astype(np.int64) < 0) | (addr.astype(np.int64) + nbytes > self.size)
        if bad.any():
            B.fault("out_of_bounds", lanes, bad, f"{nbytes}-byte shared access at offset "
                                                 f"{int(addr[np.flatnonzero(bad)[0]])} of a {self.size}-byte window")
        self.pool["dirty"] = max(self.pool["dirty"], int(addr.max()) + nbytes)  # within every row (_windows)
        flat = B.block[lanes].astype(np.int64) * self.stride + addr.astype(np.int64)
        if B.stats is not None:
            self._count_banks(lanes, flat, nbytes)
        return flat

    def _count_banks(self, lanes, flat, nbytes):
        """Per warp instruction: wavefronts (the most distinct words one of the 32 banks serves) against the
        fewest its distinct words need (one wavefront a 32 words); their ratio is the conflict's ways."""
        st, warp = self.batch.stats, self.batch.warp[lanes]
        words = (flat[:, None] // 4 + np.arange(max(nbytes // 4, 1))).reshape(-1)
        warps = np.repeat(warp, max(nbytes // 4, 1)).astype(np.int64)
        distinct = np.unique(np.stack([warps, words]), axis=1)  # (warp, word) pairs
        banks, per_bank = np.unique(np.stack([distinct[0], distinct[1] % 32]), axis=1, return_counts=True)
        worst = np.zeros(self.batch.n_warps, np.int64)
        np.maximum.at(worst, banks[0], per_bank)
        words_per_warp = np.bincount(distinct[0], minlength=self.batch.n_warps)
        st.shared_requests += int(np.count_nonzero(words_per_warp))
        st.shared_wavefronts += int(worst.sum())
        st.shared_ideal += int((-(-words_per_warp // 32)).sum())

    def load(self, lanes, addr, ty, count) -> np.ndarray:
        nbytes = ty.itemsize * count
        flat = self._where(lanes, addr, nbytes, "load")
        if self.sanitize:
            self._check(lanes, flat, nbytes, write=False)
        return self._rows(ty, count)[flat // nbytes]

    def store(self, lanes, addr, values) -> None:
        ty, count = values.dtype, values.shape[1]
        nbytes = ty.itemsize * count
        flat = self._where(lanes, addr, nbytes, "store")
        if self.sanitize:
            self._check(lanes, flat, nbytes, write=True)
        self._rows(ty, count)[flat // nbytes] = values

    def _rows(self, ty, count) -> np.ndarray:
        """The window as rows of ``count`` ``ty`` values: an access is aligned to its size (checked), which divides
        the 16-byte block stride, so lane i's values are row flat[i] // nbytes (a row gather, not an element one)."""
        return self.bytes.view(ty).reshape(-1, count)

    def _check(self, lanes, flat, nbytes, write: bool) -> None:
        """Racecheck and initcheck of one access: granules ``g`` (``per`` a lane, lane-major), lane by lane in
        jit.py (the shadow updates happen only once the access is found clean)."""
        B = self.batch
        G = self.granule
        g = (flat[:, None] // G + np.arange(max(nbytes // G, 1))).reshape(-1) if nbytes > G else flat // G
        per = g.size // len(lanes)
        lane_state = (B.tid[lanes].astype(np.int32), self.block_syncs[B.block[lanes]], self.warp_syncs[B.warp[lanes]])
        writer = (self.w_tid, self.w_block_sync, self.w_warp_sync)
        reader = (self.r_tid, self.r_block_sync, self.r_warp_sync)
        if write:
            self._race(lanes, per, jit.write_races(g, per, *lane_state, *writer, *reader, self.r_multi), g, "write")
            jit.wrote(g, per, *lane_state, *writer, self.written)
        else:
            races, unwritten = jit.read_races(g, per, *lane_state, *writer, self.written)
            self._race(lanes, per, races, g, "read")
            if unwritten.any():
                B.fault("uninitialized", lanes, unwritten.reshape(len(lanes), per).any(1),
                        f"shared read of bytes never written (offset {int(g[np.flatnonzero(unwritten)[0]] * G % self.stride)})")
            jit.read(g, per, *lane_state, *reader, self.r_multi)

    def _race(self, lanes, per, bad, g, what):
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            other = int(self.w_tid[g[k]]) if what == "read" else int(max(self.w_tid[g[k]], self.r_tid[g[k]]))
            self.batch.fault("race", lanes, bad.reshape(len(lanes), per).any(1),
                             f"shared {what} of offset {int(g[k] * self.granule % self.stride)} not separated by a barrier from "
                             f"thread {other}'s access")
