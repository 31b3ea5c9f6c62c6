"""Running one launch of a compiled entry function over every thread of a batch of blocks at once.

Lanes: a batch holds whole blocks, their threads in order (lane = block slot * threads + thread), each
register a numpy array over the lanes. Scheduling: every lane has its own program counter; each step runs
the instruction at the smallest counter for all lanes there (min-PC), so a diverged if / else or loop
reconverges where the lanes meet again, as at the immediate post-dominator of the structured code NVRTC
writes. A barrier runs when it is the smallest counter, i.e. once every lane of the block has reached it;
a live lane of the block still elsewhere is a sync fault. Blocks run in a seeded order, batch by batch (a
later batch sees an earlier one's writes), and atomics resolve in a seeded lane order.
"""
from __future__ import annotations

import numpy as np

from toolcall.kernels.sim.errors import SimFault
from toolcall.kernels.sim.program import Program
from toolcall.kernels.sim.shared import SharedMemory

MAX_STEPS = 20_000_000  # instructions a batch may run before it is a hang
BATCH_BYTES = 192 << 20  # registers and local memory of one batch


def _register_file(prog: Program, n: int) -> list[np.ndarray]:
    """One array of ``n`` lanes per register: rows of one block per dtype, kept on the program and reused by
    its later batches (fresh pages cost more than the instructions; a register is written before it is read,
    so a batch may start with the last one's values). The list of views is kept per ``n`` too (a kernel may
    declare thousands of registers)."""
    pool = prog.__dict__.setdefault("register_pool", {})
    if pool.get("lanes", 0) < n:
        pool.clear()
        pool["lanes"] = n
        pool["views"] = {}
        for dt in set(prog.reg_dtypes):
            pool[dt] = np.zeros((sum(d == dt for d in prog.reg_dtypes), n), dt)
    if n not in pool["views"]:
        regs: list[np.ndarray | None] = [None] * len(prog.reg_dtypes)
        rows = dict.fromkeys(set(prog.reg_dtypes), 0)
        for i, dt in enumerate(prog.reg_dtypes):
            regs[i] = pool[dt][rows[dt], :n]
            rows[dt] += 1
        pool["views"][n] = regs
    return pool["views"][n]


def warp_bits(warp_of_lane: np.ndarray, bits: np.ndarray, n_warps: int) -> np.ndarray:
    """Per warp, the OR of its lanes' bits (uint64): distinct lanes have distinct bits, so the OR is their sum, which
    float64 holds exactly (< 2^32); a bincount is much cheaper than ``np.bitwise_or.at``."""
    return np.bincount(warp_of_lane, weights=bits, minlength=n_warps).astype(np.uint64)


