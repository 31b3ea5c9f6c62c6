"""What a launch ran, counted by the executor when asked (SimGpu(stats=...)): the figures of
``python -m toolcall.kernels.sim stats`` (layer_stats.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class LaunchStats:
    """What a launch ran: dynamic instructions (lane-instructions and warp-instructions), approximate ones by
    opcode, global accesses (bytes requested vs 32-byte sectors touched per warp instruction), shared
    accesses and their bank-conflict ways."""

    lane_instructions: int = 0
    steps: int = 0
    approximate: dict[str, int] = field(default_factory=dict)
    global_bytes: int = 0  # distinct bytes each warp instruction asked for, summed
    global_sectors: int = 0  # 32-byte sectors those bytes lie in, summed over warp instructions
    global_requests: int = 0
    shared_requests: int = 0
    shared_wavefronts: int = 0  # the most distinct 4-byte words one bank serves, per warp instruction
    shared_ideal: int = 0  # the fewest wavefronts the instruction's distinct words need (32 words each)
    sector_touches: list = field(default_factory=list)  # per warp instruction, the sectors it touched (arrays)

    def bytes_touched_again(self) -> int:
        """Bytes of sectors touched by more than one warp instruction (each extra touch counted): what a cache
        must hold for the kernel to read its data from DRAM once."""
        if not self.sector_touches:
            return 0
        _, counts = np.unique(np.concatenate(self.sector_touches), return_counts=True)
        return int((counts - 1).sum()) * 32

    def add(self, other: "LaunchStats") -> None:
        for k in ("lane_instructions", "steps", "global_bytes", "global_sectors", "global_requests",
                  "shared_requests", "shared_wavefronts", "shared_ideal"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for k, v in other.approximate.items():
            self.approximate[k] = self.approximate.get(k, 0) + v
