"""The paged KV cache: a pool of fixed-size pages and a block table per sequence slot."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import RequestError
from .model_config import ModelConfig

KV_DTYPES = {"bf16": np.dtype(ml_dtypes.bfloat16), "fp32": np.dtype(np.float32)}


class PagedKVPool:
    """K and V per layer as (num_pages, page_size, kv_heads, head_dim) arrays, pages handed out per slot.

    Pages are reserved for a sequence's whole lifetime at admission (prompt plus maximum
    answer), so an admitted sequence never runs out of cache. Free pages and slots are
    handed out lowest first, so the same request sequence always lands on the same pages.
    """

    def __init__(self, cfg: ModelConfig, num_pages: int, page_size: int, max_seqs: int,
                 max_tokens_per_seq: int, kv_dtype: str = "bf16"):
        self.page_size = page_size
        self.num_pages = num_pages
        self.dtype = KV_DTYPES[kv_dtype]
        shape = (num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = [np.zeros(shape, self.dtype) for _ in range(cfg.num_layers)]
        self.v = [np.zeros(shape, self.dtype) for _ in range(cfg.num_layers)]
        self.max_pages_per_seq = -(-max_tokens_per_seq // page_size)
        self.block_table = np.full((max_seqs, self.max_pages_per_seq), -1, np.int32)  # (slots, pages/seq) page ids
        self.reserved_tokens = np.zeros(max_seqs, np.int64)
        self._free_pages = list(range(num_pages - 1, -1, -1))  # a stack popping the lowest id first
        self._free_slots = list(range(max_seqs - 1, -1, -1))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

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
            raise RequestError("too_many_sequences", f"all {self.block_table.shape[0]} sequence slots are busy; "
                               "retry when a sequence finishes", limit=int(self.block_table.shape[0]))
        if need > len(self._free_pages):
            raise RequestError("kv_pages", f"the request needs {need} KV pages, {len(self._free_pages)} are free; "
                               "retry when a sequence finishes", needed=need, free=len(self._free_pages))
        slot = self._free_slots.pop()
        for i in range(need):
            self.block_table[slot, i] = self._free_pages.pop()
        self.reserved_tokens[slot] = need * self.page_size
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

    def write(self, layer: int, slots: np.ndarray, positions: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Stores k, v (T, kv_heads, head_dim) float32 at each row's (slot, position)."""
        assert (positions < self.reserved_tokens[slots]).all(), "position beyond the slot's reserved pages"
        pages = self.block_table[slots, positions // self.page_size]
        offsets = positions % self.page_size
        self.k[layer][pages, offsets] = k.astype(self.dtype)
        self.v[layer][pages, offsets] = v.astype(self.dtype)

    def gather(self, layer: int, slot: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """(length, kv_heads, head_dim) float32 K and V of positions 0..length-1 of a slot."""
        pages = self.block_table[slot, : self.pages_for(length)]
        k = self.k[layer][pages].reshape(-1, *self.k[layer].shape[2:])[:length]
        v = self.v[layer][pages].reshape(-1, *self.v[layer].shape[2:])[:length]
        return k.astype(np.float32), v.astype(np.float32)