class Batch:
    """The state of a batch of blocks: registers, special registers, shared and local memory, call slots."""

    def __init__(self, prog: Program, launch, blocks: np.ndarray):
        self.prog, self.launch, self.memory = prog, launch, launch.memory
        gx, gy, _ = launch.grid
        bx, by, bz = launch.block
        T = bx * by * bz
        self.n_blocks, self.threads = len(blocks), T
        self.n = n = len(blocks) * T
        self.all = np.arange(n)
        slot = self.all // T
        t = self.all % T
        self.block, self.tid = slot, t
        self.laneid = (t % 32).astype(np.uint32)
        warps_per_block = -(-T // 32)
        self.warp = slot * warps_per_block + t // 32
        self.n_warps = len(blocks) * warps_per_block
        ids = blocks[slot]
        const = lambda v: np.full(n, v, np.uint32)  # noqa: E731
        self.special = {"%tid.x": (t % bx).astype(np.uint32), "%tid.y": (t // bx % by).astype(np.uint32),
                        "%tid.z": (t // (bx * by)).astype(np.uint32), "%ntid.x": const(bx), "%ntid.y": const(by),
                        "%ntid.z": const(bz), "%ctaid.x": (ids % gx).astype(np.uint32),
                        "%ctaid.y": (ids // gx % gy).astype(np.uint32), "%ctaid.z": (ids // (gx * gy)).astype(np.uint32),
                        "%nctaid.x": const(gx), "%nctaid.y": const(gy), "%nctaid.z": const(launch.grid[2]),
                        "%laneid": self.laneid, "%warpid": (t // 32).astype(np.uint32)}
        self.block_ids = ids
        self.regs = _register_file(prog, n)
        self.param_block = launch.param_block
        self.call_args: dict[str, np.ndarray] = {}
        self.shared = SharedMemory(self, prog.dynamic_shared + launch.shared_bytes, launch.sanitize)
        self.local = np.zeros(n * max(prog.local_bytes, 16), np.uint8) if prog.local_bytes else None
        self.alive_per_block = np.full(len(blocks), T)
        # per warp, the lanes that exist and have not exited (bit = lane id)
        lanes_in_warp = np.minimum(T - (np.arange(warps_per_block) * 32), 32)
        full = ((np.uint64(1) << lanes_in_warp.astype(np.uint64)) - np.uint64(1)).astype(np.uint64)
        self.alive_bits = np.tile(full, len(blocks))
        self.waiting_at_barrier = np.zeros(len(blocks), np.int64)  # lanes of a block waiting at a bar.sync
        self.any_waiting = False
        self.barrier_step = None  # the bar.sync lanes last waited at
        self.stats = launch.stats
        self.step = None  # the Step running (for messages)

    # ---- helpers for the op closures ----
    def lane_ids(self, ix) -> np.ndarray:
        return self.all[ix] if isinstance(ix, slice) else ix

    def where(self, lane: int) -> str:
        s = self.special
        return (f"{self.prog.name} at {self.step.instr.loc or '?'} (PTX line {self.step.instr.line}), block "
                f"({s['%ctaid.x'][lane]}, {s['%ctaid.y'][lane]}, {s['%ctaid.z'][lane]}) thread {self.tid[lane]}")

    def fault(self, kind: str, lanes: np.ndarray, bad: np.ndarray, what: str):
        first = int(lanes[np.flatnonzero(bad)[0]])
        raise SimFault(kind, f"{what} in {self.where(first)} ({int(np.count_nonzero(bad))} lane(s))",
                       kernel=self.prog.name, line=self.step.instr.line, loc=self.step.instr.loc,
                       block=int(self.block_ids[self.block[first]]), thread=int(self.tid[first]))

    # ---- memory ----
    def load(self, space, addr, ty, count, ix) -> np.ndarray:
        lanes = self.lane_ids(ix)
        addr = np.broadcast_to(np.asarray(addr, np.uint64), lanes.shape)
        if space == "global":
            heap, _ = self._global(lanes, addr, ty, count)
            return heap.view(ty).reshape(-1, count)[self._rows(addr, ty, count)]
        if space == "shared":
            return self.shared.load(lanes, addr, ty, count)
        buf, at = self._local(lanes, addr, ty, count)
        return buf[at]

    def store(self, space, addr, values, ix) -> None:
        lanes = self.lane_ids(ix)
        ty, count = values.dtype, values.shape[1]
        addr = np.broadcast_to(np.asarray(addr, np.uint64), lanes.shape)
        if space == "global":
            heap, _ = self._global(lanes, addr, ty, count)
            heap.view(ty).reshape(-1, count)[self._rows(addr, ty, count)] = values
        elif space == "shared":
            self.shared.store(lanes, addr, values)
        else:
            buf, at = self._local(lanes, addr, ty, count)
            buf[at] = values

    def _aligned(self, lanes, addr, nbytes, space):
        bad = (addr % np.uint64(nbytes)) != 0
        if bad.any():
            self.fault("misaligned", lanes, bad, f"{nbytes}-byte {space} access at {int(addr[np.flatnonzero(bad)[0]]):#x}")

    def _global(self, lanes, addr, ty, count):
        nbytes = ty.itemsize * count
        self._aligned(lanes, addr, nbytes, "global")
        ok = self.memory.check(addr, nbytes)
        if not ok.all():
            a = int(addr[np.flatnonzero(~ok)[0]])
            self.fault("out_of_bounds", lanes, ~ok, f"{nbytes}-byte global access at {a:#x} ({self.memory.owner(a)})")
        if self.stats is not None:
            self._count_global(lanes, addr, nbytes)
        return self.memory.heap, None

    def _rows(self, addr, ty, count):
        """Per lane, its row of the heap seen as rows of ``count`` ``ty`` values: the access is aligned to its size
        (checked) and every allocation and the heap's size are multiples of 256 bytes."""
        return self.memory.offsets(addr) // (ty.itemsize * count)

    def _local(self, lanes, addr, ty, count):
        nbytes = ty.itemsize * count
        self._aligned(lanes, addr, nbytes, "local")
        size = self.prog.local_bytes
        bad = (addr.astype(np.int64) < 0) | (addr.astype(np.int64) + nbytes > size)
        if self.local is None or bad.any():
            self.fault("out_of_bounds", lanes, bad if self.local is not None else np.ones(len(lanes), bool),
                       f"{nbytes}-byte local access past the {size}-byte frame")
        stride = max(size, 16)
        first = (lanes.astype(np.int64) * stride + addr.astype(np.int64)) // ty.itemsize
        return self.local.view(ty), first[:, None] + np.arange(count)

    def _count_global(self, lanes, addr, nbytes):
        """Per warp instruction: the distinct bytes its lanes ask for, and the 32-byte sectors those lie in."""
        st = self.stats
        warp = self.warp[lanes].astype(np.uint64) << np.uint64(44)
        first, last = addr // np.uint64(32), (addr + np.uint64(nbytes - 1)) // np.uint64(32)
        per_warp = np.unique(np.concatenate([warp | first, warp | last]))  # (warp, sector) pairs
        st.global_sectors += len(per_warp)
        st.global_bytes += len(np.unique(warp | addr)) * nbytes
        st.global_requests += len(np.unique(warp))
        st.sector_touches.append(per_warp & np.uint64((1 << 44) - 1))

    def atomic(self, op, addr, value, ty, ix) -> np.ndarray:
        lanes = self.lane_ids(ix)
        addr = np.broadcast_to(np.asarray(addr, np.uint64), lanes.shape)
        heap, _ = self._global(lanes, addr, ty, 1)
        cells = self._rows(addr, ty, 1)
        values = np.broadcast_to(np.asarray(value, ty), lanes.shape)
        old = np.zeros(len(lanes), ty)
        view = heap.view(ty)
        for k in self.launch.rng.permutation(len(lanes)):  # the seeded order atomics resolve in
            c = cells[k]
            old[k] = view[c]
            view[c] = view[c] + values[k] if op == "add" else view[c] | values[k]
        return old

    def set_conditional(self, handles, values) -> None:
        for h, v in zip(handles.tolist(), values.tolist()):
            self.launch.conditionals[int(h)] = int(v)

    # ---- warps ----
    def whole_warps(self, lanes: np.ndarray, mask) -> bool:
        """``lanes`` (ascending, as every lane set the executor makes) are whole warps and ``mask`` is the full one
        for each: every partner is here, so there is nothing to check or wait for (the common case, fast). A run
        of 32 ascending distinct lanes from a multiple of 32 to 31 past it is one whole warp."""
        if self.threads % 32 or len(lanes) % 32 or not len(lanes):
            return False
        m = np.asarray(mask)
        if not (m == 0xFFFFFFFF).all():
            return False
        if len(lanes) == self.n:
            return True
        first = lanes[::32]
        return bool(((first % 32 == 0) & (lanes[31::32] - first == 31)).all())

    def warp_sync(self, ix, mask, what: str) -> None:
        lanes = self.lane_ids(ix)
        if self.whole_warps(lanes, mask):
            if what == "bar.warp.sync":
                self.shared.warp_barrier(self.warp[lanes[::32]])
            return
        mask = np.broadcast_to(np.asarray(mask, np.uint32), lanes.shape).astype(np.uint64)
        bits = np.uint64(1) << self.laneid[lanes].astype(np.uint64)
        executing = warp_bits(self.warp[lanes], bits, self.n_warps)
        missing = mask & ~executing[self.warp[lanes]]
        outside = (mask & bits) == 0
        bad = (missing != 0) | outside
        if bad.any():
            k = np.flatnonzero(bad)[0]
            self.fault("sync", lanes, bad, f"{what} with member mask {int(mask[k]):#010x} executed by lanes "
                                           f"{int(executing[self.warp[lanes[k]]]):#010x} of the warp")
        if what == "bar.warp.sync":
            self.shared.warp_barrier(np.unique(self.warp[lanes]))

    def check_shfl_sources(self, ix, source, mask, what) -> None:
        lanes = self.lane_ids(ix)
        executing = np.zeros(self.n, bool)
        executing[lanes] = True
        bad = ~executing[source]
        if bad.any():
            self.fault("sync", lanes, bad, f"{what} reads lane {int(self.laneid[source[np.flatnonzero(bad)[0]]])}, "
                                           "which does not execute it")

    def warp_lanes(self, ix, what: str) -> np.ndarray:
        lanes = self.lane_ids(ix)
        whole = len(lanes) % 32 == 0 and np.array_equal(
            self.laneid[lanes].reshape(-1, 32), np.broadcast_to(np.arange(32, dtype=np.uint32), (len(lanes) // 32, 32)))
        if not whole:
            self.fault("sync", lanes, np.ones(len(lanes), bool), f"{what} executed by part of a warp")
        return lanes.reshape(-1, 32)

    # ---- waiting at barriers and warp-synchronous instructions (executor.run_batch) ----
    def barrier_ready(self, lanes: np.ndarray) -> np.ndarray:
        """Per lane at a bar.sync: every live thread of its block is here. The others wait (counted per block)."""
        arrived = np.bincount(self.block[lanes], minlength=self.n_blocks)
        ready = (arrived == self.alive_per_block)[self.block[lanes]]
        self.waiting_at_barrier[:] = np.bincount(self.block[lanes[~ready]], minlength=self.n_blocks)
        if not ready.all():
            self.barrier_step = self.step
        return ready

    def warp_ready(self, lanes: np.ndarray, mask) -> np.ndarray:
        """Per lane at a warp-synchronous instruction: every lane its member mask names is here. A lane outside its
        own mask, or a mask naming a lane that has exited, is a sync fault (that lane can never arrive)."""
        if self.whole_warps(lanes, mask):
            return np.ones(len(lanes), bool)
        mask = np.broadcast_to(np.asarray(mask, np.uint32), lanes.shape).astype(np.uint64)
        warp = self.warp[lanes]
        bits = np.uint64(1) << self.laneid[lanes].astype(np.uint64)
        outside = (mask & bits) == 0
        gone = (mask & ~self.alive_bits[warp]) != 0
        if (outside | gone).any():
            k = int(np.flatnonzero(outside | gone)[0])
            self.fault("sync", lanes, outside | gone, f"{self.step.instr.op} with member mask {int(mask[k]):#010x}: "
                       + ("the lane is not in its own mask" if outside[k] else
                          f"lanes {int(mask[k] & ~self.alive_bits[warp[k]]):#010x} have exited"))
        here = warp_bits(warp, bits, self.n_warps)
        return (mask & ~here[warp]) == 0

    def exit_lanes(self, lanes: np.ndarray) -> None:
        """Lanes that ran ``ret``: a block-mate waiting at a barrier would wait for them forever (sync fault)."""
        blocked = self.waiting_at_barrier[self.block[lanes]] > 0
        if self.any_waiting and blocked.any():
            self.step = self.barrier_step  # named at the barrier, with a thread that left without it
            self.fault("sync", lanes, blocked, "bar.sync waits for threads of the block that exit without it (a "
                                               "barrier in code the block does not run as one)")
        np.subtract.at(self.alive_per_block, self.block[lanes], 1)
        np.bitwise_and.at(self.alive_bits, self.warp[lanes], ~(np.uint64(1) << self.laneid[lanes].astype(np.uint64)))

    def deadlock(self, lanes: np.ndarray, steps, pc) -> None:
        """Every live lane waits: for partners elsewhere that wait too."""
        k = int(lanes[0])
        self.step = steps[int(pc[k])]
        self.fault("sync", lanes, np.ones(len(lanes), bool),
                   f"{self.step.instr.op} waits for threads that wait elsewhere (a barrier or warp-synchronous "
                   "instruction not reached by every thread it names)")

    def barrier(self, lanes: np.ndarray) -> None:
        arrived = np.bincount(self.block[lanes], minlength=self.n_blocks)
        self.waiting_at_barrier[arrived > 0] = 0
        self.shared.block_barrier(np.flatnonzero(arrived))
