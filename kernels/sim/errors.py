"""The executor's typed errors: a kernel the executor cannot run, and what the sanitizers find.

``SimUnsupported`` (code ``sim_unsupported``): an instruction or directive the executor does not know,
named with the kernel and PTX line. ``SimFault`` (code ``sim_fault``): a sanitizer finding or a hardware
fault; ``kind`` is one of ``FAULT_KINDS`` and ``where`` names kernel, source line, block and thread.
"""
from __future__ import annotations

from toolcall.common.errors import CudaError

# out_of_bounds: global/shared/local access outside its allocation; misaligned: an address not a multiple of
# the access size; uninitialized: a shared read of bytes never written; race: two threads of a block touch one
# shared address between the same two barriers, one writing; sync: a barrier or warp-synchronous instruction
# reached by part of the threads its mask names; hang: a launch past its instruction budget; order: a launch
# whose output depends on the order blocks and atomics ran in (two seeds, two results).
FAULT_KINDS = ("out_of_bounds", "misaligned", "uninitialized", "race", "sync", "hang", "order")


class SimUnsupported(CudaError):
    """A PTX construct the executor does not run (never skipped)."""

    def __init__(self, message: str, **details):
        super().__init__("sim_unsupported", message, **details)


class SimFault(CudaError):
    """A sanitizer finding or fault in a simulated launch."""

    def __init__(self, kind: str, message: str, **details):
        assert kind in FAULT_KINDS, kind
        super().__init__("sim_fault", f"{kind}: {message}", kind=kind, **details)
        self.kind, self.what = kind, message
