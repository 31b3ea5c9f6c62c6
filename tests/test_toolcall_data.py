"""The tool-discovery example generator: split hygiene, determinism, label validity and order."""
from __future__ import annotations

import pytest

from toolcall.builder.catalog import load_catalog
from toolcall.models.recipe.data import (
    CONNECTORS,
    LEXICON_ID,
    PARAPHRASE_ID,
    SPLITS,
    TEMPLATES,
    make_split,
    near_held_out,
    template_splits,
    template_table,
)
from toolcall.models.recipe.lexicon import LEXICON
from toolcall.models.recipe.paraphrases import PARAPHRASES
from toolcall.models.recipe.templates import SLOTS

CATALOG = "builder/data/tools-64.json"
SIZE = 400  # examples per split checked: every tool appears, and the test stays well under a second


@pytest.fixture(scope="module")
def splits():
    """The splits as the training script draws them: train with noise and lexicon clauses."""
    return {"train": make_split("train", seed=0, size=SIZE, noise=0.05, lexicon=0.5, paraphrases=True),
            **{s: make_split(s, seed=0, size=SIZE) for s in ("val", "test")}}


def test_templates_and_lexicon_cover_the_catalog_exactly():
    assert set(TEMPLATES) == set(load_catalog(CATALOG).names) == set(LEXICON) == set(PARAPHRASES)
    assert all(len(t.split("|")) == 7 for t in TEMPLATES.values())


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_each_tool_has_one_test_one_val_and_five_train_templates(seed):
    assign, table = template_splits(seed), template_table()
    assert set(assign) == set(range(len(table)))
    for tool in TEMPLATES:
        mine = [assign[i] for i, (t, _) in enumerate(table) if t == tool]
        assert sorted(mine) == ["test", "train", "train", "train", "train", "train", "val"]


def test_no_test_or_val_template_is_seen_in_training(splits):
    assign, table = template_splits(0), template_table()
    used = {s: {i for e in splits[s] for i in e.template_ids} for s in SPLITS}
    for extra in (LEXICON_ID, PARAPHRASE_ID):
        assert extra in used["train"] and extra not in used["val"] | used["test"]
        used["train"].discard(extra)
    for split in SPLITS:
        assert all(assign[i] == split for i in used[split]), split
    assert not used["test"] & used["train"] and not used["val"] & used["train"]
    assert not used["test"] & used["val"]
    # the held-out phrasings really differ: no training pattern (template or lexicon) is a held-out template
    held_out = {t for i, (_, t) in enumerate(table) if assign[i] != "train"}
    assert not {p for e in splits["train"] for p in e.patterns} & held_out
    assert {p for e in splits["test"] for p in e.patterns} <= held_out


@pytest.mark.parametrize("pattern, held_out, near", [
    ("show my open tasks", ["list my open tasks please"], True),  # a shared run of three words
    ("reading emails from {person}", ["read email from {person} now"], True),  # the same run once stemmed
    ("what are my open tasks", ["which tasks are still open"], False),  # 3 of 7 stems
    ("check my inbox", ["read my emails", "open the mail app"], False),
    ("check my inbox", ["read my emails", "check the inbox"], True),  # 2 of 4: exactly half
    ("anything", [], False),
])
def test_near_held_out(pattern, held_out, near):
    assert near_held_out(pattern, held_out) is near


@pytest.mark.parametrize("seed", [0, 1])
def test_paraphrases_train_only_and_never_near_a_held_out_template(seed):
    assign, table = template_splits(seed), template_table()
    train = make_split("train", seed=seed, size=SIZE, paraphrases=True)
    drawn = {(t, p) for e in train for t, p, i in zip(e.tools, e.patterns, e.template_ids) if i == PARAPHRASE_ID}
    assert drawn and all(p in PARAPHRASES[t] for t, p in drawn)
    for tool, pattern in drawn:
        held = [t for i, (owner, t) in enumerate(table) if owner == tool and assign[i] != "train"]
        assert not near_held_out(pattern, held), (tool, pattern)
    with pytest.raises(ValueError, match="train split only"):
        make_split("val", seed=seed, paraphrases=True)


def test_paraphrases_are_well_formed():
    for tool, phrasings in PARAPHRASES.items():
        assert len(phrasings) == 8 and len(set(phrasings)) == 8, tool
        for p in phrasings:
            assert p == p.strip() and "  " not in p and p[-1] not in ".?!" and p == p.lower(), p
            slots = [part.split("}")[0] for part in p.split("{")[1:]]
            assert all(s.rstrip("2") in SLOTS for s in slots), p


def test_same_seed_same_examples_other_seed_other_examples():
    assert make_split("test", seed=0, size=50) == make_split("test", seed=0, size=50)
    assert make_split("train", seed=3, size=50) == make_split("train", seed=3, size=50)
    assert make_split("test", seed=0, size=50) != make_split("test", seed=1, size=50)
    assert template_splits(0) != template_splits(1)


def test_labels_are_distinct_catalog_tools_one_to_four(splits):
    names = set(load_catalog(CATALOG).names)
    counts = set()
    for examples in splits.values():
        for e in examples:
            assert 1 <= len(e.tools) <= 4 and len(set(e.tools)) == len(e.tools)
            assert set(e.tools) <= names
            counts.add(len(e.tools))
    assert counts == {1, 2, 3, 4}
    assert {t for e in splits["train"] for t in e.tools} == names


def test_labels_are_in_canonical_order_of_mention(splits):
    table = template_table()
    for examples in splits.values():
        for e in examples:
            for i, pattern, tool in zip(e.template_ids, e.patterns, e.tools, strict=True):
                assert i in (LEXICON_ID, PARAPHRASE_ID) or table[i] == (tool, pattern)
            # each clause appears in the request, in the order of the labels
            at = 0
            for k, clause in enumerate(e.clauses):
                body = clause if k else clause[1:]  # the first clause is capitalized in the request
                pos = e.request.find(body, at)
                assert pos >= at, (e.request, clause)
                at = pos + len(body)


def test_clause_spans_cover_each_clause_and_nothing_between(splits):
    connectors = {c.strip(" ,.;").lower() for c in CONNECTORS}
    for examples in splits.values():
        for e in examples:
            spans = e.clause_spans()
            assert len(spans) == len(e.tools)
            for (start, end), clause in zip(spans, e.clauses):
                assert e.request[start:end].lower() == clause.lower()
            # what lies between clauses is a connector; after the last, at most the closing punctuation
            for (_, end), (start, _) in zip(spans, spans[1:]):
                assert end < start and e.request[end:start].strip(" ,.;").lower() in connectors
            assert spans[0][0] == 0 and e.request[spans[-1][1]:] in {"", ".", "!", "?"}


def test_requests_have_no_unfilled_slots(splits):
    for examples in splits.values():
        for e in examples:
            assert "{" not in e.request and "}" not in e.request and "  " not in e.request
            assert not e.request[0].islower()


def test_unknown_split_and_noisy_test_split_are_refused():
    with pytest.raises(ValueError, match="unknown split"):
        make_split("dev")
    with pytest.raises(ValueError, match="train split only"):
        make_split("test", noise=0.1)
