"""Grammar stepper: which tokens each sequence may emit next, and the state after one.

Per-sequence state is fixed-size, a numpy structured record (``state_dtype``):
``node`` int32 (trie node), ``count`` int32 (tools closed so far), ``used`` uint64[W]
(bit t of word t//64 = tool t already named); 8 + 8*W bytes, 16 for up to 64 tools.

An edge out of the current node is allowed iff
- kind 0/1/2: its bitset holds a tool not yet used (``edge_bits & ~used != 0``), and for
  kind 1 (SEP) also ``count + 1 < max_tools`` and ``popcount(used) + 1 < num_tools``: after
  closing this tool another tool must still fit and be unused, so a separator never leads
  to a dead end;
- kind 3 (END of an empty answer): ``count == 0`` and ``allow_empty``.
``max_tools`` and ``allow_empty`` are the catalog's (the grammar file's), or per row a request's
narrower ones (``rules``: at most one tool, at least one tool).
Taking a kind 1/2 edge sets the closed tool's bit and adds 1 to ``count``. A fresh state has
``used`` empty (any tool may be named); a state restricted to a subset of the catalog starts
with every other tool's bit set, so ``used`` holds ``count`` bits plus those.

The batch calls are vectorized over B states (the allowed set, and a pick with the tokens forced
after it, are one compiled call each: runtime/grammar/walks.py); the scalar calls wrap them.
"""
from __future__ import annotations

import numpy as np

from toolcall.common.errors import RequestError
from toolcall.runtime.grammar.trie import EDGE_END, EDGE_NAME, EDGE_SEP, ROOT, Grammar
from toolcall.runtime.grammar.walks import allowed_edges, take_and_force


def state_dtype(bitset_words: int) -> np.dtype:
    """Structured dtype of one sequence's grammar state (8 + 8*bitset_words bytes)."""
    return np.dtype([("node", "<i4"), ("count", "<i4"), ("used", "<u8", (bitset_words,))])


