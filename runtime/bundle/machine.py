"""This machine's facts (CPU memory and the CPUs this process may use, or the GPU through cuda.bindings) and
the contract's target check."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from toolcall.common.errors import Refusal
from toolcall.runtime.bundle.contract import CPU_TARGET, Contract


@dataclass(frozen=True)
class MachineFacts:
    """What a bundle is checked against. ``gpu_name`` is None on a machine without a usable GPU."""

    free_bytes: int  # host MemAvailable for cpu bundles, device free memory for GPU bundles
    gpu_name: str | None = None
    compute_capability: str | None = None  # "9.0"
    driver_version: int | None = None  # 1000*major + 10*minor
    no_gpu_reason: str | None = None  # why gpu_name is None, when a GPU was looked for


def cpu_facts() -> MachineFacts:
    """Host memory available now (Linux /proc/meminfo MemAvailable)."""
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return MachineFacts(free_bytes=int(line.split()[1]) * 1024)
    raise Refusal("insufficient_memory", "cannot read MemAvailable from /proc/meminfo", needed=0, available=0)


def gpu_facts(device: int = 0) -> MachineFacts:
    """Facts of GPU ``device``; without a driver or device, facts with ``gpu_name`` None and the reason."""
    try:
        from cuda.bindings import driver
    except ImportError as e:
        return MachineFacts(free_bytes=0, no_gpu_reason=f"cuda-bindings is not installed ({e.name}): GPU bundles "
                            "need the gpu extra, pip install 'toolcall-engine[gpu]'")
    try:
        (err,) = driver.cuInit(0)
    except Exception as e:  # DynamicLibNotFoundError and friends: no driver installed
        return MachineFacts(free_bytes=0, no_gpu_reason=f"no CUDA driver ({type(e).__name__})")
    if err != driver.CUresult.CUDA_SUCCESS:
        return MachineFacts(free_bytes=0, no_gpu_reason=f"cuInit failed ({err.name})")
    from toolcall.kernels.launch import check
    count = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    if count <= device:
        return MachineFacts(free_bytes=0, no_gpu_reason=f"cuDeviceGetCount found {count} devices")
    dev = check(driver.cuDeviceGet(device), "cuDeviceGet")
    name = check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName").split(b"\0")[0].decode()
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute")
    minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute")
    version = check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    try:
        check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        free, _total = check(driver.cuMemGetInfo(), "cuMemGetInfo")
    finally:
        check(driver.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
    return MachineFacts(free_bytes=int(free), gpu_name=name, compute_capability=f"{major}.{minor}",
                        driver_version=int(version))


def facts_for(contract: Contract) -> MachineFacts:
    return cpu_facts() if contract.target.name == CPU_TARGET else gpu_facts()


def check_target(contract: Contract, facts: MachineFacts) -> None:
    """Refuses (target_mismatch, driver_too_old, insufficient_memory) a machine that cannot honour the contract."""
    t = contract.target
    if t.name != CPU_TARGET:
        if facts.gpu_name is None:
            reason = facts.no_gpu_reason or "no GPU"
            raise Refusal("no_gpu", f"this bundle targets {t.name} ({t.sm_arch}); this machine has no usable GPU: "
                          f"{reason}", target=t.name, reason=reason)
        name = facts.gpu_name.lower()
        if facts.compute_capability != t.compute_capability or (t.gpu_names and not any(g in name for g in t.gpu_names)):
            raise Refusal("target_mismatch", f"this bundle targets {t.name} (compute capability {t.compute_capability}, "
                          f"GPU names {list(t.gpu_names)}); this machine has {facts.gpu_name} (compute capability "
                          f"{facts.compute_capability}); build a bundle for this GPU",
                          expected=t.name, expected_cc=t.compute_capability, found=facts.gpu_name,
                          found_cc=facts.compute_capability)
        if t.min_driver_version is not None and (facts.driver_version or 0) < t.min_driver_version:
            raise Refusal("driver_too_old", f"driver version {facts.driver_version} is older than the "
                          f"{t.min_driver_version} this bundle needs; update the driver",
                          needed=t.min_driver_version, found=facts.driver_version)
    need = contract.memory.total_bytes
    if facts.free_bytes < need:
        raise Refusal("insufficient_memory", f"the bundle needs {need / 2**20:.1f} MiB; "
                      f"{facts.free_bytes / 2**20:.1f} MiB are free; free memory or build a smaller tier",
                      needed=need, available=facts.free_bytes)


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
