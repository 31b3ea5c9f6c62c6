"""The compiled grammar walks (runtime/grammar/walks.py), over one table of grammars (one and several
bitset words, the tool limit, empty answers, catalog subsets, wider columns than the widest node, rows
with their own rules: a request's at-most and at-least-one-tool):
``allowed_edges`` against its numpy reference (the same tokens, edges and allowed bits for every state
of random walks), and ``take_and_force`` against one-token steps of the stepper (the same tokens, tools
and states, cut at every room). The rule itself is checked against an oracle in
tests/test_grammar_stepper.py."""
from __future__ import annotations

import random

import numpy as np
import pytest
from test_grammar_stepper import ALPHABET, grammar_of

from toolcall.runtime.grammar.stepper import GrammarStepper
from toolcall.runtime.grammar.walks import allowed_edges_reference

# (case, tool count, max_tools, allow_empty, subset size (None: the whole catalog), extra columns, rules a row)
CASES = [
    ("few tools, one word", 5, 4, False, None, 0, False),
    ("empty answers allowed", 5, 2, True, None, 0, False),
    ("one tool at most", 12, 1, True, None, 3, False),
    ("a subset of the catalog", 40, 3, True, 7, 0, False),
    ("two bitset words", 100, 4, False, None, 0, False),
    ("two words, a subset across them", 100, 3, True, 5, 2, False),
    ("every tool may be named", 6, 6, False, None, 0, False),
    ("a subset below max_tools", 20, 6, False, 3, 0, False),  # the separator stops at the subset's last unused tool
    ("rows with their own rules", 30, 4, True, None, 0, True),  # each row: at most 1..4 tools, empty or not
    ("own rules over a subset", 30, 3, True, 4, 1, True),
]
IDS = [c[0] for c in CASES]


def paths(count: int, rng: random.Random) -> list[tuple[int, ...]]:
    out: set[tuple[int, ...]] = set()
    while len(out) < count:
        out.add(tuple(rng.choice(ALPHABET) for _ in range(rng.randint(1, 4))))
    return sorted(out)


def grammar_and_states(tools, max_tools, allow_empty, subset, row_rules, batch, rng):
    """(grammar, stepper, states [B], rules): ``rules`` each row's (max_tools int64[B], allow_empty bool[B]),
    the catalog's, or drawn per row (``row_rules``: at most 1..max_tools tools, the empty answer allowed
    where the catalog allows it, at random)."""
    g = grammar_of(paths(tools, rng), max_tools=max_tools, allow_empty=allow_empty)
    stepper = GrammarStepper(g)
    if subset is None:
        states = stepper.initial_states(batch)
    else:
        states = np.stack([stepper.initial_state(rng.sample(range(tools), subset)) for _ in range(batch)])
    if not row_rules:
        return g, stepper, states, stepper.rules(batch)
    return g, stepper, states, stepper.rules(batch, [rng.randint(1, max_tools) for _ in range(batch)],
                                             [allow_empty and rng.random() < 0.5 for _ in range(batch)])


def reference(stepper: GrammarStepper, states: np.ndarray, width: int, rules):
    g = stepper.grammar
    return allowed_edges_reference(states["node"], states["count"], states["used"], stepper._start, g.edge_token,
                                   g.edge_kind, g.edge_bits, rules[0], g.num_tools, rules[1], width)


