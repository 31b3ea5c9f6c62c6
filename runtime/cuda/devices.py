"""Where a GPU bundle runs: ``native``, this machine's GPU through the driver, or ``sim``, the simulated device
(toolcall.kernels.sim: the bundle's kernels as PTX on the CPU executor, its memory, graphs and faults), which
checks answers, not speed. ``runtime ... --device sim`` chooses it; nothing chooses it implicitly.

The simulated device presents the contract's own GPU: the target's name and compute capability, the driver the
target needs, and the memory the contract says the bundle needs; its allocations may hold that total less the
context reserve (the driver's share on a card) and are refused past it, as a card that tight would refuse them.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from toolcall.common.errors import EngineError
from toolcall.runtime.bundle.contract import CPU_TARGET, Contract
from toolcall.runtime.bundle.machine import MachineFacts, facts_for

SIM_NOTICE = ("device: {gpu} (the bundle's kernels run as PTX on the CPU executor): it checks answers, "
              "not speed")


@dataclass(frozen=True)
class Device:
    """One place a bundle runs. ``facts(contract)``: what check_target compares the contract with; ``gpu(contract)``:
    the launch.Gpu a CudaModel takes (None: the model retains device 0's primary context itself); ``notice``: said
    once on stderr when this device is used (None: nothing); ``stale_s``: how long a server's engine loop may go
    without a beat (one step) and still count as live (None: the server's own bound); ``request_timeout_s``: a
    served request's deadline where neither it nor `runtime serve --request-timeout` sets one."""

    name: str
    summary: str
    facts: Callable[[Contract], MachineFacts]
    gpu: Callable[[Contract], object | None]
    notice: Callable[[Contract], str | None] = lambda contract: None
    stale_s: float | None = None
    request_timeout_s: float = 60.0


def sim_gpu_name(contract: Contract) -> str:
    """The simulated device's name: the target's first GPU name, else its architecture ("simulated H200")."""
    t = contract.target
    return f"simulated {(t.gpu_names[0].upper() if t.gpu_names else t.sm_arch)}"


def _sim_facts(contract: Contract) -> MachineFacts:
    t = contract.target
    return MachineFacts(free_bytes=contract.memory.total_bytes, gpu_name=sim_gpu_name(contract),
                        compute_capability=t.compute_capability, driver_version=t.min_driver_version)


def _sim_gpu(contract: Contract):
    from toolcall.kernels.sim.device import SimGpu
    from toolcall.kernels.sim.faults import faults_from_env
    m = contract.memory
    return SimGpu(contract.target.sm_arch, name=sim_gpu_name(contract), faults=faults_from_env(),
                  capacity=m.total_bytes - m.context_reserve_bytes, order_every_launch=False)


DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("native", "the bundle's own target on this machine: the CPU, or the GPU its contract names", facts_for,
           lambda contract: None),
    Device("sim", "a GPU bundle on the simulated device, presenting the contract's GPU (its kernels' PTX on the "
           "CPU executor): checks answers, not speed, and says so on stderr", _sim_facts, _sim_gpu, lambda contract: SIM_NOTICE.format(gpu=sim_gpu_name(contract)),
           # steps take seconds there, a burst of 64 minutes (RESULTS "Simulated device: GPU bundles end to end on
           # the CPU")
           stale_s=600.0, request_timeout_s=3600.0),
)}
NATIVE = "native"


def device_for(name: str, contract: Contract) -> Device:
    """The device ``name`` (DEVICES) for this contract; EngineError("usage") for an unknown name, or ``sim`` with
    a CPU bundle (nothing to simulate)."""
    if name not in DEVICES:
        raise EngineError("usage", f"--device {name!r}: the devices are {', '.join(DEVICES)}", option="device",
                          value=name)
    if name != NATIVE and contract.target.name == CPU_TARGET:
        raise EngineError("usage", f"--device {name}: runs GPU bundles; this bundle's target is cpu: leave the "
                          "option out", option="device", value=name, target=contract.target.name)
    return DEVICES[name]


_said: set[str] = set()


def say_notice(device: Device, contract: Contract) -> None:
    """The device's notice on stderr, once a process (a server's lanes and reloads say it once)."""
    text = device.notice(contract)
    if text and text not in _said:
        _said.add(text)
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
