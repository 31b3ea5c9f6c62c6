"""The data option ``vary`` (invariance augmentation from training vocabulary): with vary 0 the training
data is exactly the data without it, byte for byte; with vary 1 every request's digits, case and closing
punctuation change, and no example's tools do."""
from __future__ import annotations

import dataclasses
import hashlib
import re

import numpy as np

from toolcall.models.recipe import data, variation
from toolcall.models.recipe.data import Wording, make_split
from toolcall.models.recipe.wording import vary_request

# every other data option on, as train.py's flags --no-tool 0.1 --statements 0.25 --typos 0.05 --entity 0.25
# --trailers 0.1 --more --swap 0.2 --names 0.2 --listed 0.1 --lists 0.3 --extra set them
OPTIONS = Wording(no_tool=0.1, typos=0.05, entity=0.25, trailers=0.1, statements=0.25, more=True, swap=0.2, names=0.2,
              listed=0.1, lists=0.3, extra=True)
KW = dict(seed=0, size=400, noise=0.05, lexicon=0.5, paraphrases=True, counts=(0.25, 0.3, 0.25, 0.2))
# sha256 of repr(make_split("train", wording=OPTIONS, **KW)) computed with the code before ``vary`` existed
# (main 4388775)
WITHOUT_VARY_SHA256 = "1bd71ccaea392e2c049b359ed3cc812a3819f214b417438919cb92b71ec7292d"


def test_vary_zero_keeps_the_pinned_bytes():
    for wording in (OPTIONS, dataclasses.replace(OPTIONS, vary=0.0)):
        assert hashlib.sha256(repr(make_split("train", wording=wording, **KW)).encode()).hexdigest() == \
            WITHOUT_VARY_SHA256


def test_vary_one_changes_digits_case_and_punctuation_never_the_tools(monkeypatch):
    built = []  # each example as built, before make_split varies it
    original = data._unvaried_example
    monkeypatch.setattr(data, "_unvaried_example", lambda *a, **k: built.append(original(*a, **k)) or built[-1])
    varied = make_split("train", wording=dataclasses.replace(OPTIONS, vary=1.0), **KW)
    assert len(built) == len(varied) == KW["size"]
    ends = lambda s: s.rstrip()[-1:] in (".", "!", "?")  # noqa: E731
    digits_changed = names_changed = 0
    for a, b in zip(built, varied):
        assert b.tools == a.tools and b.patterns == a.patterns and b.template_ids == a.template_ids
        assert len(b.clauses) == len(a.clauses)
        # the clauses are re-cut at the same places: the clause labels still line up
        assert [b.request[s:e] for s, e in b.clause_spans()] == list(b.clauses)
        if not a.request.strip():
            continue
        assert ends(b.request) != ends(a.request)  # the closing punctuation toggles
        if a.request[0].isalpha():  # the first letter's case flips
            assert b.request[0] != a.request[0] and b.request[0].lower() == a.request[0].lower()
        old_digits, new_digits = re.findall(r"\d+", a.request), re.findall(r"\d+", b.request)
        assert [len(d) for d in old_digits] == [len(d) for d in new_digits]
        digits_changed += old_digits != new_digits
        names_changed += len(b.request.rstrip(".!?")) != len(a.request.rstrip(".!?"))
    assert digits_changed > 20 and names_changed > 20


def test_vary_renames_mid_sentence_names_from_the_pools_and_keeps_quotes():
    rng = np.random.default_rng(0)
    request = "Text Jonas that I'm late, then call Mira on Friday at 5 and translate 'Hello Bob' to Spanish"
    clauses = ("Text Jonas that I'm late", "call Mira on Friday at 5", "translate 'Hello Bob' to Spanish")
    spans = [(request.index(c), request.index(c) + len(c)) for c in clauses]
    text, new = vary_request(request, clauses, rng, spans)
    assert text[0] == "t" and text[-1] in ".!?"
    assert "Jonas" not in text and "Mira" not in text and "Spanish" not in text
    assert "Friday" in text and "I'm" in text and "'Hello Bob'" in text
    assert not set(re.findall(r"[A-Z]\w+", text)) & set(variation.NAMES)  # training names, not the check's
    assert [text[s:e] for s, e in [(text.index(c), text.index(c) + len(c)) for c in new]] == list(new)
    assert new[0].startswith("text ") and new[1].startswith("call ") and new[2].startswith("translate ")
    assert vary_request("  ", (), rng, []) == ("  ", ())


def test_a_clause_opening_word_is_never_renamed():
    rng = np.random.default_rng(1)
    request = "hi, Call my mom"
    text, clauses = vary_request(request, ("Call my mom",), rng, [(4, 15)])
    assert text.startswith("Hi, Call my mom") and clauses == ("Call my mom",)


def test_a_request_whose_clauses_cannot_be_recut_stays_as_it_was():
    rng = np.random.default_rng(2)  # a one-letter clause (clause_spans finds it one character early)
    assert vary_request("A. Next, create Bob?", ("a", "create Bob"), rng, [(-1, 0), (9, 19)]) == (
        "A. Next, create Bob?", ("a", "create Bob"))
