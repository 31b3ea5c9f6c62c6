"""The CPU backends: the numpy float32 reference (model.py) and the fast numba one on the stored
weights (fast_model.py), over a paged bf16 KV pool. This module imports neither (no numba here)."""
from __future__ import annotations

import math
import os
from pathlib import Path

CPU_BACKENDS = ("fast", "reference")  # fast: numba on the stored weights; reference: numpy float32, the truth

CGROUP_ROOT = Path("/sys/fs/cgroup")


def available_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """CPUs this process may run on: its affinity set, capped by a cgroup CPU quota (a container's
    CPU limit: v2 ``cpu.max``, v1 ``cpu/cpu.cfs_quota_us`` over ``cpu.cfs_period_us``; a quota of
    1.5 CPUs counts 2). ``os.cpu_count()`` is the host's count, which in a pod limited to 2 CPUs of
    a 64-core node would start 64 kernel threads that stall at every barrier."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for quota_file, period_file in (("cpu.max", None), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            fields = (cgroup_root / quota_file).read_text().split()
            quota, period = fields[0], fields[1] if period_file is None else (cgroup_root / period_file).read_text()
            if quota not in ("max", "-1") and int(quota) > 0:
                n = min(n, max(1, math.ceil(int(quota) / int(period))))
        except (OSError, ValueError, IndexError):
            continue
    return max(1, n)


def serving_threads(cpus: int) -> int:
    """Kernel threads of a serving engine on ``cpus`` CPUs: one CPU is left to the HTTP event loop.
    Kernel threads that share every core stall at each parallel region's barrier whenever the loop
    (or anything else) preempts one of them."""
    return max(1, cpus - 1)
