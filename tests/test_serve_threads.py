"""The serving engine's kernel threads: the default leaves a core to the HTTP loop, and the fast
backend applies its thread count on whichever thread steps it (numba's count is per thread)."""
from __future__ import annotations

import os
import threading

import pytest

numba = pytest.importorskip("numba")


def test_serve_default_leaves_one_core_for_the_http_loop():
    pytest.importorskip("fastapi")
    from runtime.cpu import available_cpus
    from runtime.serve.server import serve_threads

    assert serve_threads(None) == max(1, available_cpus() - 1)
    assert serve_threads(3) == 3


AFFINITY = len(os.sched_getaffinity(0))


@pytest.mark.parametrize("files,cpus", [
    ({}, AFFINITY),  # no cgroup files: the affinity set
    ({"cpu.max": "max 100000\n"}, AFFINITY),  # v2, no limit
    ({"cpu.max": "150000 100000\n"}, min(AFFINITY, 2)),  # v2, 1.5 CPUs: 2
    ({"cpu.max": "50000 100000\n"}, 1),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, AFFINITY),  # v1, no limit
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # v1, 1 CPU
    ({"cpu.max": "garbage"}, AFFINITY),
])
def test_available_cpus_reads_the_container_limit(tmp_path, files, cpus):
    from runtime.cpu import available_cpus

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert available_cpus(tmp_path) == cpus


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="numba has one thread on this machine: "
                    "no other count to set")
def test_the_fast_model_runs_with_its_own_thread_count_on_another_thread(tiny_bundle):
    from runtime.engine import Engine

    engine = Engine.load(tiny_bundle, threads=1)  # loaded on this thread, stepped on another (as `serve` does)
    seen = {}

    def step_elsewhere():
        seen["before"] = numba.get_num_threads()
        seen["result"] = engine.run(["Book a flight to Paris"])[0].token_ids
        seen["after"] = numba.get_num_threads()

    worker = threading.Thread(target=step_elsewhere)
    worker.start()
    worker.join(120)
    assert seen["before"] == numba.config.NUMBA_NUM_THREADS  # a new thread starts at numba's default
    assert seen["after"] == 1
    assert seen["result"] == engine.run(["Book a flight to Paris"])[0].token_ids
