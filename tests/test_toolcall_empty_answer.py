"""The empty answer (END first) end to end on the CPU, for a catalog with ``allow_empty``:
trie, stepper, decode_tools and the kernels' numpy reference of the grammar path."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from toolcall.builder.catalog import load_catalog
from toolcall.builder.trie import build_grammar
from toolcall.common.errors import RequestError
from toolcall.runtime.grammar.stepper import GrammarStepper, decode_tools
from toolcall.runtime.grammar.trie import EDGE_EMPTY_END, ROOT

CATALOG = "builder/data/tools-64.json"


@pytest.fixture(scope="module")
def grammars():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file("models/toolcall-qwen3-tiny/tokenizer.json")
    catalog = load_catalog(CATALOG)
    assert catalog.answer.allow_empty  # the shipped example catalog allows the empty answer
    off = dataclasses.replace(catalog, answer=dataclasses.replace(catalog.answer, allow_empty=False))
    return build_grammar(catalog, tokenizer, 2), build_grammar(off, tokenizer, 2)


def test_the_root_has_one_empty_end_edge_to_the_terminal(grammars):
    g, off = grammars
    lo, hi = g.node_edge_start[ROOT], g.node_edge_start[ROOT + 1]
    kinds = g.edge_kind[lo:hi]
    assert (kinds == EDGE_EMPTY_END).sum() == 1 and (g.edge_kind == EDGE_EMPTY_END).sum() == 1
    e = lo + int(np.flatnonzero(kinds == EDGE_EMPTY_END)[0])
    assert g.edge_token[e] == g.end_token_id and g.edge_child[e] == g.terminal and g.edge_tool[e] == -1
    assert not g.edge_bits[e].any()
    assert (off.edge_kind == EDGE_EMPTY_END).sum() == 0 and off.num_edges == g.num_edges - 1


def test_stepper_allows_end_first_only_and_decodes_it_as_no_tool(grammars):
    g, off = grammars
    stepper = GrammarStepper(g)
    tokens, _ = stepper.allowed(stepper.initial_state())
    assert g.end_token_id in tokens
    state = stepper.advance(stepper.initial_state(), g.end_token_id)
    assert stepper.done(state) and int(state["count"]) == 0
    assert decode_tools(g, [g.end_token_id]) == []
    path = list(g.tool_path_tokens[g.tool_path_start[0]:g.tool_path_start[1]])
    after = stepper.initial_state()
    for t in path + [g.sep_token_id]:
        after = stepper.advance(after, int(t))
    assert g.end_token_id not in stepper.allowed(after)[0]  # after a SEP, END is no longer an answer
    with pytest.raises(RequestError, match="not allowed"):
        decode_tools(off, [off.end_token_id])
    assert g.end_token_id not in GrammarStepper(off).allowed(GrammarStepper(off).initial_state())[0]


def test_kernel_reference_grammar_path_takes_end_at_the_root(grammars):
    from toolcall.kernels import reference

    g, off = grammars
    words = g.bitset_words
    state = np.zeros((2, 1 + words), np.uint64)  # word 0: node | count << 32; then the used bitset
    state[1, 0] = np.uint64(ROOT | (1 << 32))  # count 1 at the root (after a SEP)
    state[1, 1] = np.uint64(1)
    status = np.zeros(2, np.int32)
    m = g.max_edges_per_node
    for grammar, root_ok in ((g, True), (off, False)):
        cand, valid = reference.grammar_candidates(np.array([0, 1]), state, status, grammar, m,
                                                   np.full(2, grammar.max_tools, np.int32),
                                                   np.full(2, grammar.allow_empty, np.uint8))
        end_slot = np.flatnonzero(cand[0] == grammar.end_token_id)
        assert len(end_slot) == int(root_ok)
        if root_ok:
            assert valid[0, end_slot[0]] == 1 and valid[1, end_slot[0]] == 0
