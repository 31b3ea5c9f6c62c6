"""The paged KV cache's bookkeeping: sequence slots, free pages and the block table.

Shared by the numpy pool (runtime/cpu/kv_pool.py) and the device pool (runtime/cuda/kv.py): the
storage differs, the allocation rules do not. Pages are reserved for a sequence's whole
lifetime at admission (prompt plus maximum answer), so an admitted sequence never runs out
of cache. Free pages and slots are handed out lowest first, so the same request sequence
always lands on the same pages.
"""
from __future__ import annotations

import numpy as np

from common.errors import RequestError


class PageAllocator:
    """Slots and pages of a pool of ``num_pages`` pages of ``page_size`` tokens."""

    def __init__(self, num_pages: int, page_size: int, max_seqs: int, max_tokens_per_seq: int):
        self.page_size = page_size
        self.num_pages = num_pages
        self.max_pages_per_seq = -(-max_tokens_per_seq // page_size)
        self.block_table = np.full((max_seqs, self.max_pages_per_seq), -1, np.int32)  # (slots, pages/seq) page ids
        self.reserved_tokens = np.zeros(max_seqs, np.int64)
        self._free_pages = list(range(num_pages - 1, -1, -1))  # a stack popping the lowest id first
        self._free_slots = list(range(max_seqs - 1, -1, -1))
        self.version = 0  # bumped whenever block_table changes (device mirrors re-upload on change)

    @property
    def max_seqs(self) -> int:
        return int(self.block_table.shape[0])

    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def admit(self, tokens: int) -> int:
        """Reserves a slot and the pages for ``tokens`` tokens; returns the slot."""
        need = self.pages_for(tokens)
        if need > self.max_pages_per_seq:
            raise RequestError("prompt_too_long", f"a sequence of {tokens} tokens needs {need} pages; the contract "
                               f"allows {self.max_pages_per_seq} per sequence",
                               limit=self.max_pages_per_seq * self.page_size, got=tokens)
        if not self._free_slots:
            raise RequestError("too_many_sequences", f"all {self.max_seqs} sequence slots are busy; "
                               "retry when a sequence finishes", limit=self.max_seqs)
        if need > len(self._free_pages):
            raise RequestError("kv_pages", f"the request needs {need} KV pages, {len(self._free_pages)} are free; "
                               "retry when a sequence finishes", needed=need, free=len(self._free_pages))
        slot = self._free_slots.pop()
        for i in range(need):
            self.block_table[slot, i] = self._free_pages.pop()
        self.reserved_tokens[slot] = need * self.page_size
        self.version += 1
        return slot

    def release(self, slot: int) -> None:
        pages = self.block_table[slot]
        for p in sorted(pages[pages >= 0].tolist(), reverse=True):
            self._free_pages.append(p)
        self._free_pages.sort(reverse=True)
        self.block_table[slot] = -1
        self.reserved_tokens[slot] = 0
        self._free_slots.append(slot)
        self._free_slots.sort(reverse=True)
        self.version += 1

    def check_rows(self, slots: np.ndarray, positions: np.ndarray) -> None:
        """Asserts every (slot, position) row lies inside its slot's reserved pages."""
        assert (positions < self.reserved_tokens[slots]).all(), "position beyond the slot's reserved pages"
