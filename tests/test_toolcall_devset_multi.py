"""The multi-intent development set (models/recipe/devset_multi.tsv): a valid set of 2-4-tool
requests over the catalog, apart from the hand-written test set and the first dev set, and held out of
training like them (handwritten.without_evaluation_requests)."""
from __future__ import annotations

from toolcall.builder.catalog import load_catalog
from toolcall.models.recipe.data import Example
from toolcall.models.recipe.handwritten import (
    DEVSET,
    DEVSET_MULTI,
    HANDWRITTEN,
    load_handwritten,
    normalized,
    without_evaluation_requests,
)

CATALOG = "builder/data/tools-64.json"


def test_devset_multi_is_multi_intent_and_apart_from_the_other_sets():
    multi = load_handwritten(DEVSET_MULTI, set(load_catalog(CATALOG).names))
    sizes = [len(t) for _, t in multi]
    assert len(multi) >= 60 and min(sizes) >= 2 and sizes.count(3) >= 30 and sizes.count(4) >= 12
    assert len({normalized(r) for r, _ in multi}) == len(multi)
    others = {normalized(r) for p in (HANDWRITTEN, DEVSET) for r, _ in load_handwritten(p)}
    assert not [r for r, _ in multi if normalized(r) in others]


def test_devset_multi_requests_are_dropped_from_training():
    request, tools = load_handwritten(DEVSET_MULTI)[0]
    kept = without_evaluation_requests([Example(request.upper() + "!", tools, (), (), ()),
                                        Example("set an alarm for 7", ("set_alarm",), (), (), ())])
    assert [e.request for e in kept] == ["set an alarm for 7"]
