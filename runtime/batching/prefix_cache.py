"""Which full KV pages hold which prompt prefix: chained page hashes, pinned pages, LRU of idle ones.

A full page i of a prompt is keyed by ``h_i = sha256(h_{i-1} || tokens of page i as int64 LE)``
with ``h_-1 = sha256("toolcall-prefix" || salt)`` (the salt is the bundle id: pages of another
bundle's weights never match). A page's K/V depend on every token before it, which the chain
covers, so two prompts that share ``h_i`` share pages 0..i bit for bit.

Page states (runtime/batching/pages.py holds the reference counts):
- pinned: the template's fixed prefix, prefilled at load; never evicted.
- cached: registered here; referenced by running sequences, or idle (no reference) and then
  evictable, least recently used first and, among pages used at the same admission, the
  deepest (tail) first, so a chain is cut from its end, never orphaning a cached tail.
"""
from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence

import numpy as np


def root_hash(salt: str) -> bytes:
    """h_-1, the chain's start for a bundle."""
    return hashlib.sha256(b"toolcall-prefix\0" + salt.encode()).digest()


def chain_hashes(salt: str, tokens: Sequence[int], page_size: int, pages: int) -> list[bytes]:
    """h_0..h_{pages-1} of the first ``pages`` full pages of ``tokens``."""
    h = root_hash(salt)
    arr = np.asarray(tokens[: pages * page_size], np.int64)
    out = []
    for i in range(pages):
        h = hashlib.sha256(h + arr[i * page_size:(i + 1) * page_size].astype("<i8").tobytes()).digest()
        out.append(h)
    return out


def tail_hash(before: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a prompt's partial last page: the hash of the full pages ``before`` it (h_-1 if none)
    and its ``tokens`` (fewer than a page; its own domain, never equal to a full page's h_i)."""
    return hashlib.sha256(b"tail\0" + before + np.asarray(tokens, np.int64).astype("<i8").tobytes()).digest()


class PrefixCache:
    """hash -> page for full prompt pages; an LRU heap of the idle ones; hit/query counters in tokens."""

    def __init__(self, salt: str):
        self.salt = salt
        self.root = root_hash(salt)
        self.page_of: dict[bytes, int] = {}
        self.key_of: dict[int, tuple[bytes, int]] = {}  # page -> (hash, depth: page index in its prompt)
        self.pinned: set[int] = set()
        self._idle: dict[int, int] = {}  # evictable page -> tick it became idle at
        self._heap: list[tuple[int, int, int]] = []  # (tick, -depth, page); stale entries skipped
        self._tick = 0
        self.query_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of which served from cached or pinned pages (the copied tail included)

    @property
    def idle_pages(self) -> int:
        return len(self._idle)

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """Pages of the longest cached chain h_0..h_k (stops at the first miss)."""
        pages = []
        for h in hashes:
            page = self.page_of.get(h)
            if page is None:
                break
            pages.append(page)
        return pages

    def insert(self, page: int, h: bytes, depth: int, pinned: bool = False) -> None:
        assert h not in self.page_of and page not in self.key_of
        self.page_of[h] = page
        self.key_of[page] = (h, depth)
        if pinned:
            self.pinned.add(page)

    def contains(self, page: int) -> bool:
        return page in self.key_of

    def touch(self, page: int) -> None:
        """A sequence references the page: it is no longer evictable."""
        self._idle.pop(page, None)

    def idle_batch(self, pages: Sequence[int]) -> None:
        """Pages of one sequence whose last reference went away, evictable from now (pinned pages never
        are); one tick for all of them, so the deeper ones go first."""
        self._tick += 1
        for page in pages:
            if page not in self.pinned:
                self._idle[page] = self._tick
                heapq.heappush(self._heap, (self._tick, -self.key_of[page][1], page))
        if len(self._heap) > 2 * len(self._idle) + 64:  # mostly stale (pages touched again since): rebuilt, so
            # a long-running server's heap stays O(idle pages), not O(requests served)
            self._heap = [(tick, -self.key_of[page][1], page) for page, tick in self._idle.items()]
            heapq.heapify(self._heap)

    def evict(self) -> int | None:
        """Forgets the least recently used idle page (tails before heads) and returns it; None if none."""
        while self._heap:
            tick, _, page = heapq.heappop(self._heap)
            if self._idle.get(page) == tick:
                del self._idle[page]
                h, _ = self.key_of.pop(page)
                del self.page_of[h]
                return page
        return None


def prefill_prefix(model, kv, prefix_ids: Sequence[int], chunk: int) -> None:
    """Computes the fixed prefix's K/V once (rows of ``chunk`` tokens through ``model.forward``) and pins
    its pages in ``kv`` (a PageAllocator with the prefix cache on). An empty prefix pins nothing."""
    n = len(prefix_ids)
    if n == 0:
        return
    slot = kv.admit(n)
    try:
        ids = np.asarray(prefix_ids, np.int64)
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            model.forward(ids[start:stop], np.full(stop - start, slot, np.int64), np.arange(start, stop), kv)
        kv.pin_prefix(slot, prefix_ids)
    except BaseException:
        kv.release(slot, cache=False)
        raise
