"""The training split with ``Wording``: the plain template data (no ``wording``) unchanged, no-tool
requests, pooled values, typos, joins, everyday phrasings kept off held-out templates, and the
hand-written set never in training."""
from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest

from toolcall.builder.catalog import load_catalog
from toolcall.models.recipe.chitchat import no_tool_request
from toolcall.models.recipe.data import PHRASING_ID, Wording, make_split, near_held_out, template_splits, template_table
from toolcall.models.recipe.handwritten import load_handwritten
from toolcall.models.recipe.phrasings_everyday import EVERYDAY_PHRASINGS
from toolcall.models.recipe.pools import GENERATORS, draw
from toolcall.models.recipe.templates import SLOTS, TEMPLATES
from toolcall.models.recipe.wording import typo

CATALOG = "builder/data/tools-64.json"


@pytest.fixture(scope="module")
def train():
    return make_split("train", seed=0, size=3000, noise=0.05, lexicon=0.5, paraphrases=True, wording=Wording())


def test_splits_without_wording_keep_their_pinned_bytes():
    # sha256 of repr(make_split(...)) without ``wording``, recorded at commit c75f76a (before Wording existed)
    want = {"train": "a7c5160058f1ca1678aec76f6f053ecdce86fd101a3656f94bcbffd72cbc951c",
            "val": "ed3159abdd8b2616d80cdef661781a46292e8f83d6a09604212183feee9ec92f",
            "test": "35a3e80e7ad3836baf5cec7db937675397e3e0d3c825686350ae08add9e44066"}
    got = {s: make_split(s, 0, size=300, **(dict(noise=0.05, lexicon=0.5, paraphrases=True) if s == "train" else {}))
           for s in want}
    assert {s: hashlib.sha256(repr(v).encode()).hexdigest() for s, v in got.items()} == want


def test_no_tool_requests_have_the_empty_label_and_a_tenth_share(train):
    empty = [e for e in train if not e.tools]
    assert 0.07 < len(empty) / len(train) < 0.13
    assert all(e.clauses == e.patterns == e.template_ids == () and e.clause_spans() == [] for e in empty)
    names = load_catalog(CATALOG).names
    assert not any(n in e.request for e in empty for n in names)


def test_tool_requests_keep_their_clauses_in_order(train):
    for e in train:  # a clause the noise cut to a few letters ("on") may be found inside a join ("and"):
        if e.tools and min(map(len, e.clauses)) > 3:  # rare, and only the clause probe's labels see it
            spans = e.clause_spans()
            assert [e.request[a:b].lower() for a, b in spans] == [c.lower() for c in e.clauses], e.request
            assert all(a < b for (_, a), (b, _) in zip(spans, spans[1:]))
            assert "{" not in e.request


def test_everyday_phrasings_cover_the_catalog_and_stay_off_held_out_templates(train):
    assert set(EVERYDAY_PHRASINGS) == set(TEMPLATES)
    for tool, text in EVERYDAY_PHRASINGS.items():
        phrasings = text.split("|")
        assert len(phrasings) == 12 and len(set(phrasings)) == 12, tool
        for p in phrasings:
            assert all(s.rstrip("2") in SLOTS for s in re.findall(r"\{(\w+)\}", p)), p
    assign, table = template_splits(0), template_table()
    drawn = {(t, p) for e in train for t, p, i in zip(e.tools, e.patterns, e.template_ids) if i == PHRASING_ID}
    assert len(drawn) > 300
    for tool, pattern in drawn:
        held = [t for i, (owner, t) in enumerate(table) if owner == tool and assign[i] != "train"]
        assert not near_held_out(pattern, held), (tool, pattern)


def test_validation_may_vary_wording_but_never_takes_phrasings():
    val = make_split("val", seed=0, size=300, wording=Wording(phrasings=False))
    assign = template_splits(0)
    assert {i for e in val for i in e.template_ids} <= {i for i, s in assign.items() if s == "val"}
    assert any(not e.tools for e in val)
    with pytest.raises(ValueError, match="train split only"):
        make_split("val", seed=0, wording=Wording())


def test_handwritten_requests_never_appear_in_training(train):
    def norm(text):
        return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())

    seen = {norm(e.request) for e in train}
    handwritten = [norm(r) for r, tools in load_handwritten() if tools and len(norm(r).split()) > 2]
    assert len(handwritten) > 150
    assert not [r for r in handwritten if r in seen]


def test_pooled_values_are_mostly_new():
    rng = np.random.default_rng(0)
    for slot in ("person", "city", "amount", "file", "expr", "time", "day", "phone"):
        values = [draw(slot, rng, 1.0) for _ in range(200)]
        assert len(set(values)) > 60, slot
        assert sum(v in SLOTS[slot] for v in values) < 40, slot
    assert set(GENERATORS) <= set(SLOTS)


def test_same_seed_same_wording_data():
    a = make_split("train", seed=4, size=200, lexicon=0.5, paraphrases=True, wording=Wording())
    assert a == make_split("train", seed=4, size=200, lexicon=0.5, paraphrases=True, wording=Wording())
    rng1, rng2 = np.random.default_rng(1), np.random.default_rng(1)
    assert [no_tool_request(rng1) for _ in range(50)] == [no_tool_request(rng2) for _ in range(50)]


def test_a_typo_is_one_small_edit():
    rng = np.random.default_rng(0)
    for word in ("weather", "calendar", "flight", "translate"):
        for _ in range(20):
            t = typo(word, rng)
            assert t != word or len(set(word)) < len(word)  # a swap or double of equal letters may look the same
            assert abs(len(t) - len(word)) <= 1 and t[0] == word[0]
    assert typo("to", rng) == "to" and typo("4:30", rng) == "4:30"
