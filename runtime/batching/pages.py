"""The paged KV cache's bookkeeping: sequence slots, free pages, reference counts and the block table.

Shared by the numpy pool (runtime/cpu/kv_pool.py) and the device pool (runtime/cuda/kv.py): the
storage differs, the allocation rules do not. Pages are reserved for a sequence's whole
lifetime at admission (prompt plus maximum answer), so an admitted sequence never runs out
of cache. Free pages and slots are handed out lowest first, so the same request sequence
always lands on the same pages.

Prefix sharing (off until ``enable_prefix_cache``): a block table may point at pages other
sequences also read. ``refs[p]`` counts the block tables holding page p plus one for a pinned
page. Shared pages are read-only: every row a step writes must lie in a page of its own
(``check_rows``). At admission the prompt's leading full pages that are pinned or cached
(runtime/batching/prefix_cache.py) are shared instead of allocated, and when the prompt continues with
the pinned prefix's partial last page, its rows are copied into the sequence's own page
(``copy_rows``, by the storage subclass); ``cached_tokens[slot]`` is where prefill starts. A
sequence's full prompt pages are cached once its prompt is prefilled (``register_prompt``: prompts
admitted while it still runs share them) and stay cached, idle, after it finishes, until the pool
needs a page.

The page holding a prompt's last token is its own (the answer is written after the prompt's rows),
so it is never shared; but once the prompt is prefilled its prompt rows are final, and the page is
registered under the prompt's tail key (``tail_hash``). A later prompt identical up to its last
token, whose other pages are all shared, copies those rows (all but the last token's, which is
always computed) into its own page instead of prefilling them: the same bits, since a row's K/V
depend only on the tokens up to it. A tail page is not read-only; it stays cached, idle, after its
sequence finishes, like a full page, and is evicted like one. When the sequence that owns it finishes,
its answer rows stay too, as a transcript (runtime/batching/answer_cache.py): a later identical prompt copies
the rows of each answer chunk whose tokens match (``copy_answer_rows``) and computes only the rows
that pick a token.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from toolcall.common.errors import RequestError
from toolcall.runtime.batching.answer_cache import AnswerCache, Transcript, answer_page_key
from toolcall.runtime.batching.prefix_cache import PrefixCache, chain_hashes, tail_hash

NO_PROMPT = np.iinfo(np.int64).max  # prompt_tokens of a slot admitted without its prompt


class PageAllocator:
    """Slots and pages of a pool of ``num_pages`` pages of ``page_size`` tokens."""

    def __init__(self, num_pages: int, page_size: int, max_seqs: int, max_tokens_per_seq: int):
        self.page_size = page_size
        self.num_pages = num_pages
        self.max_pages_per_seq = -(-max_tokens_per_seq // page_size)
        self.block_table = np.full((max_seqs, self.max_pages_per_seq), -1, np.int32)  # (slots, pages/seq) page ids
        self.reserved_tokens = np.zeros(max_seqs, np.int64)
        self.cached_tokens = np.zeros(max_seqs, np.int64)  # prompt tokens a slot starts with (shared or copied)
        # prompt length of a slot admitted with its prompt (else NO_PROMPT): rows at or past it are the
        # answer's (runtime/cpu/model.py computes those one by one, see GEMM_ROWS there)
        self.prompt_tokens = np.full(max_seqs, NO_PROMPT, np.int64)
        self.refs = np.zeros(num_pages, np.int32)  # block tables holding the page, + 1 if pinned
        self.read_only = np.zeros(num_pages, bool)  # pinned or cached: never written again
        self._free_pages = list(range(num_pages))  # a min-heap: the lowest free id is taken first
        self._free_slots = list(range(max_seqs - 1, -1, -1))
        self._hashes: list[list[bytes] | None] = [None] * max_seqs  # caching only: full prompt pages' keys
        self._tails: list[bytes | None] = [None] * max_seqs  # caching only: the prompt's partial last page's key
        self.cache: PrefixCache | None = None
        self.answers: AnswerCache | None = None  # with the cache, on storage that copies rows
        self._transcript: list[Transcript | None] = [None] * max_seqs  # the one a slot's prompt matched
        self.prefix_ids: tuple[int, ...] = ()  # the pinned prefix (enable_prefix_cache + pin_prefix)
        self.prefix_pages: list[int] = []  # its full pages, then the partial one (if any)
        self.version = 0  # bumped whenever block_table changes (device mirrors re-upload on change)

    @property
    def max_seqs(self) -> int:
        return int(self.block_table.shape[0])

    @property
    def free_pages(self) -> int:
        """Pages an admission can take now: free ones and idle cached ones (evicted on demand)."""
        return len(self._free_pages) + (self.cache.idle_pages if self.cache is not None else 0)

    @property
    def pinned_pages(self) -> int:
        return len(self.prefix_pages)

    @property
    def pages_in_use(self) -> int:
        """Pages held by admitted sequences: neither free, nor idle in the cache, nor the pinned prefix."""
        return self.num_pages - self.pinned_pages - self.free_pages

    @property
    def prefix_query_tokens(self) -> int:
        """Prompt tokens looked up in the prefix cache so far (0 with it off)."""
        return self.cache.query_tokens if self.cache is not None else 0

    @property
    def prefix_hit_tokens(self) -> int:
        """Of those, tokens served from pinned or cached pages (no prefill)."""
        return self.cache.hit_tokens if self.cache is not None else 0

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    # ---- prefix sharing ----
    def enable_prefix_cache(self, salt: str) -> None:
        """Turns on sharing of pinned and cached prompt pages; ``salt`` (the bundle id) keys the hashes."""
        assert self.cache is None and self.free_slots == self.max_seqs, "enable before any admission"
        self.cache = PrefixCache(salt)
        if self.copies_rows:
            self.answers = AnswerCache(self.page_size)

    def pin_prefix(self, slot: int, prefix_ids: Sequence[int]) -> None:
        """Pins the pages of ``slot``, which holds the K/V of ``prefix_ids`` (all prefilled), as the shared
        fixed prefix: full pages cached for good, the partial last page kept to be copied; frees the slot."""
        assert self.cache is not None and not self.prefix_pages
        ps, n = self.page_size, len(prefix_ids)
        pages = [int(p) for p in self.block_table[slot, : self.pages_for(n)]]
        for depth, (page, h) in enumerate(zip(pages, chain_hashes(self.cache.salt, prefix_ids, ps, n // ps))):
            self.cache.insert(page, h, depth, pinned=True)
        self.prefix_ids, self.prefix_pages = tuple(int(t) for t in prefix_ids), pages
        self.read_only[pages] = True  # refs stay 1: the pin
        self._free_slot(slot)

    def _share_plan(self, prompt: Sequence[int]) -> tuple[list[bytes], list[int], int, int, bytes | None]:
        """(hashes of the prompt's full pages, pages to share, the page to copy rows from (-1: none), how
        many rows to copy, the key of the prompt's partial last page (None: it ends on a page boundary)).
        The rows copied are the pinned prefix's partial page, or those of a cached page holding this
        prompt's last page (a tail page, or the full last page), less the last token, which is computed."""
        ps, n = self.page_size, len(prompt)
        hashes = chain_hashes(self.cache.salt, prompt, ps, n // ps)
        last = (n - 1) // ps  # the page of the last prompt token: never shared
        shared = self.cache.lookup(hashes[:last])
        tail = tail_hash(hashes[-1] if hashes else self.cache.root, prompt[len(hashes) * ps:]) if n % ps else None
        if len(shared) == last and self.copies_rows:  # the rows before the last (maybe none), its transcript
            src = self.cache.page_of.get(tail if tail is not None else hashes[last], -1)
            if src >= 0:
                return hashes, shared, src, n - 1 - last * ps, tail
        full = len(self.prefix_ids) // ps
        rest = len(self.prefix_ids) - full * ps
        if (rest and len(shared) == full and shared == self.prefix_pages[:full] and n - 1 >= full * ps + rest
                and tuple(prompt[full * ps: full * ps + rest]) == self.prefix_ids[full * ps:]):
            return hashes, shared, self.prefix_pages[full], rest, tail
        return hashes, shared, -1, 0, tail

    def check_fits(self, tokens: int, prompt: Sequence[int] | None = None) -> None:
        """RequestError("kv_pages") if this sequence could not be admitted even into an idle pool."""
        need = self.pages_for(tokens)
        pinned = len(self.prefix_pages)
        if need <= self.num_pages - pinned:  # fits without sharing: no need to hash the prompt
            return
        if self.cache is not None and prompt is not None:
            _, shared, _, _, _ = self._share_plan(prompt)
            need -= sum(1 for p in shared if p in self.cache.pinned)
        if need > self.num_pages - pinned:
            raise RequestError("kv_pages", f"the request needs {need} KV pages; the pool has {self.num_pages - pinned} "
                               f"in all beside {pinned} pinned prefix pages", needed=need,
                               free=self.num_pages - pinned)

    # ---- admission ----
    def admit(self, tokens: int, prompt: Sequence[int] | None = None) -> int:
        """Reserves a slot and the pages for ``tokens`` tokens; returns the slot.

        With the prefix cache on and ``prompt`` given, the prompt's leading pinned or cached full
        pages are shared (counted once) and ``cached_tokens[slot]`` says how many prompt tokens
        need no prefill."""
        need = self.pages_for(tokens)
        if need > self.max_pages_per_seq:
            raise RequestError("prompt_too_long", f"a sequence of {tokens} tokens needs {need} pages; the contract "
                               f"allows {self.max_pages_per_seq} per sequence",
                               limit=self.max_pages_per_seq * self.page_size, got=tokens)
        if not self._free_slots:
            raise RequestError("too_many_sequences", f"all {self.max_seqs} sequence slots are busy; "
                               "retry when a sequence finishes", limit=self.max_seqs)
        use_cache = self.cache is not None and prompt is not None
        hashes, shared, src, copy, tail = [], [], -1, 0, None
        if use_cache:
            hashes, shared, src, copy, tail = self._share_plan(prompt)
        held = [p for p in shared if self.refs[p] == 0]  # idle now, so not takeable as fresh pages
        fresh = need - len(shared)
        idle_src = src >= 0 and self.refs[src] == 0  # an idle cached page to copy from (pinned ones hold a ref)
        if idle_src and fresh > self.free_pages - len(held) - 1:  # only its eviction makes room: nothing copied
            src, copy, idle_src = -1, 0, False
        if idle_src:
            held.append(src)
        idle_shared = len(held)
        if fresh > self.free_pages - idle_shared:
            raise RequestError("kv_pages", f"the request needs {fresh} KV pages, {self.free_pages - idle_shared} "
                               "are free; retry when a sequence finishes", needed=fresh,
                               free=self.free_pages - idle_shared)
        slot = self._free_slots.pop()
        for page in held:  # not evicted by the fresh pages taken below
            self.cache.touch(page)
        for i, page in enumerate(shared):
            self.block_table[slot, i] = page
            self.refs[page] += 1
        for i in range(len(shared), need):
            page = self._take_page()
            self.block_table[slot, i] = page
            self.refs[page] += 1
        if copy:
            self.copy_rows(src, int(self.block_table[slot, len(shared)]), copy)
        if idle_src:  # evictable again
            self.cache.idle_batch([src])
        if src >= 0 and self.answers is not None:
            t = self.answers.by_first.get(src)
            self._transcript[slot] = t if t is not None and t.prompt_len == len(prompt) else None
        self.reserved_tokens[slot] = need * self.page_size
        self.cached_tokens[slot] = len(shared) * self.page_size + copy
        self.prompt_tokens[slot] = len(prompt) if prompt is not None else NO_PROMPT
        if use_cache:
            self._hashes[slot], self._tails[slot] = hashes, tail
            self.cache.query_tokens += len(prompt)
            self.cache.hit_tokens += int(self.cached_tokens[slot])
        self.version += 1
        return slot

    def _take_page(self) -> int:
        if self._free_pages:
            return heapq.heappop(self._free_pages)
        page = self.cache.evict()  # admit checked there is one
        assert page is not None and self.refs[page] == 0
        self.read_only[page] = False
        if self.answers is not None:
            self.answers.evicted(page)
        return page

    @property
    def copies_rows(self) -> bool:
        """Whether the storage can ``copy_rows`` (bookkeeping alone cannot: it copies from no tail page)."""
        return type(self).copy_rows is not PageAllocator.copy_rows

    def copy_rows(self, src_page: int, dst_page: int, rows: int, first: int = 0) -> None:
        """Copies K/V rows first..first+rows-1 of every layer from one page to the same rows of another
        (the storage's job)."""
        raise NotImplementedError(f"{type(self).__name__} cannot copy pages; it cannot share a partial prefix page")

    def register_prompt(self, slot: int) -> None:
        """With the prefix cache on: the slot's full prompt pages (all written: its prompt is prefilled)
        become shareable now, by prompts admitted while this sequence still runs. Its later rows lie past
        its prompt, never in these pages, which are read-only from here on. The page of its last prompt
        token, if partial, is registered under the tail key: its prompt rows are final, and copied from."""
        hashes = self._hashes[slot]
        if self.cache is None or hashes is None:
            return
        for depth, (page, h) in enumerate(zip(self.block_table[slot, :len(hashes)].tolist(), hashes)):
            if not self.cache.contains(page) and h not in self.cache.page_of:
                self.cache.insert(page, h, depth)
                self.read_only[page] = True
        tail = self._tails[slot]
        if tail is not None and tail not in self.cache.page_of:
            page = int(self.block_table[slot, len(hashes)])
            if not self.cache.contains(page):
                self.cache.insert(page, tail, len(hashes))  # rows copied from, never shared: stays writable

    def copy_answer_rows(self, slot: int, output: list[int], fed: int, n: int) -> int:
        """Before a step feeds the slot ``n`` answer rows from answer token ``fed``: copies the leading
        ones its prompt's transcript holds for the same tokens (never the last, which picks) into the
        slot's own pages and returns how many; those rows need no computing."""
        t = self._transcript[slot]
        rows = self.answers.rows_to_copy(t, output, fed, n) if t is not None and n > 1 else 0
        if rows:
            for index, src, first, count in self.answers.spans(t, int(self.prompt_tokens[slot]) + fed, rows):
                self.copy_rows(src, int(self.block_table[slot, index]), count, first)
            self.cache.idle_batch([p for p in t.pages if self.refs[p] == 0])  # recently used: evicted later
            self.answers.copied_rows += rows
        return rows

    def _keep_answer(self, slot: int, answer: Sequence[int]) -> None:
        """At release: the answer rows of the sequence that owns its prompt's cached last page stay
        cached with that page, as its transcript (only the first owner's; the others' rows are freed)."""
        n, ps, hashes = int(self.prompt_tokens[slot]), self.page_size, self._hashes[slot]
        if self.answers is None or hashes is None or not answer:
            return
        last = (n - 1) // ps
        key = self._tails[slot] if self._tails[slot] is not None else hashes[last]
        first = int(self.block_table[slot, last])
        if self.cache.page_of.get(key) != first or first in self.answers.by_first:
            return
        pages = self.block_table[slot, last: (n + len(answer) - 1) // ps + 1].tolist()
        for i, page in enumerate(pages[1:], 1):
            self.cache.insert(page, answer_page_key(key, i), last + i)
        self.answers.keep(n, tuple(answer), last, pages)

    def release(self, slot: int, cache: bool = True, answer: Sequence[int] = ()) -> None:
        """Frees a slot; with the prefix cache on and ``cache``, its full prompt pages (all written:
        the sequence finished) stay cached for later prompts instead of going back to the free list
        (pages ``register_prompt`` registered stay cached either way), and so do the rows of ``answer``
        (the answer tokens whose rows it wrote) if it owns its prompt's cached last page."""
        row = self.block_table[slot]
        pages = [int(p) for p in row[row >= 0]]
        if cache:
            self.register_prompt(slot)
            self._keep_answer(slot, answer)
        idle = []
        for page in pages:
            self.refs[page] -= 1
            assert self.refs[page] >= 0
            if self.refs[page] == 0:
                if self.cache is not None and self.cache.contains(page):
                    idle.append(page)
                else:
                    heapq.heappush(self._free_pages, page)
        if idle:
            self.cache.idle_batch(idle)
        self._free_slot(slot)

    def _free_slot(self, slot: int) -> None:
        self.block_table[slot] = -1
        self.reserved_tokens[slot] = 0
        self.cached_tokens[slot] = 0
        self.prompt_tokens[slot] = NO_PROMPT
        self._hashes[slot] = self._tails[slot] = self._transcript[slot] = None
        self._free_slots.append(slot)
        self._free_slots.sort(reverse=True)
        self.version += 1

    def check_rows(self, slots: np.ndarray, positions: np.ndarray) -> None:
        """Asserts every (slot, position) row lies inside its slot's reserved pages, none of them shared."""
        assert (positions < self.reserved_tokens[slots]).all(), "position beyond the slot's reserved pages"
        pages = self.block_table[slots, positions // self.page_size]
        assert not self.read_only[pages].any(), "a row would write into a shared (pinned or cached) page"
