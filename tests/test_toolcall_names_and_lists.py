"""The data options ``names`` (any name in a name slot), ``listed`` (a list of values in one slot),
``lists`` (a request written as one list) and ``extra`` (the detail phrasings): with all of them off the
training data stays byte for byte the data without them; on, each changes only what it says."""
from __future__ import annotations

import hashlib
import re

import numpy as np

from toolcall.models.recipe.data import Wording, make_split
from toolcall.models.recipe.phrasings_details import DETAIL_PHRASINGS
from toolcall.models.recipe.pools import LISTABLE, NAMEABLE, draw
from toolcall.models.recipe.templates import SLOTS, TEMPLATES
from toolcall.models.recipe.wording import join

# Training options with these four off (distractors and swapped names on), and the sha256 of their first 500
# training examples (request, tools, clauses per line) as written before the four options existed.
SWAPPED = Wording(no_tool=0.1, pooled=0.8, typos=0.05, entity=0.25, trailers=0.1, statements=0.25, more=True,
                  swap=0.15)
SPLIT_KW = dict(seed=0, size=500, noise=0.05, lexicon=0.5, paraphrases=True, counts=(0.25, 0.3, 0.25, 0.2))
SWAPPED_SHA256 = "c7a503e4ef0f11b81133f9a89f0c872465c2730239d55ea6dc0809c90fbd4a65"
NAMES_AND_LISTS = Wording(**{**SWAPPED.__dict__, "swap": 0.2, "names": 0.2, "listed": 0.1, "lists": 0.3,
                             "extra": True})


def _digest(examples) -> str:
    text = "\n".join(f"{e.request}\t{','.join(e.tools)}\t{'|'.join(e.clauses)}" for e in examples)
    return hashlib.sha256(text.encode()).hexdigest()


def test_options_off_keep_the_pinned_bytes():
    assert _digest(make_split("train", wording=SWAPPED, **SPLIT_KW)) == SWAPPED_SHA256


def test_names_and_lists_of_values_touch_only_their_slots():
    for slot in ("duration", "time", "amount"):  # outside NAMEABLE and LISTABLE: the very same draws
        assert slot not in NAMEABLE and slot not in LISTABLE
        assert draw(slot, np.random.default_rng(3), names=1.0, listed=1.0) == draw(slot, np.random.default_rng(3))
    rng = np.random.default_rng(0)
    named = [draw("lang", rng, names=1.0) for _ in range(100)]
    assert all(re.fullmatch(r"[A-Z][a-z]+( [A-Z][a-z]+)?", v) for v in named), named[:5]
    assert not set(named) & set(SLOTS["lang"])
    places = [draw("place", rng, names=1.0) for _ in range(100)]
    assert any(re.match(r"\d+\w? [A-Z]", p) for p in places)  # street addresses among them
    lists = [draw("person", rng, listed=1.0) for _ in range(100)]
    assert all(" and " in v or ", " in v or " & " in v or " or " in v for v in lists)


JOIN_CLAUSES = ["book a taxi to the airport", "set an alarm for 6", "turn on the kitchen lights"]


def joined_in_order(n: int, first_at: int, **options) -> list[str]:
    """n joins of JOIN_CLAUSES with ``join``'s ``options``; each clause appears (but for its first letter) in
    order, the first at index >= ``first_at``."""
    rng = np.random.default_rng(0)
    texts = [join(JOIN_CLAUSES, rng, False, **options) for _ in range(n)]
    for text in texts:
        positions = [text.find(c[1:]) for c in JOIN_CLAUSES]
        assert positions == sorted(positions) and min(positions) >= first_at, text
    return texts


def test_list_joins_keep_every_clause_verbatim_and_in_order():
    texts = joined_in_order(200, 0, lists=1.0)
    assert any("\n" in t for t in texts) and any("1)" in t for t in texts) and any(", and " in t for t in texts)


def test_names_and_lists_change_the_requests_and_stay_well_formed():
    kw = {**SPLIT_KW, "size": 400}
    plain, varied = make_split("train", wording=SWAPPED, **kw), make_split("train", wording=NAMES_AND_LISTS, **kw)
    assert [e.request for e in plain] != [e.request for e in varied]
    for e in varied:
        assert "{" not in e.request
        spans = e.clause_spans()  # every clause sits in the request, in order
        assert len(spans) == len(e.tools) and all(a < b for (a, _), (b, _) in zip(spans, spans[1:]))
    patterns = {p for e in varied for p in e.patterns}
    assert patterns & {p for text in DETAIL_PHRASINGS.values() for p in text.split("|")}


def test_detail_phrasings_cover_every_tool_with_known_slots():
    assert set(DETAIL_PHRASINGS) == set(TEMPLATES)
    for tool, text in DETAIL_PHRASINGS.items():
        phrasings = text.split("|")
        assert len(phrasings) == 4 and len(set(phrasings)) == 4, tool
        for slot in re.findall(r"\{(\w+)\}", text):
            assert slot.rstrip("2") in SLOTS, (tool, slot)
