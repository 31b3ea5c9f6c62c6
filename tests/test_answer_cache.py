"""A finished answer's K/V rows kept with its prompt's last page: a repeated request copies them."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_prefix_cache import PAGE, TEXTS, _CopyingPool, make, parts  # noqa: F401  (module fixture)

from toolcall.runtime.batching.batcher import Request, Result
from toolcall.runtime.batching.pages import PageAllocator


def test_a_repeat_copies_each_chunks_rows_but_the_last_while_its_tokens_match():
    pool = _CopyingPool(16, 4, 4, 32)
    pool.enable_prefix_cache("salt")
    prompt = tuple(range(10, 20))  # 10 tokens: pages 0-1 full, page 2 holds prompt rows 8-9, answer rows from 10
    owner = pool.admit(20, prompt)
    pool.register_prompt(owner)
    answer = [50, 51, 52, 53, 54, 55, 56]  # rows for positions 10..16: pages 2, 3, 4
    kept = pool.block_table[owner, 2:5].tolist()
    pool.release(owner, answer=answer)
    assert pool.cache.idle_pages == 5  # the 2 full prompt pages, the tail page and the 2 answer pages
    slot = pool.admit(20, prompt)
    own = pool.block_table[slot].tolist()
    pool.copies.clear()
    # the first chunk: the last pick and 3 forced tokens at positions 10-13, the last of them computed
    assert pool.copy_answer_rows(slot, answer[:4], 0, 4) == 3
    assert pool.copies == [(kept[0], own[2], 2, 2), (kept[1], own[3], 1)]  # positions 10-11 in page 2, 12 in 3
    pool.copies.clear()
    assert pool.copy_answer_rows(slot, answer[:7], 4, 3) == 2  # positions 14-15 (page 3), 16 computed
    assert pool.copies == [(kept[1], own[3], 2, 2)]
    assert pool.copy_answer_rows(slot, answer[:4] + [99, 55, 56], 4, 3) == 0  # another token: nothing copied
    assert pool.copy_answer_rows(slot, answer[:4], 3, 1) == 0  # a chunk of one row only picks
    assert pool.answers.copied_rows == 5
    pool.release(slot, answer=answer)  # not the tail page's owner: its answer pages are freed, not kept
    assert pool.cache.idle_pages == 5 and pool.refs.sum() == 0 and pool.free_pages == 16


def test_evicting_a_transcripts_page_cuts_it_there_and_its_first_page_ends_it():
    pool = _CopyingPool(6, 4, 2, 24)
    pool.enable_prefix_cache("salt")
    prompt = tuple(range(10, 16))  # 6 tokens: page 0 full, page 1 holds rows 4-5 and answer rows from 6
    owner = pool.admit(16, prompt)
    pool.register_prompt(owner)
    pool.release(owner, answer=[50, 51, 52, 53, 54])  # positions 6..10: pages 1 and 2
    assert pool.cache.idle_pages == 3 and len(pool.answers.by_first) == 1
    (t,) = pool.answers.by_first.values()
    other = pool.admit(16, tuple(range(30, 36)))  # 4 pages: 3 free, then the deepest idle one (answer page)
    assert t.rows == 2 and len(t.pages) == 1  # answer rows 6-7 remain, in the tail page
    pool.release(other, cache=False)
    slot = pool.admit(16, prompt)
    assert pool.copy_answer_rows(slot, [50, 51, 52, 53, 54], 0, 5) == 2
    pool.release(slot, cache=False)
    pool.release(pool.admit(24, tuple(range(40, 46))), cache=False)  # takes all 6 pages: every idle one evicted
    assert not pool.answers.by_first and not pool.answers.page_of and t.rows == 0


def rows_of(kv, slot: int, positions: int) -> list[np.ndarray]:
    """Every layer's K and V rows 0..positions-1 of a slot, as uint16 bits."""
    pos = np.arange(positions)
    pages, offsets = kv.block_table[slot, pos // kv.page_size], pos % kv.page_size
    return [a[pages, offsets].view(np.uint16).copy() for a in (*kv.k, *kv.v)]


@pytest.mark.parametrize("tools", [None, (1, 3)], ids=["all tools", "a subset"])
def test_repeated_requests_compute_fewer_rows_and_keep_their_tokens_margins_and_kv_bits(parts, tools):
    texts = TEXTS[:4]
    alone = make(parts, False)
    unshared = alone.generate([Request(parts[3].encode(t), tools=tools) for t in texts])
    gen = make(parts, True)
    kv, rows_in, snapshots = gen.kv, [], []
    forward, release = gen.model.forward, kv.release

    def counting_forward(tokens, *args, **kwargs):
        rows_in.append(len(tokens))
        return forward(tokens, *args, **kwargs)

    def snapshot_release(slot, cache=True, answer=()):
        if cache and answer:  # the K/V the sequence holds when it finishes: prompt and fed answer rows
            snapshots.append(rows_of(kv, slot, int(kv.prompt_tokens[slot]) + len(answer)))
        release(slot, cache, answer)

    gen.model.forward, kv.release = counting_forward, snapshot_release
    first = gen.generate([Request(parts[3].encode(t), tools=tools) for t in texts])
    computed_first, copied_first = sum(rows_in), kv.answers.copied_rows
    rows_in.clear()
    again = gen.generate([Request(parts[3].encode(t), tools=tools) for t in texts])
    for x, y, z in zip(unshared, first, again, strict=True):
        assert isinstance(x, Result) and x.token_ids == y.token_ids == z.token_ids
        assert x.min_margin == y.min_margin == z.min_margin  # the picking rows' logits: the same bits
    assert copied_first == 0 and kv.answers.copied_rows > 0
    # the repeats compute their last prompt token (the rest copied) and the answer rows not copied
    prompt_rows_copied = sum(len(r.prompt_token_ids) - 1 - len(parts[3].prefix_ids) for r in first)
    assert sum(rows_in) == computed_first - prompt_rows_copied - kv.answers.copied_rows
    # each repeat's rows, copied or computed, are its first run's bits (released in the same order)
    for a, b in zip(snapshots[:len(texts)], snapshots[len(texts):], strict=True):
        for x, y in zip(a, b, strict=True):
            assert np.array_equal(x, y)


class _ContentPool(PageAllocator):
    """Bookkeeping whose rows hold what a model would write there: a digest of the tokens up to the row."""

    def __init__(self, *args):
        super().__init__(*args)
        self.rows = np.full((self.num_pages, self.page_size), -1, np.int64)

    def copy_rows(self, src_page: int, dst_page: int, rows: int, first: int = 0) -> None:
        self.rows[dst_page, first:first + rows] = self.rows[src_page, first:first + rows]

    def compute(self, slot: int, tokens: list[int], start: int, stop: int) -> None:
        positions = np.arange(start, stop)
        self.check_rows(np.full(len(positions), slot), positions)
        for p in positions.tolist():
            self.rows[self.block_table[slot, p // self.page_size], p % self.page_size] = hash(tuple(tokens[:p + 1]))

    def holds(self, slot: int, tokens: list[int]) -> bool:
        return all(self.rows[self.block_table[slot, p // self.page_size], p % self.page_size]
                   == hash(tuple(tokens[:p + 1])) for p in range(len(tokens)))


ANSWERS = ([7, 8, 9, 10, 11, 12, 13], [7, 8, 9, 20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.lists(st.integers(1, 4), min_size=6,
                                                                          max_size=6)), min_size=1, max_size=12))
def test_any_order_of_repeats_and_evictions_keeps_every_row_what_the_model_writes(requests):
    pool = _ContentPool(9, 4, 2, 24)  # few pages: admissions evict transcripts and cached prompts
    pool.enable_prefix_cache("salt")
    prompts = [tuple(range(1, 1 + k)) for k in (5, 6, 8, 9)]  # partial and full last pages, shared pages
    for which, answer_of, chunks in requests:
        prompt, answer = prompts[which], ANSWERS[answer_of]
        slot = pool.admit(len(prompt) + len(answer), prompt)
        tokens = list(prompt)
        pool.compute(slot, tokens, int(pool.cached_tokens[slot]), len(prompt))
        pool.register_prompt(slot)
        fed = 0
        for n in chunks:  # the generator's chunks: rows fed, the last one picking
            n = min(n, len(answer) - fed)
            if n <= 0:
                break
            copied = pool.copy_answer_rows(slot, answer[:fed + n], fed, n)
            assert copied <= n - 1
            tokens = list(prompt) + answer[:fed + n]
            pool.compute(slot, tokens, len(prompt) + fed + copied, len(prompt) + fed + n)
            fed += n
        assert pool.holds(slot, list(prompt) + answer[:fed])
        pool.release(slot, answer=answer[:fed])
        for t in pool.answers.by_first.values():  # a transcript's pages are cached and hold its rows
            assert all(pool.cache.contains(p) for p in t.pages)
    assert pool.refs.sum() == 0 and pool.free_pages == pool.num_pages