class GrammarStepper:
    """Allowed-token queries and transitions for batches of grammar states."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self.dtype = state_dtype(grammar.bitset_words)
        self.max_edges = grammar.max_edges_per_node
        self._start = grammar.node_edge_start.astype(np.int64)
        self._max_tools, self._num_tools = grammar.max_tools, grammar.num_tools
        self.name_chains = self._name_chains()
        # the chains as arrays for take_and_force: node n's chain is chain_token/chain_node[start[n]:start[n + 1]]
        lengths = np.zeros(grammar.num_nodes + 1, np.int64)
        for node, chain in self.name_chains.items():
            lengths[node + 1] = len(chain)
        self._chain_start = np.cumsum(lengths)
        flat = [step for node in sorted(self.name_chains) for step in self.name_chains[node]]
        self._chain_token = np.array([t for t, _ in flat], np.int32)
        self._chain_node = np.array([n for _, n in flat], np.int32)

    def _name_chains(self) -> dict[int, list[tuple[int, int]]]:
        """node -> [(token, child), ...]: the name tokens the trie alone forces from the node (each node on
        the way has one edge, a name edge). Such an edge is always allowed: its bitset is the node's
        subtree's, which holds an unused tool, or the edge into the node would not have been taken."""
        g, start = self.grammar, self._start
        chains: dict[int, list[tuple[int, int]]] = {}
        for node in range(g.num_nodes):
            chain, n = [], node
            while start[n + 1] - start[n] == 1 and g.edge_kind[start[n]] == EDGE_NAME:
                e = int(start[n])
                n = int(g.edge_child[e])
                chain.append((int(g.edge_token[e]), n))
            if chain:
                chains[node] = chain
        return chains

    # ---- batch API ----
    def initial_states(self, batch: int) -> np.ndarray:
        """``batch`` fresh states at the root: structured array [batch]."""
        states = np.zeros(batch, self.dtype)
        states["node"] = ROOT
        return states

    def rules(self, batch: int, max_tools=None, allow_empty=None) -> tuple[np.ndarray, np.ndarray]:
        """Per-row answer rules for ``batch`` rows: ``max_tools`` int64[B] and ``allow_empty`` bool[B], each the
        given values (one a row) or the catalog's."""
        tools = np.full(batch, self._max_tools, np.int64) if max_tools is None else np.asarray(max_tools, np.int64)
        empty = (np.full(batch, bool(self.grammar.allow_empty)) if allow_empty is None
                 else np.asarray(allow_empty, np.bool_))
        assert tools.shape == empty.shape == (batch,), (tools.shape, empty.shape, batch)
        return tools, empty

    def allowed_mask_batch(self, states: np.ndarray, max_edges: int | None = None, max_tools=None,
                           allow_empty=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidates of every state, in edge order, padded to M = ``max_edges`` columns
        (default and minimum: the grammar's ``max_edges_per_node``); ``max_tools``/``allow_empty``: each row's
        rules (``rules``; default the catalog's).

        Returns ``tokens`` int32[B, M] (-1 past the node's edges), ``edges`` int32[B, M]
        (global edge index, -1 past the node's edges) and ``allowed`` bool[B, M].
        """
        g = self.grammar
        width = self.max_edges if max_edges is None else max_edges
        assert width >= self.max_edges, f"{width} columns cannot hold {self.max_edges} edges"
        batch = len(states)
        tokens, edges = np.empty((batch, width), np.int32), np.empty((batch, width), np.int32)
        allowed = np.empty((batch, width), np.bool_)
        # the fields made C-contiguous (copied unless they already are): one compiled signature whatever the
        # batch (a field of a one-state batch is typed C-contiguous, of a larger one strided)
        node, count, used = (np.ascontiguousarray(states[f]) for f in ("node", "count", "used"))
        tools, empty = self.rules(batch, max_tools, allow_empty)
        allowed_edges(node, count, used, self._start, g.edge_token, g.edge_kind, g.edge_bits, tools,
                      self._num_tools, empty, tokens, edges, allowed)
        return tokens, edges, allowed

    def take_and_force(self, states: np.ndarray, taken: np.ndarray, room: np.ndarray, force: np.ndarray,
                       max_tools=None, allow_empty=None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each row takes its edge ``taken`` int[B] (allowed: not rechecked) and, where ``force`` bool[B],
        the tokens the grammar forces after it (name chains, single allowed edges) until it is done, has
        appended ``room`` int[B] tokens (the taken one included; at least it), or has a choice, under each
        row's rules (``max_tools``/``allow_empty``, as ``allowed_mask_batch``). Returns the new states [B],
        the tokens appended int32[B, L] (row b's first ``n_tokens[b]``), ``n_tokens`` int64[B], the tools
        closed int32[B, K] (row b's first ``n_closed[b]``) and ``n_closed`` int64[B]."""
        g = self.grammar
        batch = len(states)
        room = np.asarray(room, np.int64)
        tokens = np.empty((batch, max(1, int(room.max()) if batch else 1)), np.int32)  # room < 1: the edge alone
        closed = np.empty((batch, self._max_tools + 1), np.int32)
        n_tokens, n_closed = np.empty(batch, np.int64), np.empty(batch, np.int64)
        node, count, used = (np.array(states[f]) for f in ("node", "count", "used"))  # copies: written in place
        tools, empty = self.rules(batch, max_tools, allow_empty)
        take_and_force(node, count, used, np.asarray(taken, np.int64), room, np.asarray(force, np.bool_), self._start,
                       g.edge_token, g.edge_child, g.edge_kind, g.edge_tool, g.edge_bits, self._chain_start,
                       self._chain_token, self._chain_node, tools, self._num_tools, empty,
                       int(g.terminal), tokens, n_tokens, closed, n_closed)
        new = states.copy()
        new["node"], new["count"], new["used"] = node, count, used
        return new, tokens, n_tokens, closed, n_closed

    def step_batch(self, states: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Advance each state by its token where allowed; never raises.

        Returns the new states [B] (a rejected row keeps its state) and the edge taken per row,
        int32[B] (-1 where the token was not allowed).
        """
        tokens = np.asarray(tokens, np.int64).reshape(len(states))
        cand, edges, allowed = self.allowed_mask_batch(states)
        hit = allowed & (cand == tokens[:, None])  # at most one per row: tokens unique per node
        ok = hit.any(axis=1)
        taken = np.where(ok, edges[np.arange(len(states)), hit.argmax(axis=1)], -1).astype(np.int32)
        new = states.copy()
        new[ok] = self.take_edges(states[ok], taken[ok])
        return new, taken

    def take_edges(self, states: np.ndarray, edges: np.ndarray) -> np.ndarray:
        """New states after each row takes its edge ``edges`` int[B] (global ids from
        ``allowed_mask_batch``, each allowed for its row: not rechecked)."""
        g = self.grammar
        edges = np.asarray(edges, np.int64)
        new = states.copy()
        new["node"] = g.edge_child[edges]
        rows = np.flatnonzero((g.edge_kind[edges] == EDGE_SEP) | (g.edge_kind[edges] == EDGE_END))
        new["used"][rows] |= g.edge_bits[edges[rows]]
        new["count"][rows] += 1
        return new

    def advance_batch(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """New states after one token each; ``RequestError("grammar_violation")`` if any is
        not allowed (naming the first such row)."""
        new, taken = self.step_batch(states, tokens)
        bad = np.flatnonzero(taken < 0)
        if len(bad):
            row = int(bad[0])
            raise self._violation(states[row], int(np.asarray(tokens).reshape(-1)[row]), row=row)
        return new

    def done_batch(self, states: np.ndarray) -> np.ndarray:
        """bool[B]: the answer is complete (state at the terminal node)."""
        return states["node"] == self.grammar.terminal

    # ---- scalar API (one state: a 0-d structured array) ----
    def initial_state(self, tools=None) -> np.ndarray:
        """A fresh state; ``tools`` (catalog indices, see ``check_subset``) restricts the answer
        to those tools by starting with every other tool marked used."""
        state = self.initial_states(1)
        if tools is not None:
            keep = np.zeros(self.grammar.bitset_words * 64, bool)
            keep[list(tools)] = True
            keep[self._num_tools:] = True  # bits past the catalog stay clear
            state["used"][0] = np.packbits(~keep, bitorder="little").view("<u8")
        return state.reshape(())

    def check_subset(self, tools) -> None:
        """RequestError("request_invalid") unless ``tools`` is a non-empty set of catalog indices."""
        tools = list(tools)
        bad = [t for t in tools if not (isinstance(t, (int, np.integer)) and 0 <= t < self._num_tools)]
        if not tools or bad or len(set(tools)) != len(tools):
            raise RequestError("request_invalid", f"a tools subset needs distinct catalog indices in "
                               f"[0, {self._num_tools}), at least one; got {tools[:8]}",
                               tools=[int(t) if isinstance(t, (int, np.integer)) else str(t) for t in tools[:8]],
                               num_tools=self._num_tools)

    def allowed(self, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Allowed tokens int32[k] and their edge indices int32[k], in edge (token) order."""
        tokens, edges, allowed = self.allowed_mask_batch(np.reshape(state, 1))
        return tokens[0][allowed[0]], edges[0][allowed[0]]

    def advance(self, state: np.ndarray, token: int) -> np.ndarray:
        """The state after ``token``; ``RequestError("grammar_violation")`` if not allowed."""
        new, taken = self.step_batch(np.reshape(state, 1), np.asarray([token]))
        if taken[0] < 0:
            raise self._violation(state, int(token))
        return new.reshape(())

    def done(self, state: np.ndarray) -> bool:
        return bool(np.reshape(state, 1)["node"][0] == self.grammar.terminal)

    def _violation(self, state, token: int, **where) -> RequestError:
        state = np.reshape(state, 1)
        allowed_tokens, _ = self.allowed(state)
        node, count = int(state["node"][0]), int(state["count"][0])
        shown = [int(t) for t in allowed_tokens[:16]]
        what = ("the answer is already complete" if node == self.grammar.terminal
                else f"allowed here: {shown}{' ...' if len(allowed_tokens) > 16 else ''}")
        return RequestError("grammar_violation",
                            f"token {token} is not allowed at grammar node {node} after {count} "
                            f"tool(s); {what}; pick the next token from the allowed set",
                            token=token, node=node, count=count, allowed=shown, **where)


def decode_tools(grammar: Grammar, token_ids, *, require_done: bool = True) -> list[str]:
    """Tool names an answer's tokens name, in order; ``RequestError("grammar_violation")``
    for a token the grammar does not allow, or (``require_done``) an answer without END."""
    stepper = GrammarStepper(grammar)
    state = stepper.initial_states(1)
    names: list[str] = []
    for position, token in enumerate(token_ids):
        new, taken = stepper.step_batch(state, np.asarray([token]))
        if taken[0] < 0:
            raise stepper._violation(state, int(token), position=position)
        if grammar.edge_tool[taken[0]] >= 0:
            names.append(grammar.tool_names[grammar.edge_tool[taken[0]]])
        state = new
    if require_done and not stepper.done(state):
        raise RequestError("grammar_violation",
                           f"answer of {len(token_ids)} tokens stops before END (grammar node "
                           f"{int(state['node'][0])}); expected a complete answer ending in token "
                           f"{grammar.end_token_id}", tokens=len(token_ids),
                           node=int(state["node"][0]))
    return names