@pytest.mark.parametrize("case, tools, max_tools, allow_empty, subset, extra, row_rules", CASES, ids=IDS)
def test_compiled_allowed_edges_equal_the_numpy_reference(case, tools, max_tools, allow_empty, subset, extra,
                                                          row_rules):
    rng, batch = random.Random(tools * 7 + max_tools), 16
    g, stepper, states, rules = grammar_and_states(tools, max_tools, allow_empty, subset, row_rules, batch, rng)
    assert g.bitset_words == (2 if tools > 64 else 1), case
    width = g.max_edges_per_node + extra
    checked = 0
    for _ in range(g.max_answer_tokens + 1):
        got = stepper.allowed_mask_batch(states, width, *rules)
        want = reference(stepper, states, width, rules)
        for name, a, b in zip(("tokens", "edges", "allowed"), got, want):
            assert a.dtype == b.dtype and a.shape == b.shape == (batch, width), (case, name)
            assert (a == b).all(), (case, name)
        for b in range(batch):  # one state alone: the same row
            alone = stepper.allowed_mask_batch(states[b:b + 1], width, rules[0][b:b + 1], rules[1][b:b + 1])
            assert all((x[0] == y[b]).all() for x, y in zip(alone, got)), case
        cand, edges, allowed = got
        checked += int(allowed.sum())
        live = allowed.any(axis=1)
        if not live.any():
            break
        pick = [rng.choice(np.flatnonzero(allowed[b]).tolist()) if live[b] else 0 for b in range(batch)]
        moved = stepper.take_edges(states, np.where(live, edges[np.arange(batch), pick], 0))
        states = np.where(live, moved, states)
    assert checked > batch, f"{case}: the walks allowed too little to test"


def one_token_steps(stepper: GrammarStepper, state: np.ndarray, edge: int, room: int, force: bool, rules):
    """take_and_force for one state, a token at a time with the stepper's own calls: the picked edge, then
    while not done and under ``room`` tokens, the one allowed token where exactly one is (under the row's
    ``rules``: (max_tools[1], allow_empty[1]))."""
    g = stepper.grammar
    tokens, tools = [int(g.edge_token[edge])], [int(g.edge_tool[edge])] if g.edge_tool[edge] >= 0 else []
    state = stepper.take_edges(state, np.array([edge]))
    while force and not stepper.done(state) and len(tokens) < room:
        cand, edges, allowed = stepper.allowed_mask_batch(state, None, *rules)
        if allowed[0].sum() != 1:
            break
        e = int(edges[0][allowed[0]][0])
        tokens.append(int(g.edge_token[e]))
        tools += [int(g.edge_tool[e])] if g.edge_tool[e] >= 0 else []
        state = stepper.take_edges(state, np.array([e]))
    return tokens, tools, state


@pytest.mark.parametrize("case, tools, max_tools, allow_empty, subset, extra, row_rules", CASES, ids=IDS)
def test_take_and_force_equals_one_token_steps(case, tools, max_tools, allow_empty, subset, extra, row_rules):
    rng, batch = random.Random(tools * 11 + max_tools), 12
    g, stepper, states, rules = grammar_and_states(tools, max_tools, allow_empty, subset, row_rules, batch, rng)
    forced_runs = 0
    for _ in range(g.max_answer_tokens + 1):
        cand, edges, allowed = stepper.allowed_mask_batch(states, None, *rules)
        live = np.flatnonzero(allowed.any(axis=1))
        if not len(live):
            break
        states, rules = states[live], (rules[0][live], rules[1][live])
        picks = np.array([rng.choice(np.flatnonzero(allowed[b]).tolist()) for b in live])
        taken = edges[live, picks]
        room = np.array([rng.choice([1, 2, 3, g.max_answer_tokens]) for _ in live])
        force = np.array([rng.random() < 0.8 for _ in live])
        new, tokens, n_tokens, closed, n_closed = stepper.take_and_force(states, taken, room, force, *rules)
        for b in range(len(live)):
            want_tokens, want_tools, want_state = one_token_steps(stepper, states[b:b + 1], int(taken[b]),
                                                                   int(room[b]), bool(force[b]),
                                                                   (rules[0][b:b + 1], rules[1][b:b + 1]))
            assert tokens[b, :n_tokens[b]].tolist() == want_tokens, case
            assert closed[b, :n_closed[b]].tolist() == want_tools, case
            assert new[b:b + 1].tobytes() == want_state.tobytes(), case
            forced_runs += len(want_tokens) > 1
        going = ~stepper.done_batch(new)
        states, rules = new[going], (rules[0][going], rules[1][going])
        if not len(states):
            break
    assert forced_runs > 0, f"{case}: no forced run was tested"
