"""Shared prompt prefix and prefix cache: pinned pages read-only, counted once, reused, evicted; same answers."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer

from toolcall.builder.catalog import load_catalog
from toolcall.builder.checkpoint import open_checkpoint
from toolcall.builder.trie import build_grammar
from toolcall.common.errors import RequestError
from toolcall.runtime.batching.batcher import Request, Result
from toolcall.runtime.batching.pages import PageAllocator
from toolcall.runtime.batching.prefix_cache import prefill_prefix
from toolcall.runtime.batching.prompt import PromptEncoder
from toolcall.runtime.bundle.contract import Limits, compute_bundle_id
from toolcall.runtime.cpu.backend import cpu_batcher

CATALOG = {"tools": json.load(open("builder/data/tools-64.json"))["tools"][:6],
           "prompt_template": "<|im_start|>system\nName the tools for the request.\nTools:\n{tools}<|im_end|>\n"
                              "<|im_start|>user\n{request}<|im_end|>\n<|im_start|>assistant\n"}
TEXTS = ["Book a flight to Paris", "What's the weather in Oslo tomorrow?", "Send an email to Bob",
         "Convert 20 euros to yen", "Book a flight to Paris", "Find a hotel in Rome and book a flight there"]
PAGE = 16


@pytest.fixture(scope="module")
def parts(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    tok = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    grammar = build_grammar(load_catalog(CATALOG), tok, ckpt.config.eos_token_ids[0])
    enc = PromptEncoder.create(tok, grammar.prompt_template)
    assert len(enc.prefix_ids) % PAGE, "the test wants a partial last prefix page"
    return ckpt.config, ckpt.weights_f32(), grammar, enc


def make(parts, sharing: bool, max_sequences=4, num_pages=None):
    cfg, weights, grammar, enc = parts
    limits = Limits(page_size=PAGE, num_pages=0, max_sequences=max_sequences, max_tokens_per_step=64,
                    prefill_chunk=48, max_input_tokens=320, max_output_tokens=grammar.max_answer_tokens)
    pinned = -(-len(enc.prefix_ids) // PAGE)
    pages = num_pages if num_pages is not None else max_sequences * limits.pages_per_sequence + pinned
    gen = cpu_batcher(cfg, weights, grammar, Limits(**{**limits.__dict__, "num_pages": pages}))
    if sharing:
        gen.kv.enable_prefix_cache("test-bundle")
        prefill_prefix(gen.model, gen.kv, enc.prefix_ids, limits.prefill_chunk)
    return gen


def requests(parts, texts=TEXTS):
    return [Request(parts[3].encode(t), keep_logits=True) for t in texts]


@pytest.fixture(scope="module")
def unshared(parts):
    return make(parts, False).generate(requests(parts))


def same_answers(a: list[Result], b: list[Result]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        for lx, ly in zip(x.step_logits, y.step_logits, strict=True):  # bits, not a tolerance
            assert np.array_equal(lx.view(np.uint32), ly.view(np.uint32))


def test_identical_answers_and_logit_bits_with_and_without_sharing(parts, unshared):
    gen = make(parts, True)
    first = gen.generate(requests(parts))
    again = gen.generate(requests(parts))  # now also from finished prompts' cached pages
    same_answers(unshared, first)
    same_answers(unshared, again)
    n = len(parts[3].prefix_ids)
    assert all(r.cached_prompt_tokens == 0 for r in unshared)
    assert all(r.cached_prompt_tokens == n for r in first[:4])  # admitted at once: the pinned prefix only
    # the same text as first[0], admitted after it finished, and every prompt of the second round: all but the
    # last token from cached pages (the full ones shared, the rows of the last page copied from a tail page)
    assert first[4].cached_prompt_tokens == len(first[4].prompt_token_ids) - 1
    assert all(r.cached_prompt_tokens == len(r.prompt_token_ids) - 1 for r in again)


def test_shared_pages_are_read_only_and_never_written(parts):
    gen = make(parts, True)
    kv = gen.kv
    pinned = list(kv.prefix_pages)
    before = [a[pinned].copy() for a in (*kv.k, *kv.v)]
    results = gen.generate(requests(parts))
    assert all(isinstance(r, Result) for r in results)
    for a, b in zip(before, (*kv.k, *kv.v)):
        assert np.array_equal(a.view(np.uint16), b[pinned].view(np.uint16))
    slot = kv.admit(len(parts[3].encode("hello")) + 4, parts[3].encode("hello"))
    zeros = np.zeros((1, parts[0].num_kv_heads, parts[0].head_dim), np.float32)
    with pytest.raises(AssertionError, match="shared"):  # position 0 lies in a pinned page
        kv.write(0, np.array([slot]), np.array([0]), zeros, zeros)
    kv.write(0, np.array([slot]), np.array([int(kv.cached_tokens[slot])]), zeros, zeros)  # its own page: fine
    kv.release(slot, cache=False)


def test_the_partial_prefix_page_is_copied_and_shared_pages_counted_once(parts):
    gen = make(parts, True)
    kv, enc = gen.kv, parts[3]
    n, full = len(enc.prefix_ids), len(enc.prefix_ids) // PAGE
    free = kv.free_pages
    prompts = [enc.encode(t) for t in TEXTS[:3]]
    slots = [kv.admit(len(p) + 8, p) for p in prompts]
    for slot, p in zip(slots, prompts):
        assert kv.block_table[slot, :full].tolist() == kv.prefix_pages[:full]
        own = int(kv.block_table[slot, full])
        assert own not in kv.prefix_pages and kv.cached_tokens[slot] == n
        for a in (*kv.k, *kv.v):  # the partial page's rows copied, bit for bit
            assert np.array_equal(a[own, : n - full * PAGE].view(np.uint16),
                                  a[kv.prefix_pages[full], : n - full * PAGE].view(np.uint16))
    assert free - kv.free_pages == sum(kv.pages_for(len(p) + 8) - full for p in prompts)
    assert (kv.refs[kv.prefix_pages[:full]] == 1 + len(slots)).all() and kv.refs[kv.prefix_pages[full]] == 1
    for slot in slots:
        kv.release(slot, cache=False)


def test_refs_go_back_to_pinned_only_after_a_batch(parts):
    gen = make(parts, True, max_sequences=2)  # queued: admissions interleave with releases
    gen.generate(requests(parts) + [Request((5,) * 400)])  # one refused (too long), others answered
    kv = gen.kv
    expected = np.zeros(kv.num_pages, np.int32)
    expected[kv.prefix_pages] = 1
    assert np.array_equal(kv.refs, expected)
    assert kv.free_slots == kv.max_seqs and kv.free_pages + kv.pinned_pages == kv.num_pages
    assert kv.cache.idle_pages > 0  # finished prompts' full pages stay cached, idle


def test_eviction_under_pressure_lru_tails_before_heads():
    pool = PageAllocator(num_pages=8, page_size=4, max_seqs=4, max_tokens_per_seq=32)
    pool.enable_prefix_cache("salt")
    a, b = tuple(range(10, 22)), tuple(range(30, 42))  # 12 tokens: 3 full pages each
    for prompt in (a, b):
        pool.release(pool.admit(len(prompt), prompt))
    assert pool.cache.idle_pages == 6 and pool.free_pages == 8
    pages_a = [pool.cache.page_of[h] for h in _hashes(pool, a)]
    slot = pool.admit(16, tuple(range(50, 66)))  # 4 pages: 2 free, then a's tail, then a's middle
    assert [pool.cache.page_of.get(h) for h in _hashes(pool, a)] == [pages_a[0], None, None]
    assert all(h in pool.cache.page_of for h in _hashes(pool, b))  # b was used later: kept
    pool.release(slot, cache=False)
    again = pool.admit(len(b) + 2, b)  # b fully cached: all but the page of its last token shared
    assert pool.cached_tokens[again] == 8
    pool.release(again)
    with pytest.raises(RequestError) as info:  # more than the whole pool: refused, not queued forever
        pool.check_fits(40, tuple(range(40)))
    assert info.value.code == "kv_pages"


def test_the_lru_heap_stays_bounded_by_the_idle_pages_over_many_requests():
    pool = PageAllocator(num_pages=8, page_size=4, max_seqs=4, max_tokens_per_seq=32)
    pool.enable_prefix_cache("salt")
    a, b = tuple(range(10, 22)), tuple(range(30, 42))  # 3 full pages each, cached and idle again after each
    for _ in range(2000):  # each release re-idles its 2 shared pages; without rebuilding, the heap held 8,002 entries
        for prompt in (b, a):
            pool.release(pool.admit(len(prompt), prompt))
    assert pool.cache.idle_pages == 6 and len(pool.cache._heap) <= 2 * 6 + 64 + 3
    pages_a, pages_b = ([pool.cache.page_of[h] for h in _hashes(pool, p)] for p in (a, b))
    # a re-admitted prompt shares all but the page of its last token: each tail page stayed idle since its
    # first release (the oldest ticks), so after the rebuilds LRU still takes b's tail, then a's
    slot = pool.admit(16, tuple(range(50, 66)))  # 4 pages: 2 free, 2 evicted
    assert [pool.cache.page_of.get(h) for h in _hashes(pool, b)] == pages_b[:2] + [None]
    assert [pool.cache.page_of.get(h) for h in _hashes(pool, a)] == pages_a[:2] + [None]
    pool.release(slot, cache=False)


def _hashes(pool, prompt):
    from toolcall.runtime.batching.prefix_cache import chain_hashes
    return chain_hashes(pool.cache.salt, prompt, pool.page_size, len(prompt) // pool.page_size)


def test_a_full_pool_evicts_idle_pages_and_answers_stay_the_same(parts, unshared):
    enc = parts[3]
    need = -(-(max(len(enc.encode(t)) for t in TEXTS) + parts[2].max_answer_tokens) // PAGE)
    gen = make(parts, True, max_sequences=2, num_pages=-(-len(enc.prefix_ids) // PAGE) + need + 2)
    for _ in range(2):  # the second round finds a pool whose free pages are all idle cached ones
        same_answers(unshared, gen.generate(requests(parts)))
    assert gen.kv.cache.idle_pages > 0


def test_engine_run_json_and_no_prefix_cache(tmp_path, tiny_checkpoint):
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.bundle.contract import BuildOptions
    from toolcall.runtime.cli import main
    from toolcall.runtime.engine import Engine

    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps(CATALOG))
    options = BuildOptions(precision="fp8_e4m3", target="cpu", max_sequences=4, max_input_tokens=320,
                           max_output_tokens=None, page_size=PAGE, max_tokens_per_step=64, prefill_chunk=48,
                           memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
    bundle = tmp_path / "b"
    contract = compile_bundle(tiny_checkpoint, catalog, options, bundle).contract
    on, off = Engine.load(bundle), Engine.load(bundle, prefix_cache=False)
    p = contract.prompt
    assert p.prefix_tokens == len(on.prompt.prefix_ids) and p.shared_pages == p.prefix_tokens // PAGE
    assert p.prefix_pages == p.shared_pages + 1 == on.generator.kv.pinned_pages
    assert contract.limits.num_pages == options.max_sequences * contract.limits.pages_per_sequence + p.prefix_pages
    assert on.generator.kv.cache.hit_tokens >= p.prefix_tokens  # the canary ran through the shared pages
    assert off.generator.kv.cache is None and off.generator.kv.pinned_pages == 0
    texts = ["Book a flight to Paris", "\udcff bad", "Send an email to Bob", "   "]
    a, b = on.run(texts), off.run(texts)
    assert [getattr(r, "code", None) for r in a] == [None, "request_invalid", None, "request_invalid"]
    assert [r.token_ids for r in (a[0], a[2])] == [r.token_ids for r in (b[0], b[2])]
    assert [r.token_ids for r in on.run([texts[0], texts[2]])] == [a[0].token_ids, a[2].token_ids]
    for flag, cached in ((), p.prefix_tokens), (("--no-prefix-cache",), 0):
        out = CliRunner().invoke(main, ["run", str(bundle), texts[0], "--json", *flag])
        assert out.exit_code == 0, out.output
        (res,) = json.loads(out.stdout)["results"]
        assert res["prompt_token_ids"] == list(on.encode(texts[0])) and res["cached_prompt_tokens"] == cached
    for flag, pinned in ((), p.prefix_pages), (("--no-prefix-cache",), 0):
        out = CliRunner().invoke(main, ["load", str(bundle), "--json", *flag])
        summary = json.loads(out.stdout)
        assert summary["prefix_tokens"] == p.prefix_tokens and summary["pinned_pages"] == pinned
    def forge(edited: dict) -> None:  # an edit with bundle_id recomputed: only the load's checks can tell
        edited["engine"]["bundle_id"] = compute_bundle_id(edited)
        (bundle / "contract.json").write_text(json.dumps(edited))

    edited = json.loads((bundle / "contract.json").read_text())
    edited["prompt"]["prefix_token_ids"][0] += 1
    forge(edited)
    out = CliRunner().invoke(main, ["load", str(bundle), "--json"])
    assert json.loads(out.stdout)["error"] == "prompt_mismatch" and out.exit_code == 91
    edited["prompt"]["prefix_token_ids"][0] -= 1
    memory, pages = edited["memory"], edited["limits"]["num_pages"]
    page_bytes = memory["kv_pool_bytes"] // pages
    edited["limits"]["num_pages"] = p.shared_pages  # fewer pages than the prefix takes, memory in step
    memory["total_bytes"] -= memory["kv_pool_bytes"] - p.shared_pages * page_bytes
    memory["kv_pool_bytes"] = p.shared_pages * page_bytes
    forge(edited)
    out = CliRunner().invoke(main, ["load", str(bundle), "--json"])
    assert json.loads(out.stdout)["error"] == "bundle_invalid", out.output
    out = CliRunner().invoke(main, ["load", str(bundle), "--json", "--no-prefix-cache"])
    # The limits cross-check refuses a pool that cannot hold one sequence before any prefix is placed.
    assert json.loads(out.stdout)["error"] == "bundle_invalid", out.output


def test_a_prompt_shares_the_full_pages_of_a_running_one_once_it_is_prefilled(parts, unshared):
    gen = make(parts, True)
    first = requests(parts)[5]  # the longest text: its prompt ends past the pinned prefix's pages
    handle = gen.submit(first)
    done = {}
    while not any(s.prefilled == len(s.prompt) for s in gen.scheduler.running):
        done.update(gen.step())
    assert handle not in done  # still answering
    copy = gen.submit(first)
    while gen.busy:
        done.update(gen.step())
    a, b = done[handle], done[copy]
    same_answers([unshared[5], unshared[5]], [a, b])
    n = len(parts[3].prefix_ids)
    assert a.cached_prompt_tokens == n  # the pinned prefix only
    # the running one's full pages shared, and its last page's prompt rows copied: all but the last token
    assert b.cached_prompt_tokens == len(b.prompt_token_ids) - 1 > n


class _CopyingPool(PageAllocator):
    """Bookkeeping with a storage that records its row copies."""

    def __init__(self, *args):
        super().__init__(*args)
        self.copies = []

    def copy_rows(self, src_page: int, dst_page: int, rows: int, first: int = 0) -> None:
        self.copies.append((src_page, dst_page, rows) if first == 0 else (src_page, dst_page, rows, first))


@pytest.mark.parametrize("tokens", [10, 12], ids=["partial last page", "full last page"])
def test_a_prompt_seen_before_copies_its_last_pages_rows_all_but_the_last_token(tokens):
    pool = _CopyingPool(8, 4, 4, 32)
    pool.enable_prefix_cache("salt")
    prompt = tuple(range(10, 10 + tokens))
    first = pool.admit(tokens + 2, prompt)
    assert pool.cached_tokens[first] == 0 and not pool.copies
    last = (tokens - 1) // 4
    source = int(pool.block_table[first, last])  # the page of the last prompt token
    pool.register_prompt(first)  # prefilled: its last page's prompt rows are final
    assert not pool.read_only[source] or tokens % 4 == 0  # a tail page stays writable: its answer goes there
    second = pool.admit(tokens + 2, prompt)  # while the first still runs
    assert pool.cached_tokens[second] == tokens - 1
    assert pool.block_table[second, :last].tolist() == pool.block_table[first, :last].tolist()
    assert pool.copies == [(source, int(pool.block_table[second, last]), tokens - 1 - 4 * last)]
    other = pool.admit(tokens + 2, prompt[:-1] + (99,))  # another last token: another tail, nothing copied
    assert pool.cached_tokens[other] == 4 * last and len(pool.copies) == 1
    for slot in (first, second, other):
        pool.release(slot)
    third = pool.admit(tokens + 2, prompt)  # from the idle cached pages, after every owner finished
    assert pool.cached_tokens[third] == tokens - 1 and pool.copies[-1][0] == source
    pool.release(third)
    assert pool.refs.sum() == 0 and pool.free_pages == 8


def test_an_idle_tail_page_is_not_evicted_by_its_copier_unless_only_that_makes_room():
    pool = _CopyingPool(4, 4, 2, 32)
    pool.enable_prefix_cache("salt")
    prompt = tuple(range(10, 20))  # 10 tokens: 2 full pages and a tail page of 2 rows
    pool.release(pool.admit(12, prompt))
    assert pool.cache.idle_pages == 3 and pool.free_pages == 4
    slot = pool.admit(12, prompt)  # 3 pages: 2 shared, 1 fresh (the free one), the tail's rows copied
    assert pool.cached_tokens[slot] == 9 and len(pool.copies) == 1
    pool.release(slot)
    slot = pool.admit(16, prompt)  # 4 pages: 2 shared, 2 fresh; only evicting the tail page makes room
    assert pool.cached_tokens[slot] == 8 and len(pool.copies) == 1  # so it is evicted, and its rows recomputed
    pool.release(slot)
