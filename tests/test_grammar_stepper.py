"""Grammar stepper against an oracle that knows only the tools' token paths and the answer
format: admitted answers, reachability, END, batch/scalar agreement, violations."""
from __future__ import annotations

import itertools
import random
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolcall.builder.catalog import load_catalog
from toolcall.builder.synth_tokenizer import END_OF_TURN, train_tokenizer
from toolcall.builder.trie import build_grammar
from toolcall.common.errors import RequestError
from toolcall.runtime.grammar.stepper import GrammarStepper, decode_tools, state_dtype
from toolcall.runtime.grammar.trie import Grammar


@lru_cache(maxsize=1)
def tokenizer():
    return train_tokenizer(seed=0, vocab_size=2048)


END = tokenizer().token_to_id(END_OF_TURN)
SEP = tokenizer().encode("\n", add_special_tokens=False).ids[0]
ALPHABET = [t for t in range(20, 25) if t not in (SEP, END)]


def grammar_of(paths=None, names=None, max_tools=4, allow_empty=False) -> Grammar:
    tools = ([{"name": n} for n in names] if names is not None else
             [{"name": f"t{i}", "token_ids": list(p)} for i, p in enumerate(paths)])
    doc = {"tools": tools, "answer": {"max_tools": max_tools, "allow_empty": allow_empty}}
    return build_grammar(load_catalog(doc), tokenizer(), END)


def paths_of(g: Grammar) -> list[tuple[int, ...]]:
    return [g.tool_path(t) for t in range(g.num_tools)]


def oracle_allowed(g: Grammar, prefix: list[int]) -> set[int]:
    """Tokens that may follow ``prefix``, from the paths and answer format alone."""
    if prefix and prefix[-1] == END:
        return set()
    *closed, partial = [tuple(s) for s in _split(prefix)]
    paths = paths_of(g)
    unused = [t for t, p in enumerate(paths) if p not in closed]
    allowed = {paths[t][len(partial)] for t in unused
               if len(paths[t]) > len(partial) and paths[t][:len(partial)] == partial}
    if any(paths[t] == partial for t in unused):
        allowed.add(END)
        if len(closed) + 1 < min(g.max_tools, g.num_tools):
            allowed.add(SEP)
    if not partial and not closed and g.allow_empty:
        allowed.add(END)
    return allowed


def _split(tokens):
    segment = []
    for token in tokens:
        if token == SEP:
            yield segment
            segment = []
        else:
            segment.append(token)
    yield segment


def all_answers(g: Grammar) -> set[tuple[int, ...]]:
    """Every answer the format admits: ordered subsets of 1..max_tools tools, + empty."""
    paths, answers = paths_of(g), set()
    for k in range(1, min(g.max_tools, g.num_tools) + 1):
        for tools in itertools.permutations(range(g.num_tools), k):
            answers.add(tuple(itertools.chain(*[paths[t] + (SEP,) for t in tools]))[:-1] + (END,))
    if g.allow_empty:
        answers.add((END,))
    return answers


def admitted_answers(stepper: GrammarStepper, state, prefix=()) -> set[tuple[int, ...]]:
    if stepper.done(state):
        return {prefix}
    tokens, _ = stepper.allowed(state)
    assert len(tokens) > 0, f"dead end after {prefix}"
    out = set()
    for token in tokens.tolist():
        out |= admitted_answers(stepper, stepper.advance(state, token), prefix + (token,))
    return out


small_paths = st.lists(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=3).map(tuple),
                       min_size=1, max_size=4, unique=True)
token_paths = st.lists(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=5).map(tuple),
                       min_size=1, max_size=150, unique=True)
name_parts = ["get", "get_", "weather", "we", "search", "_", "flights", "s", "a", "ab"]
tool_names = st.lists(st.lists(st.sampled_from(name_parts), min_size=1, max_size=4).map("".join),
                      min_size=1, max_size=40, unique=True)
answers = st.fixed_dictionaries({"max_tools": st.integers(1, 4), "allow_empty": st.booleans()})


@settings(derandomize=True, max_examples=40, deadline=None)
@given(paths=small_paths, answer=answers)
def test_admitted_answers_are_exactly_the_ordered_subsets(paths, answer):
    g = grammar_of(paths, **answer)
    stepper = GrammarStepper(g)
    assert admitted_answers(stepper, stepper.initial_state()) == all_answers(g)


