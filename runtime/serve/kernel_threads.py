"""The serving engine's kernel threads, sized between steps to the CPU time this machine has spare.

numba's OpenMP pool splits each kernel over its threads, and a parallel region waits at its barrier
for all of them: one thread preempted by the event loop, the clients or another process stalls the
whole step (measured on this 2-core machine, engine alone beside one busy process: 1 thread 547
requests/s, 2 threads 247). But a core left idle is lost: in a 2,048-client burst the loop is busy
while requests arrive and then mostly idle while the engine works them off, and there a second
thread pays (1 thread 244-354 requests/s, 2 threads 285-461; bench/RESULTS.md, "CPU serving burst, server and
bundle options").

So the engine runs ``base`` threads (the CPUs less one, the loop's) and one more for each core that
stood spare over the last window: idle (and niced) time of the CPUs this process may use
(/proc/stat), plus the time the engine's own pool threads ran (their work and barrier spinning is
not someone else's load; the event loop's and the engine thread's own time is not counted). Up at
0.75 of a core spare, down below 0.5 (no flapping at the edge). Linux only, and not under a cgroup
CPU quota (there idle time says nothing about the quota): elsewhere the count stays ``base``.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

UP, DOWN = 0.75, 0.5  # cores spare: add a thread at or above UP, drop one below DOWN
WINDOW_S = 0.2  # the accounting is in clock ticks (10 ms): 0.2 s of 2 cores is 40 of them


class KernelThreads:
    """``update()`` on the engine thread between steps: the kernel thread count for the next step."""

    def __init__(self, base: int, most: int, cpus: set[int], loop_thread: int, proc: Path = Path("/proc"),
                 window_s: float = WINDOW_S, clock=time.monotonic):
        self.base, self.most, self.cpus = base, max(base, most), cpus
        self.loop_thread, self.proc, self.window_s, self.clock = loop_thread, proc, window_s, clock
        self.threads = base
        self.niced_is_spare = os.getpriority(os.PRIO_PROCESS, 0) <= 0
        self.hz = os.sysconf("SC_CLK_TCK")
        self._engine_thread: int | None = None
        self._last: tuple[float, int, int] | None = None

    def update(self) -> int:
        now = self.clock()
        if self._last is not None and now - self._last[0] < self.window_s:
            return self.threads
        if self._engine_thread is None:
            self._engine_thread = threading.get_native_id()
        try:
            sample = (now, self._idle_ticks(), self._pool_ticks())
        except (OSError, ValueError, IndexError):
            return self.threads  # /proc unreadable this time: keep the count
        if self._last is not None:
            ticks = (sample[1] - self._last[1]) + (sample[2] - self._last[2])
            spare = ticks / self.hz / (now - self._last[0])  # cores
            if spare >= UP and self.threads < self.most:
                self.threads += 1
            elif spare < DOWN and self.threads > self.base:
                self.threads -= 1
        self._last = sample
        return self.threads

    def _idle_ticks(self) -> int:
        """Idle + iowait ticks of this process's CPUs (per-CPU lines of /proc/stat), plus their niced
        (low-priority) user time when this process is not niced itself: a background job at nice 19
        yields the core to a kernel thread at nice 0 (under autogroup scheduling only if its session's
        autogroup is niced too: /proc/PID/autogroup)."""
        nice = self.niced_is_spare
        total = 0
        for line in (self.proc / "stat").read_text().splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in self.cpus:
                total += int(fields[3]) + int(fields[4]) + (int(fields[1]) if nice else 0)
        return total

    def _pool_ticks(self) -> int:
        """utime + stime of this process's threads other than the event loop and the engine thread."""
        total = 0
        tasks = self.proc / "self" / "task"
        for tid in os.listdir(tasks):
            if int(tid) in (self.loop_thread, self._engine_thread):
                continue
            try:
                stat = (tasks / tid / "stat").read_text()
            except OSError:
                continue  # the thread ended
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
        return total


def adaptive_kernel_threads(model, loop_thread: int, cgroup_root: Path | None = None) -> KernelThreads | None:
    """A KernelThreads for a fast CPU model (its ``threads`` is applied each forward) on Linux with
    no CPU quota; None where the count must stay as it is."""
    from toolcall.runtime.bundle.machine import CGROUP_ROOT, available_cpus

    if model.threads is None or not hasattr(os, "sched_getaffinity") or not Path("/proc/stat").exists():
        return None
    cpus = os.sched_getaffinity(0)
    most = available_cpus(cgroup_root or CGROUP_ROOT)
    if most < len(cpus):  # a quota below the affinity set
        return None
    most = min(most, model.max_threads)  # numba's pool (NUMBA_NUM_THREADS) caps it
    if most <= model.threads:  # no core to add
        return None
    return KernelThreads(model.threads, most, cpus, loop_thread)
