"""The serving engine's kernel threads: the default leaves a core to the HTTP loop, and the fast
backend applies its thread count on whichever thread steps it (numba's count is per thread)."""
from __future__ import annotations

import os
import threading

import pytest

numba = pytest.importorskip("numba")


def test_serve_default_leaves_one_core_for_the_http_loop():
    pytest.importorskip("fastapi")
    from toolcall.runtime.bundle.machine import available_cpus
    from toolcall.runtime.serve.server import serve_threads

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
    from toolcall.runtime.bundle.machine import available_cpus

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert available_cpus(tmp_path) == cpus


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="numba has one thread on this machine: "
                    "no other count to set")
def test_the_fast_model_runs_with_its_own_thread_count_on_another_thread(tiny_bundle):
    from toolcall.runtime.engine import Engine

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


def fake_proc(root, idle_ticks: dict[int, int], task_ticks: dict[int, int], nice_ticks: int = 0):
    """/proc/stat with per-CPU idle (+ iowait 0) and niced ticks and /proc/self/task/<tid>/stat with utime + stime."""
    lines = ["cpu  1 2 3 4 5 0 0 0 0 0"] + [f"cpu{c} 10 {nice_ticks} 10 {t} 0 0 0 0 0 0" for c, t in idle_ticks.items()]
    (root / "stat").write_text("\n".join(lines) + "\n")
    for tid, ticks in task_ticks.items():
        (root / "self" / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
        # pid (comm with ) and spaces) state ... utime stime: fields 14 and 15
        (root / "self" / "task" / str(tid) / "stat").write_text(
            f"{tid} (numba (w) x) S 1 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0\n")


def test_kernel_threads_follow_the_spare_cpu_and_ignore_the_loop_and_engine_threads(tmp_path):
    from toolcall.runtime.serve.kernel_threads import KernelThreads

    hz = os.sysconf("SC_CLK_TCK")
    now = [0.0]
    engine_tid = threading.get_native_id()
    kt = KernelThreads(base=1, most=2, cpus={0, 1}, loop_thread=1, proc=tmp_path, window_s=0.2, clock=lambda: now[0])
    seen = []

    def at(t, idle0, idle1, loop, engine, pool, other_cpu=0, nice=0):
        now[0] = t
        fake_proc(tmp_path, {0: idle0, 1: idle1, 5: other_cpu}, {1: loop, engine_tid: engine, 99: pool}, nice)
        seen.append(kt.update())

    at(0.0, 0, 0, 0, 0, 0)
    at(0.1, 0, hz, 0, 0, 0)  # inside the window: not judged yet
    at(1.0, 0, hz, 5 * hz, 5 * hz, 0, other_cpu=50 * hz)  # one core idle for 1 s (CPU 5 is not ours): up
    at(2.0, 0, 2 * hz, 5 * hz, 5 * hz, 0)  # idle again: already at most
    at(3.0, 0, 2 * hz, 9 * hz, 9 * hz, hz)  # no idle, but the pool thread ran a whole core: stays
    at(4.0, 0, 2 * hz, 20 * hz, 20 * hz, hz + hz // 5)  # loop and engine busy, pool preempted: down
    at(5.0, 0, 2 * hz + hz // 2, 20 * hz, 20 * hz, hz + hz // 5 + hz // 5)  # 0.7 of a core: below UP, stays
    at(6.0, 0, 2 * hz + hz // 2, 30 * hz, 30 * hz, hz + hz // 5 + hz // 5, nice=hz // 2)  # each CPU 0.5 s niced: up
    assert seen == [1, 1, 2, 2, 2, 1, 1, 2 if os.getpriority(os.PRIO_PROCESS, 0) <= 0 else 1]


def test_kernel_threads_stay_fixed_under_a_cpu_quota_or_without_a_fast_model(tmp_path):
    from toolcall.runtime.serve.kernel_threads import adaptive_kernel_threads

    class Model:
        threads, max_threads = 1, 64

    class Device:  # a backend without host kernel threads (CUDA, the numpy reference)
        threads = max_threads = None

    (tmp_path / "cpu.max").write_text("100000 100000\n")  # 1 CPU
    assert adaptive_kernel_threads(Model(), 1, cgroup_root=tmp_path) is None
    assert adaptive_kernel_threads(Device(), 1, cgroup_root=tmp_path / "none") is None
    if AFFINITY > 1:
        kt = adaptive_kernel_threads(Model(), 1, cgroup_root=tmp_path / "none")
        assert kt is not None and (kt.base, kt.most) == (1, AFFINITY)
        Model.max_threads = 1  # numba's pool holds one thread (NUMBA_NUM_THREADS=1): nothing to add
        assert adaptive_kernel_threads(Model(), 1, cgroup_root=tmp_path / "none") is None
