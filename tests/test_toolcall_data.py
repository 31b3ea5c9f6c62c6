"""The tool-discovery example generator: split hygiene, determinism, label validity and order."""
from __future__ import annotations

import pytest

from builder.catalog import load_catalog
from builder.toolcall_data import CONNECTORS, LEXICON_ID, SPLITS, TEMPLATES, make_split, template_splits, template_table
from builder.toolcall_lexicon import LEXICON

CATALOG = "builder/data/tools-64.json"
SIZE = 400  # examples per split checked: every tool appears, and the test stays well under a second


@pytest.fixture(scope="module")
def splits():
    """The splits as the training script draws them: train with noise and lexicon clauses."""
    return {"train": make_split("train", seed=0, size=SIZE, noise=0.05, lexicon=0.5),
            **{s: make_split(s, seed=0, size=SIZE) for s in ("val", "test")}}


def test_templates_and_lexicon_cover_the_catalog_exactly():
    assert set(TEMPLATES) == set(load_catalog(CATALOG).names) == set(LEXICON)
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
    assert LEXICON_ID in used["train"] and LEXICON_ID not in used["val"] | used["test"]
    used["train"].discard(LEXICON_ID)
    for split in SPLITS:
        assert all(assign[i] == split for i in used[split]), split
    assert not used["test"] & used["train"] and not used["val"] & used["train"]
    assert not used["test"] & used["val"]
    # the held-out phrasings really differ: no training pattern (template or lexicon) is a held-out template
    held_out = {t for i, (_, t) in enumerate(table) if assign[i] != "train"}
    assert not {p for e in splits["train"] for p in e.patterns} & held_out
    assert {p for e in splits["test"] for p in e.patterns} <= held_out


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
                assert i == LEXICON_ID or table[i] == (tool, pattern)
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
