"""The data options ``related`` (a request's tools drawn from neighbouring catalog tools) and ``sentences``
(sentence-like joins): with both off the training data stays byte for byte the data without them; on, each
changes only what it says."""
from __future__ import annotations

from test_toolcall_names_and_lists import NAMES_AND_LISTS, SPLIT_KW, _digest, joined_in_order

from toolcall.models.recipe.data import RELATED_WINDOW, Wording, make_split
from toolcall.models.recipe.templates import TEMPLATES
from toolcall.models.recipe.wording import SENTENCE_JOINS

# the sha256 of NAMES_AND_LISTS's first 500 training examples (request, tools, clauses per line) as written before
# ``related`` and ``sentences`` existed
NAMES_AND_LISTS_SHA256 = "be6e9f7ca7fed9586ec6a36a04aade0e17c4badff6f11f50e6813ebb40fea799"


def test_options_off_keep_the_pinned_bytes():
    assert _digest(make_split("train", wording=NAMES_AND_LISTS, **SPLIT_KW)) == NAMES_AND_LISTS_SHA256


def test_related_requests_draw_neighbouring_tools():
    order = {t: i for i, t in enumerate(TEMPLATES)}
    related = Wording(**{**NAMES_AND_LISTS.__dict__, "related": 1.0})
    examples = [e for e in make_split("train", wording=related, **{**SPLIT_KW, "size": 400}) if len(e.tools) >= 2]
    assert len(examples) > 200
    spreads = [max(order[t] for t in e.tools) - min(order[t] for t in e.tools) for e in examples]
    assert max(spreads) < RELATED_WINDOW and len(set(spreads)) > 3
    plain = [e for e in make_split("train", wording=NAMES_AND_LISTS, **{**SPLIT_KW, "size": 400}) if len(e.tools) >= 2]
    assert max(max(order[t] for t in e.tools) - min(order[t] for t in e.tools) for e in plain) >= RELATED_WINDOW


def test_sentence_joins_keep_clauses_in_order_and_spans_right():
    texts = joined_in_order(300, 1, sentences=1.0)
    assert any(j.strip() and j in t for t in texts for j in SENTENCE_JOINS if j.strip(" .,"))
    assert any("Set an alarm" in t for t in texts) and any("set an alarm" in t for t in texts)
    sentences = Wording(**{**NAMES_AND_LISTS.__dict__, "sentences": 0.5})
    for e in make_split("train", wording=sentences, **{**SPLIT_KW, "size": 300}):
        for (start, end), clause in zip(e.clause_spans(), e.clauses):
            assert e.request[start + 1:end] == clause[1:], (e.request, clause)
