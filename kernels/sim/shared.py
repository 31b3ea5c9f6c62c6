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

NO_THREAD = -1


class SharedMemory:
    def __init__(self, batch, size: int, sanitize: bool):
        self.batch, self.size, self.sanitize = batch, size, sanitize
        self.stride = max(-(-size // 16) * 16, 16)
        nb = batch.n_blocks
        self.bytes = np.zeros(nb * self.stride, np.uint8)
        self.block_syncs = np.zeros(nb, np.int32)
        self.warp_syncs = np.zeros(batch.n_warps, np.int32)
        self.granule = batch.prog.shared_granule
        if sanitize:
            g = nb * self.stride // self.granule
            self.written = np.zeros(g, bool)
            self.w_tid = np.full(g, NO_THREAD, np.int32)
            self.w_block_sync = np.zeros(g, np.int32)
            self.w_warp_sync = np.zeros(g, np.int32)
            self.r_tid = np.full(g, NO_THREAD, np.int32)
            self.r_block_sync = np.zeros(g, np.int32)
            self.r_warp_sync = np.zeros(g, np.int32)
            self.r_multi = np.zeros(g, bool)

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
        first = flat // ty.itemsize
        return self.bytes.view(ty)[first[:, None] + np.arange(count)]

    def store(self, lanes, addr, values) -> None:
        ty, count = values.dtype, values.shape[1]
        nbytes = ty.itemsize * count
        flat = self._where(lanes, addr, nbytes, "store")
        if self.sanitize:
            self._check(lanes, flat, nbytes, write=True)
        first = flat // ty.itemsize
        self.bytes.view(ty)[first[:, None] + np.arange(count)] = values

    def _check(self, lanes, flat, nbytes, write: bool) -> None:
        B = self.batch
        G = self.granule
        g = (flat[:, None] // G + np.arange(max(nbytes // G, 1))).reshape(-1) if nbytes > G else flat // G
        per = g.size // len(lanes)
        tid = np.repeat(B.tid[lanes].astype(np.int32), per)
        warp_in_block = tid // 32
        bsync = np.repeat(self.block_syncs[B.block[lanes]], per)
        wsync = np.repeat(self.warp_syncs[B.warp[lanes]], per)

        def unsynced(other_tid, other_b, other_w):  # an access by other_tid not separated from this one
            return (other_tid != NO_THREAD) & (other_b == bsync) & \
                ((other_tid // 32 != warp_in_block) | (other_w == wsync))

        prev_w = self.w_tid[g]
        raw = unsynced(prev_w, self.w_block_sync[g], self.w_warp_sync[g]) & (prev_w != tid)
        if write:
            prev_r = self.r_tid[g]
            war = unsynced(prev_r, self.r_block_sync[g], self.r_warp_sync[g]) & ((prev_r != tid) | self.r_multi[g])
            self.w_tid[g] = tid
            same_instruction = self.w_tid[g] != tid  # another lane of this store wrote the granule too
            self._race(lanes, per, raw | war | same_instruction, g, "write")
            self.w_block_sync[g], self.w_warp_sync[g] = bsync, wsync
            self.written[g] = True
        else:
            self._race(lanes, per, raw, g, "read")
            unwritten = ~self.written[g]
            if unwritten.any():
                B.fault("uninitialized", lanes, unwritten.reshape(len(lanes), per).any(1),
                        f"shared read of bytes never written (offset {int(g[np.flatnonzero(unwritten)[0]] * G % self.stride)})")
            fresh = ~unsynced(self.r_tid[g], self.r_block_sync[g], self.r_warp_sync[g])
            other = ~fresh & (self.r_tid[g] != tid)
            self.r_multi[g] = np.where(fresh, False, self.r_multi[g] | other)
            self.r_block_sync[g], self.r_warp_sync[g] = bsync, wsync
            fresh_g = g[fresh]
            if fresh_g.size:
                self.r_tid[fresh_g] = tid[fresh]
                self.r_multi[fresh_g] |= self.r_tid[fresh_g] != tid[fresh]

    def _race(self, lanes, per, bad, g, what):
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            other = int(self.w_tid[g[k]]) if what == "read" else int(max(self.w_tid[g[k]], self.r_tid[g[k]]))
            self.batch.fault("race", lanes, bad.reshape(len(lanes), per).any(1),
                             f"shared {what} of offset {int(g[k] * self.granule % self.stride)} not separated by a barrier from "
                             f"thread {other}'s access")
