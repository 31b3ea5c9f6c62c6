"""The simulated device's global memory: one flat byte heap holding named allocations.

Addresses start at ``BASE``; each allocation is 256-byte aligned and followed by at least 256 unallocated
bytes, so an access just past its end touches no other allocation. ``check`` finds, for each address of an
access, the live allocation that holds all its bytes (a freed allocation holds none: use after free is out of
bounds). The heap grows by doubling; freed ranges are reused first-fit.
"""
from __future__ import annotations

import bisect

import numpy as np

BASE = 1 << 40
ALIGN = 256
GUARD = 256


class GlobalMemory:
    """Allocations in a flat heap: ``alloc`` / ``free``, host views, vectorised bounds checks."""

    def __init__(self, initial_bytes: int = 1 << 24):
        self.heap = np.zeros(initial_bytes, np.uint8)
        self.top = 0  # heap offset past the last allocation
        self.live: dict[int, tuple[int, str]] = {}  # address -> (bytes, label)
        self.holes: list[tuple[int, int]] = []  # (offset, bytes) free ranges, by offset
        self._bases = np.zeros(0, np.uint64)
        self._ends = np.zeros(0, np.uint64)

    @property
    def allocated_bytes(self) -> int:
        return sum(size for size, _ in self.live.values())

    def alloc(self, nbytes: int, label: str = "") -> int:
        need = -(-(max(int(nbytes), 1) + GUARD) // ALIGN) * ALIGN
        for k, (off, size) in enumerate(self.holes):
            if size >= need:
                self.holes[k:k + 1] = [(off + need, size - need)] if size > need else []
                break
        else:
            off = self.top
            self.top += need
            if self.top > len(self.heap):
                grown = np.zeros(max(2 * len(self.heap), self.top), np.uint8)
                grown[:len(self.heap)] = self.heap
                self.heap = grown
        self.heap[off:off + need] = 0
        address = BASE + off
        self.live[address] = (int(nbytes), label)
        self._index()
        return address

    def free(self, address: int) -> None:
        size, _ = self.live.pop(address)
        need = -(-(max(size, 1) + GUARD) // ALIGN) * ALIGN
        bisect.insort(self.holes, (address - BASE, need))
        merged: list[tuple[int, int]] = []
        for off, n in self.holes:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((off, n))
        self.holes = merged
        self._index()

    def _index(self) -> None:
        bases = sorted(self.live)
        self._bases = np.array(bases, np.uint64)
        self._ends = np.array([b + self.live[b][0] for b in bases], np.uint64)

    def check(self, addr: np.ndarray, nbytes: int) -> np.ndarray:
        """Bool per address: all ``nbytes`` bytes from it lie in one live allocation."""
        addr = np.asarray(addr, np.uint64)
        if not len(self._bases):
            return np.zeros(addr.shape, bool)
        i = np.searchsorted(self._bases, addr, side="right").astype(np.int64) - 1
        ok = i >= 0
        j = np.maximum(i, 0)
        return ok & (addr >= self._bases[j]) & (addr + np.uint64(nbytes) <= self._ends[j])

    def owner(self, address: int) -> str:
        """The allocation nearest below ``address``, for messages."""
        below = [b for b in self.live if b <= address]
        if not below:
            return "below every allocation"
        b = max(below)
        size, label = self.live[b]
        return f"{address - b} bytes into {label or 'an allocation'} of {size} bytes at {b:#x}"

    def offsets(self, addr: np.ndarray) -> np.ndarray:
        return (np.asarray(addr, np.uint64) - np.uint64(BASE)).astype(np.int64)

    def host_view(self, address: int, nbytes: int) -> np.ndarray:
        """The bytes [address, address + nbytes) as a writable uint8 view; ValueError if outside an allocation."""
        if nbytes and not self.check(np.array([address], np.uint64), nbytes)[0]:
            raise ValueError(f"{nbytes} bytes at {address:#x} are not inside one allocation ({self.owner(address)})")
        off = address - BASE
        return self.heap[off:off + nbytes]