def random_walk(g: Grammar, rng: random.Random):
    """Walk the stepper choosing uniformly among allowed tokens; check each step."""
    stepper, prefix = GrammarStepper(g), []
    state = stepper.initial_state()
    while not stepper.done(state):
        tokens, edges = stepper.allowed(state)
        assert set(tokens.tolist()) == oracle_allowed(g, prefix), prefix
        assert len(tokens) <= g.max_edges_per_node and list(tokens) == sorted(tokens)
        assert list(g.edge_token[edges]) == list(tokens)
        token = rng.choice(tokens.tolist())
        state = stepper.advance(state, token)
        prefix.append(token)
        assert len(prefix) <= g.max_answer_tokens
    assert oracle_allowed(g, prefix) == set() and len(stepper.allowed(state)[0]) == 0
    names = decode_tools(g, prefix)
    assert len(names) == len(set(names)) == int(state["count"]) <= g.max_tools
    assert set(names) <= set(g.tool_names) and (names or g.allow_empty)
    ids = [g.tool_names.index(n) for n in names]
    assert sorted(ids) == [i for i in range(g.num_tools) if state["used"][i // 64] >> np.uint64(i % 64) & np.uint64(1)]
    return prefix, state


@settings(derandomize=True, max_examples=40, deadline=None)
@given(paths=token_paths, answer=answers, seed=st.integers(0, 2**16))
def test_random_walks_follow_the_oracle(paths, answer, seed):
    g = grammar_of(paths, **answer)
    rng = random.Random(seed)
    for _ in range(3):
        random_walk(g, rng)


@settings(derandomize=True, max_examples=25, deadline=None)
@given(names=tool_names, answer=answers, seed=st.integers(0, 2**16))
def test_random_walks_over_tokenized_names(names, answer, seed):
    g = grammar_of(names=names, **answer)
    rng = random.Random(seed)
    for _ in range(3):
        random_walk(g, rng)


@settings(derandomize=True, max_examples=40, deadline=None)
@given(data=st.data(), paths=token_paths, answer=answers)
def test_every_ordered_subset_is_reachable(data, paths, answer):
    g = grammar_of(paths, **answer)
    k = data.draw(st.integers(1, min(g.max_tools, g.num_tools)))
    tools = data.draw(st.permutations(range(g.num_tools)))[:k]
    tokens = list(itertools.chain(*[g.tool_path(t) + (SEP,) for t in tools]))[:-1] + [END]
    stepper = GrammarStepper(g)
    state = stepper.initial_state()
    for token in tokens:
        state = stepper.advance(state, token)
    assert stepper.done(state) and int(state["count"]) == k
    assert decode_tools(g, tokens) == [g.tool_names[t] for t in tools]


def test_large_catalog_walks_and_reaches_last_tools():
    paths = list(itertools.islice(itertools.product(range(20, 36), repeat=3), 4096))
    g = grammar_of(paths, max_tools=3)
    assert g.bitset_words == 64 and state_dtype(64).itemsize == 8 + 8 * 64
    rng = random.Random(0)
    for _ in range(5):
        random_walk(g, rng)
    last = [4095, 4094, 63]
    tokens = list(itertools.chain(*[g.tool_path(t) + (SEP,) for t in last]))[:-1] + [END]
    assert decode_tools(g, tokens) == [f"t{t}" for t in last]


@settings(derandomize=True, max_examples=25, deadline=None)
@given(paths=token_paths, answer=answers, seed=st.integers(0, 2**16))
def test_batch_equals_rows_one_by_one(paths, answer, seed):
    g = grammar_of(paths, **answer)
    stepper, rng = GrammarStepper(g), random.Random(seed)
    states = stepper.initial_states(6)
    for _ in range(g.max_answer_tokens + 1):
        cand, edges, allowed = stepper.allowed_mask_batch(states)
        assert cand.shape == edges.shape == allowed.shape == (6, g.max_edges_per_node)
        # Each row picks an allowed token, or (sometimes) a token it may not take.
        tokens = np.array([rng.choice(cand[b][allowed[b]].tolist()) if allowed[b].any() and rng.random() < 0.9
                           else rng.choice([END, SEP, 999]) for b in range(6)])
        new, taken = stepper.step_batch(states, tokens)
        for b in range(6):
            row_cand, row_edges, row_allowed = stepper.allowed_mask_batch(states[b:b + 1])
            assert (row_cand[0] == cand[b]).all() and (row_allowed[0] == allowed[b]).all()
            assert (row_edges[0] == edges[b]).all()
            if tokens[b] in cand[b][allowed[b]]:
                assert taken[b] >= 0 and new[b] == stepper.advance(states[b], int(tokens[b]))
            else:
                assert taken[b] == -1 and new[b] == states[b]
                with pytest.raises(RequestError):
                    stepper.advance(states[b], int(tokens[b]))
        states = new
    assert (stepper.done_batch(states) == (states["node"] == g.terminal)).all()
    assert (states["count"] <= min(g.max_tools, g.num_tools)).all()


def test_state_is_16_bytes_for_64_tools():
    g = grammar_of([(20 + i // 5, 20 + i % 5) for i in range(25)])
    assert GrammarStepper(g).initial_states(3).itemsize == 16 == state_dtype(1).itemsize


def test_violations_are_typed():
    g = grammar_of(names=["get", "get_weather", "search_flights"], max_tools=2)
    get, weather = g.tool_path(0), g.tool_path(1)
    for tokens, why in [([END], "empty answer"), (list(get) + [SEP] + list(get) + [END], "tool twice"),
                        (list(get) + [SEP] + list(weather) + [SEP], "third tool over max_tools 2"),
                        (list(get) + [END, END], "token after END"), ([999], "unknown token")]:
        with pytest.raises(RequestError) as info:
            decode_tools(g, tokens)
        assert info.value.code == "grammar_violation", why
        assert info.value.details["position"] == len(tokens) - 1, why
    with pytest.raises(RequestError) as info:
        decode_tools(g, list(get) + [SEP])
    assert "before END" in info.value.message
    assert decode_tools(g, list(get) + [SEP], require_done=False) == ["get"]
    assert decode_tools(g, list(weather) + [SEP] + list(get) + [END]) == ["get_weather", "get"]
    stepper = GrammarStepper(g)
    with pytest.raises(RequestError) as info:
        stepper.advance_batch(stepper.initial_states(3), np.array([get[0], END, get[0]]))
    assert info.value.details["row"] == 1 and info.value.details["node"] == 0


def test_single_tool_catalog_has_no_separator():
    g = grammar_of(names=["get_weather"], max_tools=4)
    assert all_answers(g) == {g.tool_path(0) + (END,)}
    assert SEP not in g.edge_token


@settings(derandomize=True, max_examples=25, deadline=None)
@given(paths=token_paths, answer=answers, seed=st.integers(0, 2**16))
def test_name_chains_are_the_tokens_the_stepper_forces(paths, answer, seed):
    """Wherever a random walk stands on a node with a name chain, stepping one token at a time allows
    exactly the chain's tokens, one each, and ends on its last node (the generator appends it whole)."""
    g = grammar_of(paths, **answer)
    stepper, rng = GrammarStepper(g), random.Random(seed)
    assert all(len(chain) >= 1 for chain in stepper.name_chains.values())
    state = stepper.initial_states(1)
    for _ in range(g.max_answer_tokens):
        chain = stepper.name_chains.get(int(state["node"][0]), [])
        walk = state
        for token, child in chain:
            cand, _, allowed = stepper.allowed_mask_batch(walk)
            assert cand[0][allowed[0]].tolist() == [token]
            walk = stepper.advance_batch(walk, np.array([token]))
            assert int(walk["node"][0]) == child and walk["used"].tobytes() == state["used"].tobytes()
        cand, _, allowed = stepper.allowed_mask_batch(state)
        if not allowed[0].any():
            break
        state = stepper.advance_batch(state, np.array([rng.choice(cand[0][allowed[0]].tolist())]))


def test_name_chains_of_a_small_trie():
    """t0 = a b c, t1 = a d, no empty answer: the root's only edge is a (a chain of one token), after a the
    trie branches, after a b only c can follow; after a b c and a d come SEP/END, not name edges."""
    a, b, c, d = ALPHABET[:4]
    g = grammar_of([(a, b, c), (a, d)])
    stepper = GrammarStepper(g)
    after_a = stepper.advance_batch(stepper.initial_states(1), np.array([a]))
    state = stepper.advance_batch(after_a, np.array([b]))
    node_ab = int(state["node"][0])
    node_abc = int(stepper.advance_batch(state, np.array([c]))["node"][0])
    assert stepper.name_chains == {0: [(a, int(after_a["node"][0]))], node_ab: [(c, node_abc)]}
    assert GrammarStepper(grammar_of([(a, b, c), (a, d)], allow_empty=True)).name_chains == {node_ab: [(c, node_abc)]}
