"""The data option ``swap``: proper-noun slots take another such slot's generated value (a person's name
where a city goes), and with swap 0 the data is exactly the data without the option."""
from __future__ import annotations

import numpy as np

from toolcall.models.recipe.data import Wording, make_split
from toolcall.models.recipe.pools import GENERATORS, SWAPPABLE, draw

DISTRACTORS = Wording(no_tool=0.1, typos=0.05, entity=0.25, trailers=0.1, statements=0.25, more=True)


def test_swap_zero_draws_exactly_as_before():
    r1, r2 = np.random.default_rng(7), np.random.default_rng(7)
    assert [draw("city", r1) for _ in range(40)] == [draw("city", r2, 0.8, None, 0.0, 0.0) for _ in range(40)]
    kw = dict(seed=0, size=300, noise=0.05, lexicon=0.5, paraphrases=True, counts=(0.3, 0.3, 0.22, 0.18))
    assert make_split("train", wording=DISTRACTORS, **kw) == make_split(
        "train", wording=Wording(**{**DISTRACTORS.__dict__, "swap": 0.0}), **kw)


def test_swap_fills_a_proper_noun_slot_from_another_kind():
    assert set(SWAPPABLE) <= set(GENERATORS)
    rng = np.random.default_rng(0)
    values = [draw("city", rng, 0.8, None, 0.0, 1.0) for _ in range(200)]
    # cities are one capitalized made-up word; swapped values include relations ("my sister"), two-word
    # artists and movies, and "the ...s" teams
    assert any(" " in v for v in values) and len(set(values)) > 150
    assert draw("duration", np.random.default_rng(1), 0.8, None, 0.0, 1.0) == draw(
        "duration", np.random.default_rng(1))  # a slot outside SWAPPABLE is never swapped


def test_swap_changes_the_training_requests_and_fills_every_slot():
    kw = dict(seed=0, size=400, noise=0.05, lexicon=0.5, paraphrases=True, counts=(0.25, 0.3, 0.25, 0.2))
    plain = make_split("train", wording=DISTRACTORS, **kw)
    swapped = make_split("train", wording=Wording(**{**DISTRACTORS.__dict__, "swap": 0.15}), **kw)
    assert [e.request for e in plain] != [e.request for e in swapped]
    assert all("{" not in e.request for e in swapped)
