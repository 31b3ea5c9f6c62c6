"""A launch on the executor: blocks in a seeded order, batch by batch, each batch stepped min-PC.

``run_launch(program, grid, block, param_block, memory, ...)`` runs every block of the grid; ``seed`` orders
the blocks and the atomics (two seeds must give the same output for a kernel whose cross-block protocol is
right); ``sanitize`` turns on racecheck / initcheck (bounds, alignment and sync checks are always on).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from toolcall.kernels.sim.errors import SimFault
from toolcall.kernels.sim.machine import BATCH_BYTES, MAX_STEPS, Batch
from toolcall.kernels.sim.stats import LaunchStats
from toolcall.kernels.sim.memory import GlobalMemory
from toolcall.kernels.sim.numerics import APPROXIMATE
from toolcall.kernels.sim.program import Program


@dataclass
class LaunchSpec:
    """One launch's inputs and what it leaves: ``conditionals`` (graph handle -> value set by the kernel)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    param_block: np.ndarray
    memory: GlobalMemory
    shared_bytes: int = 0
    seed: int = 0
    sanitize: bool = True
    stats: LaunchStats | None = None
    globals: dict[str, int] = field(default_factory=dict)  # the module's .global variables on this device
    conditionals: dict[int, int] = field(default_factory=dict)

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)


def run_launch(prog: Program, spec: LaunchSpec) -> None:
    threads = int(np.prod(spec.block))
    n_blocks = int(np.prod(spec.grid))
    order = spec.rng.permutation(n_blocks) if spec.seed else np.arange(n_blocks)
    lane_bytes = prog.register_bytes + prog.local_bytes + 64
    per_batch = max(1, min(n_blocks, BATCH_BYTES // (lane_bytes * threads), max(1, 65536 // threads)))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for start in range(0, n_blocks, per_batch):
            run_batch(Batch(prog, spec, order[start:start + per_batch]))


def _contiguous(lanes: np.ndarray):
    """A run of consecutive lanes as a slice (numpy views instead of gathers and scatters)."""
    if len(lanes) and int(lanes[-1]) - int(lanes[0]) + 1 == len(lanes):
        return slice(int(lanes[0]), int(lanes[-1]) + 1)
    return lanes


def run_batch(S: Batch) -> None:
    """Steps the batch until every lane has exited. Lanes at a barrier or a warp-synchronous instruction whose
    partners have not arrived wait there (``waiting``: left out of the min-PC choice until the step at their pc
    runs again), as on the card, where code laid out of line (a branch to the end of the function and back) makes
    partners arrive later; partners that can never arrive (exited, or every live lane waiting) are a sync fault.

    The lanes ``ix`` at the chosen pc ``p`` run as a group: while their next pc stays below ``rest`` (the smallest
    pc of every other lane, waiting or not) min-PC would choose exactly them again, so they step on without a
    look at ``pc`` (stale for them meanwhile); a branch that splits them, an exit, a wait, or reaching ``rest``
    writes their pc back and chooses anew."""
    prog, steps = S.prog, S.prog.steps
    exit_pc = prog.exit_pc
    pc = np.zeros(S.n, np.int64)
    waiting = np.zeros(S.n, bool)
    alive = S.n
    p, ix, rest = 0, slice(None), exit_pc + 1  # the group: every lane at pc 0, no other lane
    stats = S.stats
    for _ in range(MAX_STEPS):
        if p is None:
            p = int(pc[~waiting].min()) if S.any_waiting else int(pc.min())
            if p >= exit_pc:
                if S.any_waiting and (pc[waiting] < exit_pc).any():
                    S.deadlock(np.flatnonzero(waiting & (pc < exit_pc)), steps, pc)
                return
            here = pc == p
            ix = np.flatnonzero(here)
            if S.any_waiting:
                waiting[ix] = False
                S.any_waiting = bool(waiting.any())
            rest = int(np.where(here, exit_pc + 1, pc).min())
            ix = _contiguous(ix)
        elif p >= exit_pc:  # the group is done and every other lane is at or past the exit
            return
        step = steps[p]
        S.step = step
        if step.plain and stats is None:
            step.fn(S, ix)
            p += 1
            if p >= rest:
                pc[ix] = p
                p = None
            continue
        run = ix
        if step.guard is not None:
            g = S.regs[step.guard][ix]
            g = ~g if step.negated else g
            if not g.all():
                run = _contiguous(S.lane_ids(ix)[g])
        if step.kind == "bar" or step.member_mask is not None:
            lanes = S.lane_ids(run)
            ready = S.barrier_ready(lanes) if step.kind == "bar" else S.warp_ready(lanes, step.member_mask(S, run))
            if not ready.all():  # the lanes whose partners are elsewhere wait; the others run
                pc[ix] = p
                rest = -1  # choose anew after this step
                waiting[lanes[~ready]] = True
                S.any_waiting = True
                ix = run = _contiguous(lanes[ready])
                if not ready.any():
                    p = None
                    continue
        if stats is not None:
            n_run = len(S.lane_ids(run))
            stats.lane_instructions += n_run
            stats.steps += 1
            if step.instr.op in APPROXIMATE:
                stats.approximate[step.instr.op] = stats.approximate.get(step.instr.op, 0) + n_run
        kind = step.kind
        if kind == "op":
            if step.fn is not None and (step.guard is None or len(S.lane_ids(run))):
                step.fn(S, run)
            nxt = p + 1
        elif kind == "bra":
            taken = S.lane_ids(run) if step.guard is not None else None
            if taken is None or len(taken) == len(S.lane_ids(ix)):
                nxt = step.target
            elif len(taken) == 0:
                nxt = p + 1
            else:
                pc[ix] = p + 1
                pc[taken] = step.target
                p = None
                continue
        elif kind == "ret":
            gone = S.lane_ids(run)
            if len(gone):
                S.exit_lanes(gone)
                pc[ix] = p + 1
                pc[gone] = exit_pc
                alive -= len(gone)
                if alive == 0:
                    return
                p = None
                continue
            nxt = p + 1
        else:  # bar: every live thread of the blocks in `run` is here
            S.barrier(S.lane_ids(run))
            if step.fn is not None:
                step.fn(S, run)
            nxt = p + 1
        if nxt < rest:
            p = nxt
        else:
            pc[ix] = nxt
            p = None
    raise SimFault("hang", f"{prog.name}: a batch ran {MAX_STEPS} instructions without finishing",
                   kernel=prog.name)
