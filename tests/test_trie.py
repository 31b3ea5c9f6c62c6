"""Trie builder and grammar.msgpack: structure checked against an independent prefix oracle,
bitset widths, determinism, round trips and refusals of damaged files."""
from __future__ import annotations

import itertools
from functools import lru_cache
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolcall.builder import catalog as catalog_module
from toolcall.builder.catalog import load_catalog
from toolcall.builder.synth_tokenizer import END_OF_TURN, train_tokenizer
from toolcall.builder.trie import build_grammar
from toolcall.common.errors import Refusal
from toolcall.runtime.grammar.trie import EDGE_EMPTY_END, EDGE_END, EDGE_NAME, EDGE_SEP, ROOT, Grammar


@lru_cache(maxsize=1)
def tokenizer():
    return train_tokenizer(seed=0, vocab_size=2048)


END = tokenizer().token_to_id(END_OF_TURN)
SEP = tokenizer().encode("\n", add_special_tokens=False).ids[0]
ALPHABET = [t for t in range(20, 26) if t not in (SEP, END)]  # few tokens: many shared prefixes


def path_grammar(paths, max_tools=4, allow_empty=False) -> Grammar:
    doc = {"tools": [{"name": f"t{i}", "token_ids": list(p)} for i, p in enumerate(paths)],
           "answer": {"max_tools": max_tools, "allow_empty": allow_empty}}
    return build_grammar(load_catalog(doc), tokenizer(), END)


def name_grammar(names, max_tools=4, allow_empty=False) -> Grammar:
    doc = {"tools": [{"name": n} for n in names],
           "answer": {"max_tools": max_tools, "allow_empty": allow_empty}}
    return build_grammar(load_catalog(doc), tokenizer(), END)


token_paths = st.lists(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=4).map(tuple),
                       min_size=1, max_size=80, unique=True)
# Snake-case names from overlapping parts: shared prefixes and names that prefix others.
name_parts = ["get", "get_", "weather", "we", "w", "search", "_", "flights", "s", "a", "ab", "1"]
tool_names = st.lists(st.lists(st.sampled_from(name_parts), min_size=1, max_size=4).map("".join),
                      min_size=1, max_size=60, unique=True)
answers = st.fixed_dictionaries({"max_tools": st.integers(1, 5), "allow_empty": st.booleans()})


def node_prefixes(g: Grammar) -> dict[int, tuple[int, ...]]:
    """Token prefix of every trie node, found by walking name edges from the root."""
    prefix = {ROOT: ()}
    for node in range(g.num_nodes):  # breadth-first numbering: a parent precedes its children
        for e in range(g.node_edge_start[node], g.node_edge_start[node + 1]):
            if g.edge_kind[e] == EDGE_NAME:
                prefix[int(g.edge_child[e])] = prefix[node] + (int(g.edge_token[e]),)
    return prefix


