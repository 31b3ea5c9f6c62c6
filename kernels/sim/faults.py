"""Device faults a SimGpu injects on request, reported as a card reports them (CudaError "cuda_error" naming the
driver call and the error name), so the host side's handling of a failing device is tested without one.

A fault is ``KIND:OPERATION:N``: the N-th (0-based, counted from the device's creation) call of OPERATION
(``launch``, ``copy``: copy_in / download / copy_device, or ``alloc``) fails with KIND:
- ``illegal_address`` (launch or copy): CUDA_ERROR_ILLEGAL_ADDRESS, sticky: every later call of the
  context fails with it too, as on a card (the context is lost; only a new process recovers);
- ``launch_failed`` (launch): CUDA_ERROR_LAUNCH_FAILED, sticky likewise;
- ``out_of_memory`` (alloc): CUDA_ERROR_OUT_OF_MEMORY, that call only (the allocation is refused).
``runtime ... --device sim`` reads faults from the environment variable ``TOOLCALL_SIM_FAULTS`` (comma-separated),
the test hook of the serving tests; a malformed value is a usage error, never ignored.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from toolcall.common.errors import CudaError, EngineError

ENV = "TOOLCALL_SIM_FAULTS"
OPERATIONS = ("launch", "copy", "alloc")
# kind -> (the driver's error name, sticky, the operations it may be injected on)
FAULTS = {
    "illegal_address": ("CUDA_ERROR_ILLEGAL_ADDRESS", True, ("launch", "copy")),
    "launch_failed": ("CUDA_ERROR_LAUNCH_FAILED", True, ("launch",)),
    "out_of_memory": ("CUDA_ERROR_OUT_OF_MEMORY", False, ("alloc",)),
}
# the driver call each operation stands for, as the card's errors name it
CALLS = {"launch": "cuLaunchKernel", "copy": "cuMemcpy", "alloc": "cuMemAlloc"}


@dataclass(frozen=True)
class Fault:
    """KIND on the ``at``-th call (0-based) of ``operation``."""

    kind: str
    operation: str
    at: int

    def __post_init__(self):
        if self.kind not in FAULTS or self.operation not in FAULTS[self.kind][2] or self.at < 0:
            raise EngineError("usage", f"a simulated fault is KIND:OPERATION:N with KIND:OPERATION one of "
                              f"{', '.join(f'{k}:{op}' for k, f in FAULTS.items() for op in f[2])} and N >= 0; got "
                              f"{self.kind}:{self.operation}:{self.at}", kind=self.kind, operation=self.operation,
                              at=self.at)

    @property
    def sticky(self) -> bool:
        return FAULTS[self.kind][1]

    def error(self, what: str) -> CudaError:
        name = FAULTS[self.kind][0]
        return CudaError("cuda_error", f"{CALLS[self.operation]} failed: {name} ({what}; injected by the simulated "
                         f"device)", call=CALLS[self.operation], error=name, injected=True)

    @classmethod
    def parse(cls, text: str) -> "Fault":
        parts = text.strip().split(":")
        if len(parts) != 3 or not parts[2].strip().isdigit():
            raise EngineError("usage", f"{ENV}: a fault is KIND:OPERATION:N (e.g. illegal_address:launch:40), got "
                              f"{text!r}", found=text)
        return cls(parts[0].strip(), parts[1].strip(), int(parts[2]))


def faults_from_env(environ=os.environ) -> tuple[Fault, ...]:
    """The faults ``TOOLCALL_SIM_FAULTS`` names (none when unset or empty)."""
    return tuple(Fault.parse(t) for t in environ.get(ENV, "").split(",") if t.strip())


class FaultPlan:
    """Counts a device's calls by operation and raises the planned fault on its call; after a sticky fault every
    call raises the same error (the lost context)."""

    def __init__(self, faults=()):
        self.faults = tuple(faults)
        self.calls = dict.fromkeys(OPERATIONS, 0)
        self.lost: CudaError | None = None

    def call(self, operation: str, what: str) -> None:
        """Before a device call of ``operation`` (``what``: the kernel or copy, for the message)."""
        if self.lost is not None:
            raise self.lost
        n = self.calls[operation]
        self.calls[operation] = n + 1
        for fault in self.faults:
            if fault.operation == operation and fault.at == n:
                err = fault.error(what)
                if fault.sticky:
                    self.lost = err
                raise err
