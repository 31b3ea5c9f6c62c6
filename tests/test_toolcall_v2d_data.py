"""Model v2d's data options (``names``, ``listed``, ``lists``, ``extra``): with all of them off the v2c
training data stays byte for byte as it was; on, each changes only what it says."""
from __future__ import annotations

import hashlib
import re

import numpy as np

from models.toolcall.data import Wording, make_split
from models.toolcall.phrasings_d import PHRASINGS_D
from models.toolcall.pools import LISTABLE, NAMEABLE, draw
from models.toolcall.templates import SLOTS, TEMPLATES
from models.toolcall.wording import join

# v2c's training options (bench/RESULTS.md, "v2c"), and the sha256 of its first 500 training examples
# as the code before v2d wrote them (request, tools, clauses per line).
V2C = Wording(no_tool=0.1, pooled=0.8, typos=0.05, entity=0.25, trailers=0.1, statements=0.25, more=True, swap=0.15)
V2C_KW = dict(seed=0, size=500, noise=0.05, lexicon=0.5, paraphrases=True, counts=(0.25, 0.3, 0.25, 0.2))
V2C_SHA256 = "c7a503e4ef0f11b81133f9a89f0c872465c2730239d55ea6dc0809c90fbd4a65"
V2D = Wording(**{**V2C.__dict__, "swap": 0.2, "names": 0.2, "listed": 0.1, "lists": 0.3, "extra": True})


def _digest(examples) -> str:
    text = "\n".join(f"{e.request}\t{','.join(e.tools)}\t{'|'.join(e.clauses)}" for e in examples)
    return hashlib.sha256(text.encode()).hexdigest()


def test_options_off_keep_the_v2c_data_byte_identical():
    assert _digest(make_split("train", wording=V2C, **V2C_KW)) == V2C_SHA256


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


def test_v2d_split_changes_the_requests_and_stays_well_formed():
    kw = {**V2C_KW, "size": 400}
    plain, v2d = make_split("train", wording=V2C, **kw), make_split("train", wording=V2D, **kw)
    assert [e.request for e in plain] != [e.request for e in v2d]
    for e in v2d:
        assert "{" not in e.request
        spans = e.clause_spans()  # every clause sits in the request, in order
        assert len(spans) == len(e.tools) and all(a < b for (a, _), (b, _) in zip(spans, spans[1:]))
    patterns = {p for e in v2d for p in e.patterns}
    assert patterns & {p for text in PHRASINGS_D.values() for p in text.split("|")}


def test_v2d_phrasings_cover_every_tool_with_known_slots():
    assert set(PHRASINGS_D) == set(TEMPLATES)
    for tool, text in PHRASINGS_D.items():
        phrasings = text.split("|")
        assert len(phrasings) == 4 and len(set(phrasings)) == 4, tool
        for slot in re.findall(r"\{(\w+)\}", text):
            assert slot.rstrip("2") in SLOTS, (tool, slot)
