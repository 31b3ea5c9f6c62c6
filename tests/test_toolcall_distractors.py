"""Training data with words that must not name a tool on their own (``Wording.entity``, ``trailers``,
``statements``) and the situation phrasings (``Wording.more``): the default ``Wording`` data unchanged
with these options off, the situation phrasings kept off held-out templates, names made of cue words,
statements that need no tool, trailers inside their clause, and no hand-written test or dev request
in training."""
from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest

from toolcall.builder.catalog import load_catalog
from toolcall.models.recipe.chitchat import no_tool_request, statement
from toolcall.models.recipe.data import (
    PHRASING_ID,
    Wording,
    entity_words,
    make_split,
    near_held_out,
    template_splits,
    template_table,
)
from toolcall.models.recipe.handwritten import (
    DEVSET,
    HANDWRITTEN,
    load_handwritten,
    normalized,
    without_evaluation_requests,
)
from toolcall.models.recipe.phrasings_everyday import EVERYDAY_PHRASINGS
from toolcall.models.recipe.phrasings_situations import SITUATION_PHRASINGS
from toolcall.models.recipe.pools import _NAMED, draw
from toolcall.models.recipe.templates import SLOTS, TEMPLATES
from toolcall.models.recipe.wording import TRAILERS

CATALOG = "builder/data/tools-64.json"
DISTRACTORS = Wording(no_tool=0.1, typos=0.05, entity=0.25, trailers=0.1, statements=0.25, more=True)


@pytest.fixture(scope="module")
def train():
    return make_split("train", seed=0, size=3000, noise=0.05, lexicon=0.5, paraphrases=True, wording=DISTRACTORS,
                      counts=(0.3, 0.3, 0.22, 0.18))


def test_default_wording_keeps_its_pinned_bytes():
    # sha256 of repr(make_split(...)) with the default Wording (these options off), recorded at commit ac75f1a
    # (before the options existed)
    a = make_split("train", 0, size=300, noise=0.05, lexicon=0.5, paraphrases=True, wording=Wording())
    b = make_split("val", 0, size=300, wording=Wording(phrasings=False))
    assert hashlib.sha256(repr(a).encode()).hexdigest() == \
        "e32434a0da73f0d4ab715444e0c16472d35da802ccaff06fe15cf125e2e55d9a"
    assert hashlib.sha256(repr(b).encode()).hexdigest() == \
        "014ac50204a78a428668032729441a390f6bf4e2c2755629d37c639a6036cb42"


def test_situation_phrasings_cover_the_catalog_and_stay_off_held_out_templates(train):
    assert set(SITUATION_PHRASINGS) == set(TEMPLATES)
    for tool, text in SITUATION_PHRASINGS.items():
        phrasings = text.split("|")
        assert len(phrasings) == 6 and len(set(phrasings)) == 6, tool
        assert not set(phrasings) & set(EVERYDAY_PHRASINGS[tool].split("|")), tool
        for p in phrasings:
            assert all(s.rstrip("2") in SLOTS for s in re.findall(r"\{(\w+)\}", p)), p
    assign, table = template_splits(0), template_table()
    more = {(t, p) for t, text in SITUATION_PHRASINGS.items() for p in text.split("|")}
    drawn = {(t, p) for e in train for t, p, i in zip(e.tools, e.patterns, e.template_ids) if i == PHRASING_ID}
    assert len(drawn & more) > 100
    for tool, pattern in drawn:
        held = [t for i, (owner, t) in enumerate(table) if owner == tool and assign[i] != "train"]
        assert not near_held_out(pattern, held), (tool, pattern)


def test_names_are_built_from_cue_words_when_asked():
    words = entity_words()
    assert len(words) > 500 and {"weather", "flight", "call", "playlist"} <= set(words)
    assert not any("{" in w or not w.isalpha() for w in words)
    rng = np.random.default_rng(0)
    for slot in _NAMED:
        values = [draw(slot, rng, 0.8, words, 1.0) for _ in range(50)]
        assert len(set(values)) > 30, slot
        assert all(any(w in v.lower().split() for w in words) or "'" in v for v in values), slot
    # entity 0 draws exactly as without words (same values, same generator state)
    r1, r2 = np.random.default_rng(5), np.random.default_rng(5)
    assert [draw("hotel", r1) for _ in range(20)] == [draw("hotel", r2, 0.8, words, 0.0) for _ in range(20)]


def test_statements_name_catalog_things_but_no_tool(train):
    rng = np.random.default_rng(0)
    texts = [statement(rng) for _ in range(300)]
    assert len(set(texts)) > 200 and "{" not in "".join(texts)
    names = load_catalog(CATALOG).names
    empty = [e.request for e in train if not e.tools]
    assert 0.07 < len(empty) / len(train) < 0.13
    assert not any(n in r for r in empty for n in names)
    r1, r2 = np.random.default_rng(3), np.random.default_rng(3)
    assert [no_tool_request(r1) for _ in range(30)] == [no_tool_request(r2, 0.0) for _ in range(30)]


def test_trailers_stay_inside_their_clause(train):
    with_trailer = [e for e in train if any(c.lower().endswith(t.lower()) for c in e.clauses for t in TRAILERS)]
    assert len(with_trailer) > 100
    for e in with_trailer:
        if min(map(len, e.clauses)) > 3:
            assert [e.request[a:b].lower() for a, b in e.clause_spans()] == [c.lower() for c in e.clauses]


def test_no_evaluation_request_is_trained_on(train):
    held = {normalized(r) for p in (HANDWRITTEN, DEVSET) for r, _ in load_handwritten(p)} - {""}
    assert len(held) > 400
    kept = without_evaluation_requests(list(train) + [train[0].__class__("Who are you?", (), (), (), ())])
    assert not [e.request for e in kept if normalized(e.request) in held]
    assert len(kept) >= len(train) - 300 and any(e.request == "" for e in kept) == any(e.request == "" for e in train)


def test_devset_is_a_valid_set_apart_from_the_test_set():
    names = set(load_catalog(CATALOG).names)
    dev = load_handwritten(DEVSET, names)
    assert len(dev) >= 150 and sum(not t for _, t in dev) >= 30 and sum(len(t) > 1 for _, t in dev) >= 30
    assert {t for _, tools in dev for t in tools} == names
    test = {normalized(r) for r, tools in load_handwritten(HANDWRITTEN) if tools}
    assert not [r for r, tools in dev if tools and normalized(r) in test]
