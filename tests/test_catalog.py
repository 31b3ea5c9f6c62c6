"""Catalog loading: schema, defaults, and every typed error naming the tool at fault."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, normalizers

from toolcall.builder import catalog as catalog_module
from toolcall.builder.catalog import (
    DEFAULT_PROMPT_TEMPLATE,
    MAX_CATALOG_TOOLS,
    AnswerFormat,
    Catalog,
    load_catalog,
    tokenize_catalog,
)
from toolcall.builder.synth_tokenizer import END_OF_TURN, train_tokenizer
from toolcall.common.errors import BuildError, CatalogError
from toolcall.schemas.load import load_schema


@lru_cache(maxsize=1)
def tokenizer() -> Tokenizer:
    return train_tokenizer(seed=0, vocab_size=2048)


def end_id() -> int:
    return tokenizer().token_to_id(END_OF_TURN)


def catalog_error(source, **expected_details) -> CatalogError:
    with pytest.raises(CatalogError) as info:
        load_catalog(source)
    assert info.value.code == "catalog_invalid"
    for key, value in expected_details.items():
        assert info.value.details.get(key) == value, (key, info.value.details)
    return info.value


def token_error(doc: dict, **expected_details) -> CatalogError:
    with pytest.raises(CatalogError) as info:
        tokenize_catalog(load_catalog(doc), tokenizer(), end_id())
    assert info.value.code == "catalog_invalid"
    for key, value in expected_details.items():
        assert info.value.details.get(key) == value, (key, info.value.details)
    return info.value


def tools(*names: str) -> list[dict]:
    return [{"name": n} for n in names]


def test_example_catalog_loads_with_64_described_tools():
    path = Path(catalog_module.__file__).parent / "data" / "tools-64.json"  # the package data, installed
    catalog = load_catalog(str(path))
    assert len(catalog.tools) == 64 and len(set(catalog.names)) == 64
    assert all(t.description for t in catalog.tools)
    tokenized = tokenize_catalog(catalog, tokenizer(), end_id())
    assert all(tokenizer().decode(list(p)) == t.name for p, t in zip(tokenized.paths, catalog.tools))


def test_defaults_are_filled_in():
    catalog = load_catalog({"tools": tools("get_weather")})
    assert catalog == Catalog(tools=catalog.tools, answer=AnswerFormat("\n", 4, False),
                              prompt_template=DEFAULT_PROMPT_TEMPLATE)
    assert catalog.tools[0].token_ids is None and catalog.tools[0].description is None


def test_file_and_dict_give_the_same_catalog(tmp_path):
    doc = {"tools": [{"name": "a", "description": "x", "token_ids": [5, 6]}],
           "answer": {"separator": ",", "max_tools": 2, "allow_empty": True},
           "prompt_template": "Q: {request}\nA:"}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    catalog = load_catalog(path)
    assert catalog == load_catalog(doc)
    assert catalog.tools[0].token_ids == (5, 6) and catalog.answer == AnswerFormat(",", 2, True)


def _walk_schema(node, where="$"):
    if isinstance(node, dict):
        if node.get("type") == "object":
            assert node.get("additionalProperties") is False, where
            for name, sub in node["properties"].items():
                assert sub.get("description"), f"{where}.{name} has no description"
        for key, sub in node.items():
            yield from _walk_schema(sub, f"{where}.{key}")
        yield where
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            yield from _walk_schema(sub, f"{where}[{i}]")


def test_schema_is_closed_and_described():
    schema = load_schema("catalog")
    assert schema["$schema"].endswith("2020-12/schema")
    assert schema["properties"]["tools"]["maxItems"] == MAX_CATALOG_TOOLS
    assert len(list(_walk_schema(schema))) > 10


def test_missing_file_and_bad_json(tmp_path):
    err = catalog_error(tmp_path / "absent.json")
    assert "not found" in err.message
    bad = tmp_path / "bad.json"
    bad.write_text('{"tools": [')
    err = catalog_error(bad, line=1)
    assert "not valid JSON" in err.message
    (tmp_path / "list.json").write_text("[1, 2]")
    catalog_error(tmp_path / "list.json")


@pytest.mark.parametrize("doc, details", [
    ({"tools": []}, {"path": "tools"}),
    ({}, {"path": "(top level)"}),
    ({"tools": tools("a"), "extra": 1}, {"path": "(top level)"}),
    ({"tools": [{"name": "a"}, {"name": ""}]}, {"index": 1, "name": ""}),
    ({"tools": [{"name": "a", "colour": "red"}]}, {"index": 0, "name": "a"}),
    ({"tools": [{"name": "a", "token_ids": []}]}, {"index": 0, "name": "a"}),
    ({"tools": [{"name": "a", "token_ids": [-1]}]}, {"index": 0, "name": "a"}),
    ({"tools": [{"name": 3}]}, {"index": 0, "name": None}),
    ({"tools": tools("a"), "answer": {"max_tools": 0}}, {"path": "answer/max_tools"}),
    ({"tools": tools("a"), "answer": {"separator": ""}}, {"path": "answer/separator"}),
])
def test_schema_violations_are_typed(doc, details):
    err = catalog_error(doc, **details)
    assert "schemas/catalog.schema.json" in err.message


def test_semantic_errors_name_the_tool():
    err = catalog_error({"tools": tools("a", "b", "a")}, index=2, name="a", first_index=0)
    assert "duplicates" in err.message and "tool 0" in err.message
    catalog_error({"tools": tools("a", "  ")}, index=1, name="  ")
    catalog_error({"tools": tools("a", "b,c"), "answer": {"separator": ","}}, index=1, name="b,c")
    catalog_error({"tools": tools("a", "x\ny")}, index=1, name="x\ny")


def test_too_many_tools_is_refused_with_the_numbers():
    doc = {"tools": [{"name": f"t{i}"} for i in range(MAX_CATALOG_TOOLS + 1)]}
    err = catalog_error(doc, tools=MAX_CATALOG_TOOLS + 1, max_tools_supported=MAX_CATALOG_TOOLS)
    assert str(MAX_CATALOG_TOOLS) in err.message
    assert len(load_catalog({"tools": doc["tools"][:MAX_CATALOG_TOOLS]}).tools) == MAX_CATALOG_TOOLS


def test_token_level_errors():
    vocab = tokenizer().get_vocab_size()
    sep = tokenizer().token_to_id("Ċ")  # byte-level "\n"
    assert tokenizer().encode("\n", add_special_tokens=False).ids == [sep]
    token_error({"tools": tools("a"), "answer": {"separator": " and then"}}, separator=" and then")
    token_error({"tools": tools("a"), "answer": {"separator": END_OF_TURN}}, token_id=end_id())
    token_error({"tools": tools("ok", "x" + END_OF_TURN)}, index=1, name="x" + END_OF_TURN,
                token_id=end_id(), position=1)
    token_error({"tools": [{"name": "a"}, {"name": "b", "token_ids": [7, sep]}]},
                index=1, name="b", token_id=sep, position=1)
    token_error({"tools": [{"name": "a", "token_ids": [3, vocab]}]}, index=0, name="a",
                token_ids=[vocab], vocab_size=vocab)
    a_ids = list(tokenizer().encode("a", add_special_tokens=False).ids)
    token_error({"tools": [{"name": "a"}, {"name": "b", "token_ids": a_ids}]},
                index=1, name="b", other_index=0)


def test_name_that_tokenizes_to_nothing():
    dropping = Tokenizer.from_str(tokenizer().to_str())
    dropping.normalizer = normalizers.Replace("x", "")  # a tokenizer that drops the letter x
    with pytest.raises(CatalogError) as info:
        tokenize_catalog(load_catalog({"tools": tools("ab", "xxx")}), dropping, end_id())
    assert info.value.details == {"index": 1, "name": "xxx"}
    assert "no tokens" in info.value.message


def test_end_token_outside_vocabulary_is_a_build_error():
    with pytest.raises(BuildError) as info:
        tokenize_catalog(load_catalog({"tools": tools("a")}), tokenizer(), 10**6)
    assert info.value.code == "build_failed" and info.value.details["end_token_id"] == 10**6


names = st.lists(st.text(alphabet="abc_é1 ", min_size=1, max_size=8).filter(str.strip),
                 min_size=1, max_size=40, unique=True)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(names=names)
def test_any_unique_visible_names_tokenize_losslessly(names):
    catalog = load_catalog({"tools": tools(*names)})
    tokenized = tokenize_catalog(catalog, tokenizer(), end_id())
    assert len(set(tokenized.paths)) == len(names)
    for path, name in zip(tokenized.paths, names):
        assert tokenizer().decode(list(path)) == name
        assert tokenized.sep_token_id not in path and end_id() not in path
