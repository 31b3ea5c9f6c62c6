"""Model v2f's data options (``related``, ``sentences``): with both off the v2d/v2e training data stays byte
for byte as it was; on, each changes only what it says."""
from __future__ import annotations

from models.toolcall.data import RELATED_WINDOW, Wording, make_split
from models.toolcall.templates import TEMPLATES
from models.toolcall.wording import SENTENCE_JOINS
from test_toolcall_v2d_data import V2C_KW as V2D_KW
from test_toolcall_v2d_data import V2D, _digest, joined_in_order  # v2d's (and v2e's) options, its helpers

# the sha256 of v2d's first 500 training examples as the code before v2f wrote them (request, tools, clauses per line)
V2D_SHA256 = "be6e9f7ca7fed9586ec6a36a04aade0e17c4badff6f11f50e6813ebb40fea799"


def test_options_off_keep_the_v2d_data_byte_identical():
    assert _digest(make_split("train", wording=V2D, **V2D_KW)) == V2D_SHA256


def test_related_requests_draw_neighbouring_tools():
    order = {t: i for i, t in enumerate(TEMPLATES)}
    related = Wording(**{**V2D.__dict__, "related": 1.0})
    examples = [e for e in make_split("train", wording=related, **{**V2D_KW, "size": 400}) if len(e.tools) >= 2]
    assert len(examples) > 200
    spreads = [max(order[t] for t in e.tools) - min(order[t] for t in e.tools) for e in examples]
    assert max(spreads) < RELATED_WINDOW and len(set(spreads)) > 3
    plain = [e for e in make_split("train", wording=V2D, **{**V2D_KW, "size": 400}) if len(e.tools) >= 2]
    assert max(max(order[t] for t in e.tools) - min(order[t] for t in e.tools) for e in plain) >= RELATED_WINDOW


def test_sentence_joins_keep_clauses_in_order_and_spans_right():
    texts = joined_in_order(300, 1, sentences=1.0)
    assert any(j.strip() and j in t for t in texts for j in SENTENCE_JOINS if j.strip(" .,"))
    assert any("Set an alarm" in t for t in texts) and any("set an alarm" in t for t in texts)
    sentences = Wording(**{**V2D.__dict__, "sentences": 0.5})
    for e in make_split("train", wording=sentences, **{**V2D_KW, "size": 300}):
        for (start, end), clause in zip(e.clause_spans(), e.clauses):
            assert e.request[start + 1:end] == clause[1:], (e.request, clause)