def bits_to_tools(row: np.ndarray) -> set[int]:
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def check_against_oracle(g: Grammar, paths, max_tools, allow_empty):
    t = len(paths)
    assert g.num_tools == t and g.bitset_words == -(-t // 64)
    assert [g.tool_path(i) for i in range(t)] == [tuple(p) for p in paths]
    prefix = node_prefixes(g)
    distinct_prefixes = {tuple(p[:k]) for p in paths for k in range(1, len(p) + 1)}
    assert set(prefix.values()) == distinct_prefixes | {()}
    assert g.num_nodes == len(distinct_prefixes) + 2 and g.terminal not in prefix
    assert [len(prefix[n]) for n in range(g.num_nodes - 1)] == sorted(len(p) for p in prefix.values())
    degrees = np.diff(g.node_edge_start.astype(int))
    assert degrees[g.terminal] == 0 and g.max_edges_per_node == degrees.max()
    owner = {tuple(p): i for i, p in enumerate(paths)}
    for node in range(g.num_nodes - 1):
        p = prefix[node]
        edges = range(g.node_edge_start[node], g.node_edge_start[node + 1])
        tokens = [int(g.edge_token[e]) for e in edges]
        assert tokens == sorted(set(tokens))
        seen = set()
        for e in edges:
            kind, token, tool = int(g.edge_kind[e]), int(g.edge_token[e]), int(g.edge_tool[e])
            seen.add(kind)
            tools = bits_to_tools(g.edge_bits[e])
            if kind == EDGE_NAME:
                assert prefix[int(g.edge_child[e])] == p + (token,) and tool == -1
                assert tools == {i for i, q in enumerate(paths) if tuple(q[:len(p) + 1]) == p + (token,)}
            elif kind in (EDGE_SEP, EDGE_END):
                assert owner[p] == tool and tools == {tool}
                assert (token, int(g.edge_child[e])) == ((SEP, ROOT) if kind == EDGE_SEP else (END, g.terminal))
            else:
                assert kind == EDGE_EMPTY_END and node == ROOT and allow_empty and not tools
        assert (EDGE_END in seen) == (p in owner)
        assert (EDGE_SEP in seen) == (p in owner and min(max_tools, t) > 1)
        assert (EDGE_EMPTY_END in seen) == (node == ROOT and allow_empty)


@settings(derandomize=True, max_examples=80, deadline=None)
@given(paths=token_paths, answer=answers)
def test_token_path_trie_matches_prefix_oracle(paths, answer):
    g = path_grammar(paths, **answer)
    check_against_oracle(g, paths, **answer)


@settings(derandomize=True, max_examples=40, deadline=None)
@given(names=tool_names, answer=answers)
def test_name_trie_matches_prefix_oracle(names, answer):
    g = name_grammar(names, **answer)
    paths = [tuple(tokenizer().encode(n, add_special_tokens=False).ids) for n in names]
    check_against_oracle(g, paths, **answer)
    assert g.tool_names == tuple(names)


def test_prefix_names_share_a_node_with_end_and_name_edges():
    g = name_grammar(["get", "get_weather"])
    prefix = node_prefixes(g)
    get_node = next(n for n, p in prefix.items() if p == g.tool_path(0))
    kinds = set(g.edge_kind[g.node_edge_start[get_node]:g.node_edge_start[get_node + 1]].tolist())
    assert kinds == {EDGE_NAME, EDGE_SEP, EDGE_END}


@pytest.mark.parametrize("tools, words", [(1, 1), (64, 1), (65, 2), (128, 2), (129, 3), (300, 5)])
def test_bitset_width_is_smallest_multiple_of_64(tools, words):
    paths = list(itertools.islice(itertools.product(ALPHABET, repeat=4), tools))
    g = path_grammar(paths)
    assert g.bitset_words == words and g.edge_bits.shape == (g.num_edges, words)
    check_against_oracle(g, paths, 4, False)


def example_grammar() -> Grammar:
    path = Path(catalog_module.__file__).parent / "data" / "tools-64.json"  # the package data, installed
    return build_grammar(load_catalog(str(path)), tokenizer(), END)


def test_example_catalog_grammar():
    g = example_grammar()
    assert g.num_tools == 64 and g.bitset_words == 1 and g.sep_token_id == SEP
    assert bits_to_tools(np.bitwise_or.reduce(g.edge_bits[:g.node_edge_start[1]])) == set(range(64))
    assert g.summary()["bitset_bits"] == 64 and g.max_answer_tokens >= 4 + 4


def generated_names(count: int) -> list[str]:
    verbs = "get set list create delete update search find send book check track".split()
    nouns = "weather flight hotel email event file note task invoice order user stock".split()
    names = (f"{v}_{n}_{k}" for k in itertools.count() for v in verbs for n in nouns)
    return list(itertools.islice(names, count))


def test_4096_tool_catalog_builds_and_round_trips():
    names = generated_names(4096)
    g = name_grammar(names)
    assert g.num_tools == 4096 and g.bitset_words == 64
    assert bits_to_tools(np.bitwise_or.reduce(g.edge_bits[:g.node_edge_start[1]])) == set(range(4096))
    data = g.to_msgpack()
    assert Grammar.from_msgpack(data) == g and Grammar.from_msgpack(data).to_msgpack() == data


@settings(derandomize=True, max_examples=40, deadline=None)
@given(paths=token_paths, answer=answers)
def test_msgpack_round_trip_is_identical_and_deterministic(paths, answer):
    g = path_grammar(paths, **answer)
    data = g.to_msgpack()
    back = Grammar.from_msgpack(data)
    assert back == g and back.to_msgpack() == data
    assert path_grammar(paths, **answer).to_msgpack() == data  # rebuilt: same bytes
    assert back.summary() == g.summary()


def test_write_and_read(tmp_path):
    g = example_grammar()
    g.write(tmp_path / "grammar.msgpack")
    assert Grammar.read(tmp_path / "grammar.msgpack") == g
    with pytest.raises(Refusal) as info:
        Grammar.read(tmp_path / "absent.msgpack")
    assert info.value.code == "file_missing"


def tampered(mutate) -> bytes:
    doc = msgpack.unpackb(path_grammar([(20,), (20, 21), (22, 21)]).to_msgpack(), raw=False)
    mutate(doc)
    return msgpack.packb(doc, use_bin_type=True)


def flip_bit(doc, name, byte=0):
    data = bytearray(doc["arrays"][name]["data"])
    data[byte] ^= 1
    doc["arrays"][name]["data"] = bytes(data)


@pytest.mark.parametrize("data, code", [
    (b"", "bundle_invalid"),
    (b"\xc1garbage", "bundle_invalid"),
    (path_grammar([(20,)]).to_msgpack()[:-7], "bundle_invalid"),
    (tampered(lambda d: d.update(format="other")), "bundle_invalid"),
    (tampered(lambda d: d.update(version=2)), "format_unsupported"),
    (tampered(lambda d: d.update(version="1")), "format_unsupported"),
    (tampered(lambda d: d["arrays"]["edge_token"].update(dtype="<i8")), "bundle_invalid"),
    (tampered(lambda d: d["arrays"]["edge_bits"].update(shape=[1, 1])), "bundle_invalid"),
    (tampered(lambda d: d["arrays"].pop("edge_kind")), "bundle_invalid"),
    (tampered(lambda d: d.pop("sep_token_id")), "bundle_invalid"),
    (tampered(lambda d: d.update(max_edges_per_node=99)), "bundle_invalid"),
    (tampered(lambda d: d.update(tool_names=["a", "b"])), "bundle_invalid"),
    (tampered(lambda d: d.update(allow_empty=1)), "bundle_invalid"),
    (tampered(lambda d: d.update(allow_empty=True)), "bundle_invalid"),  # no empty-answer edge
    (tampered(lambda d: d.pop("tool_names")), "bundle_invalid"),
    (tampered(lambda d: d.update(max_tools=1)), "bundle_invalid"),  # SEP edges left behind
    (tampered(lambda d: flip_bit(d, "edge_bits", byte=8)), "bundle_invalid"),
    (tampered(lambda d: flip_bit(d, "edge_token", byte=4)), "bundle_invalid"),
    (tampered(lambda d: flip_bit(d, "edge_child", byte=4)), "bundle_invalid"),
    (tampered(lambda d: flip_bit(d, "edge_kind", byte=1)), "bundle_invalid"),
    (tampered(lambda d: flip_bit(d, "edge_tool", byte=0)), "bundle_invalid"),
    (tampered(lambda d: flip_bit(d, "tool_path_tokens", byte=0)), "bundle_invalid"),
    (tampered(lambda d: flip_bit(d, "node_edge_start", byte=4)), "bundle_invalid"),
])
def test_damaged_files_are_refused(data, code):
    with pytest.raises(Refusal) as info:
        Grammar.from_msgpack(data, source="bundle/grammar.msgpack")
    assert info.value.code == code
    assert "bundle/grammar.msgpack" in info.value.message


def test_bitsets_that_are_not_the_subtrees_tool_sets_are_refused():
    """grammar.msgpack's edge_bits checked in full (trie.py _check): a name edge's bits are the OR of its child's
    edges, a SEP/END edge holds exactly its tool, the empty END none, the root every tool; one bit off anywhere
    is refused."""
    import dataclasses

    g = path_grammar([(20,), (20, 21), (21, 22, 23), (22,)], allow_empty=True)
    kind, tool = g.edge_kind, g.edge_tool
    first = lambda k: int(np.flatnonzero(kind == k)[0])  # noqa: E731
    end, sep = first(EDGE_END), first(EDGE_SEP)
    other = np.uint64(1 << ((int(tool[end]) + 1) % g.num_tools))  # another tool's bit (all in word 0)
    own = np.uint64(1 << int(tool[end]))
    edits = {"a name edge gains a tool": (int(np.flatnonzero(kind == EDGE_NAME)[-1]), lambda w: w | other),
             "an END edge gains a tool": (end, lambda w: w | other),
             "an END edge loses its tool": (end, lambda w: w & ~own),
             "a SEP edge loses its tool": (sep, lambda w: np.uint64(0)),
             "the empty END holds a tool": (first(EDGE_EMPTY_END), lambda w: w | np.uint64(1)),
             "a root edge loses its tools": (first(EDGE_NAME), lambda w: np.uint64(0))}
    for what, (row, edit) in edits.items():
        bits = g.edge_bits.copy()
        bits[row, 0] = edit(bits[row, 0])
        assert (bits != g.edge_bits).any(), what
        with pytest.raises(Refusal) as info:
            dataclasses.replace(g, edge_bits=bits)
        assert info.value.code == "bundle_invalid" and "edge_bits" in info.value.message, what
    assert (dataclasses.replace(g, edge_bits=g.edge_bits.copy()).edge_bits == g.edge_bits).all()
