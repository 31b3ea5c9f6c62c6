"""A request's own answer rules, through the grammar (runtime/batching/scheduler.py ``Request``): at most N
tools, at least one tool, exactly one named tool, an answer-length cap. Each holds whatever the model
would rather say, a row's answer with its rules does not depend on its neighbours, and bad values are
typed refusals."""
from __future__ import annotations

import pytest

from toolcall.common.errors import RequestError
from toolcall.runtime.batching.batcher import Result
from toolcall.runtime.engine import Engine

TEXTS = ["Book a flight to Paris and a hotel in Rome", "What's the weather in Oslo tomorrow?", "hello there",
         "Send an email to Bob and text Alice", "Convert 20 euros to yen", "zzkq vlorp", "thanks, bye"]


@pytest.fixture(scope="module")
def engine(shipped_bundle):
    e = Engine.load(shipped_bundle)
    yield e
    e.close()


def answers(engine, **controls) -> list[Result]:
    results = engine.generator.generate([engine.request(t, **controls) for t in TEXTS])
    assert all(isinstance(r, Result) for r in results), results
    return results


def test_the_rules_hold_whatever_the_model_prefers(engine):
    free = answers(engine)
    assert any(len(r.tools) > 1 for r in free) and any(not r.tools for r in free), "the rules would not bind"
    for r in answers(engine, max_tools=1):
        assert len(r.tools) <= 1 and r.finish == "done"
    for r in answers(engine, require_tool=True):
        assert len(r.tools) >= 1 and r.finish == "done"
    for r in answers(engine, require_tool=True, max_tools=1):
        assert len(r.tools) == 1 and r.finish == "done"
    name = engine.grammar.tool_names[7]
    for r in answers(engine, tools=[name], require_tool=True):
        assert r.tools == [name] and r.finish == "done"
    limit = engine.contract.limits.max_output_tokens
    for r, f in zip(answers(engine, max_output_tokens=3), free):
        assert len(r.token_ids) <= 3 and r.token_ids == f.token_ids[:3] and limit >= 3
        assert r.finish == ("done" if len(f.token_ids) <= 3 else "length")
    assert any(len(f.token_ids) > 3 for f in free), "no answer longer than the cap: the test checks nothing"


def test_a_row_with_rules_answers_as_it_does_alone(engine):
    mixed = [engine.request(t, max_tools=1 if i % 2 else None, require_tool=i % 3 == 0,
                            max_output_tokens=None if i % 4 else 4) for i, t in enumerate(TEXTS)]
    together = engine.generator.generate(mixed)
    alone = [engine.generator.generate([r])[0] for r in mixed]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]


@pytest.mark.parametrize("controls", [dict(max_tools=0), dict(max_tools=10_000), dict(max_output_tokens=0),
                                      dict(max_output_tokens=-5), dict(max_output_tokens=10_000),
                                      dict(max_tools=1.5)])
def test_out_of_range_rules_are_refused_typed(engine, controls):
    with pytest.raises(RequestError) as info:
        engine.generator.submit(engine.request(TEXTS[0], **controls))
    assert info.value.code == "request_invalid" and info.value.details["field"] in controls
    assert engine.generator.kv.pages_in_use == 0
