"""The CUDA serving step's packed programs and request grammars over many steps, on the emulated device: mixed
steps come from a few bucketed shapes, the program cache keeps what is used (least recently used out), and a request
grammar evicted while a step runs is freed only after that step's sync (the kernels queued before it still read it)."""
from __future__ import annotations

import dataclasses

import pytest
from test_device_step import batcher, device_model, parts  # noqa: F401 (fixtures)
from tokenizers import Tokenizer

from toolcall.builder.catalog import load_catalog
from toolcall.builder.trie import build_grammar
from toolcall.runtime.batching.batcher import Request
from toolcall.runtime.cuda import device_step
from toolcall.runtime.cuda.program import PROGRAM_CACHE
from toolcall.runtime.grammar.stepper import GrammarStepper

from test_device_step import MODEL  # noqa: E402


def power_of_two_or_cap(n: int, cap: int) -> bool:
    return n == cap or (n & (n - 1)) == 0


def test_prefill_traffic_reuses_a_few_bucketed_programs(parts):
    """Requests of many prompt lengths arriving step after step: every mixed step's rows and tiles are a bucket
    (a power of two, or the step's cap), so the steps re-pack few programs (``packs``), not one per exact shape."""
    model, _ = device_model(parts)
    gen = batcher(model, parts)
    cap = parts["limits"].max_tokens_per_step
    prompts = parts["prompts"]
    for k in range(1, len(prompts) + 1):  # arrivals while others answer: mixed steps of varied rows and tiles
        gen.generate([Request(prompts[(k + j) % len(prompts)][: 12 + 7 * j]) for j in range(k)])
    forward = [key for key in model._programs if key[0] == "forward" and len(key) == 4]
    assert forward and all(power_of_two_or_cap(rows, cap) and power_of_two_or_cap(tiles, cap)
                           for _, rows, tiles, _ in forward), forward
    shapes = {(rows, tiles) for _, rows, tiles, _ in forward}
    assert len(shapes) <= 12, shapes
    assert model.packs == len(model._programs) <= PROGRAM_CACHE  # nothing evicted, nothing packed twice
    model.close()


def test_a_cache_hit_keeps_the_program(parts):
    """A used program stays while newer shapes come and go: the least recently used one leaves first."""
    model, _ = device_model(parts)
    model._programs.clear()
    make = lambda: []  # noqa: E731 (an empty launch list packs nothing)
    for i in range(PROGRAM_CACHE):
        model.program(("t", i), make)
    model.program(("t", 0), make)  # a hit
    model.program(("t", "new"), make)
    assert ("t", 0) in model._programs and ("t", 1) not in model._programs
    model.close()


@pytest.fixture(scope="module")
def two_tool_lists():
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    catalog = load_catalog("builder/data/tools-64.json")
    eos = 2
    return [GrammarStepper(build_grammar(dataclasses.replace(catalog, tools=catalog.tools[a:b]), tok, eos))
            for a, b in ((0, 6), (10, 17))]


def test_an_evicted_request_grammar_is_freed_after_the_step_sync(parts, two_tool_lists, monkeypatch):
    """With room for one request grammar on the device, two requests bringing their own tool lists sample in one
    step: the second list's upload evicts the first, whose kernels were queued before it. Its arrays must stay
    until the step's sync: no free between a step's first launch and its sync."""
    monkeypatch.setattr(device_step, "REQUEST_GRAMMARS", 1)
    model, gpu = device_model(parts)
    events = []
    launch, free, sync = gpu.launch, gpu.free, model.sync
    gpu.launch = lambda kernel, *a, **k: (events.append("launch"), launch(kernel, *a, **k))[1]
    gpu.free = lambda arr: (events.append("free"), free(arr))[1]
    model.sync = lambda: (events.append("sync"), sync())[1]
    prompts = parts["prompts"]
    got = batcher(model, parts).generate([Request(prompts[6], grammar=two_tool_lists[0]),
                                          Request(prompts[4], grammar=two_tool_lists[1])])
    assert all(r.finish for r in got)
    assert "free" in events  # the evictions happened
    in_step = False
    for e in events:
        in_step = (in_step or e == "launch") and e != "sync"
        assert not (in_step and e == "free"), "a request grammar was freed while its step's kernels were queued"
    model.close()


def test_every_prompt_row_takes_the_prefill_tiles(parts):
    """The decode kernel takes only answer rows: a prompt whose chunk the step's budget cut one row short finishes
    beside the answering rows of the others, its one row alone in its sequence, and still takes the prefill tiles
    (a row's bits there never depend on its tile; the decode kernel gives other bits: bench/bit_gates.py batch_2 on
    the simulated device, where the end of a cached prompt was decoded)."""
    model, _ = device_model(parts)
    gen = batcher(model, parts)
    lim, prompt = parts["limits"], parts["prompts"][0]
    assert 2 * len(prompt) < lim.max_tokens_per_step and len(prompt) <= lim.prefill_chunk
    cut = prompt[:lim.max_tokens_per_step - 2 * len(prompt) + 1]  # one row past the first step's budget
    steps = []  # (positions of the decode kernel's rows, of the tiles' rows)
    write_rows = model.write_rows

    def spy(tokens, slots, positions, tiles_from=0, launched=None):
        first_tile = len(tokens) if tiles_from is None else tiles_from
        steps.append((list(positions[:first_tile]), list(positions[first_tile:])))
        return write_rows(tokens, slots, positions, tiles_from, launched)
    model.write_rows = spy
    gen.generate([Request(prompt), Request(prompt), Request(cut)])
    assert all(p >= len(cut) for decoded, _ in steps for p in decoded), steps  # no prompt row decoded
    assert ([len(prompt)] * 2, [len(cut) - 1]) in steps, steps  # the cut prompt's last row: a tile beside answers
    model.close()
