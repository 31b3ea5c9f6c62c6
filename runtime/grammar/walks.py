"""The grammar walks the engine runs for every picking row, compiled: which edges each state allows
(``allowed_edges``), and a picked edge taken with the tokens forced after it (``take_and_force``).

Both run on the engine thread, in a server whose event loop holds the same GIL: in numpy and Python
they were ~20 small array calls a mask (~50 us for 64 states) and a Python round per forced token
and sequence, each call a point where the loop may take the GIL for up to the switch interval; here
each is one ``nogil`` call. Integer logic only: the answers are those of the numpy reference
(``allowed_edges_reference``) and of GrammarStepper's one-token steps (tests/test_grammar_kernels.py).

Layouts: states' ``node`` int32[B], ``count`` int32[B], ``used`` uint64[B, W] (C-contiguous copies of
the state fields); the grammar's ``node_edge_start`` int64[N+1] (widened from the file's uint32),
``edge_token``/``edge_child``/``edge_tool`` int32[E], ``edge_kind`` uint8[E], ``edge_bits``
uint64[E, W]; each row's own answer rules ``max_tools`` int64[B] and ``allow_empty`` bool[B] (the
catalog's, or a request's narrower ones); name chains (GrammarStepper.name_chains) as ``chain_start`` int64[N+1] into
``chain_token``/``chain_node`` int32[C]. Mask out: ``tokens``/``edges`` int32[B, M] (-1 past the
node's edges), ``allowed`` bool[B, M], M >= the widest node's degree.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from toolcall.common import numba_target  # noqa: F401  (the one compile target: common/numba_target.py)
from toolcall.runtime.grammar.trie import EDGE_EMPTY_END, EDGE_END, EDGE_SEP


@njit(nogil=True, cache=True)
def _popcount(x):
    count = 0
    while x:
        x &= x - np.uint64(1)
        count += 1
    return count


@njit(nogil=True, cache=True, inline="always")
def _edge_allowed(e, b, count, used, edge_kind, edge_bits, sep_ok, allow_empty):
    """The rule of GrammarStepper's docstring for edge e out of state b's node."""
    kind = edge_kind[e]
    if kind == EDGE_EMPTY_END:
        return count[b] == 0 and allow_empty[b]
    for w in range(used.shape[1]):
        if edge_bits[e, w] & ~used[b, w]:
            return kind != EDGE_SEP or sep_ok
    return False


@njit(nogil=True, cache=True, inline="always")
def _sep_ok(b, count, used, max_tools, num_tools):
    """After closing a tool here, another must still fit and be unused."""
    used_bits = 0
    for w in range(used.shape[1]):
        used_bits += _popcount(used[b, w])
    return count[b] + 1 < max_tools[b] and used_bits + 1 < num_tools


@njit(nogil=True, cache=True)
def allowed_edges(node, count, used, start, edge_token, edge_kind, edge_bits, max_tools, num_tools, allow_empty,
                  tokens, edges, allowed):
    """Fills tokens, edges, allowed (B, M) for B states (layouts: the module docstring)."""
    batch, width = tokens.shape
    for b in range(batch):
        first = start[node[b]]
        degree = start[node[b] + 1] - first
        sep_ok = _sep_ok(b, count, used, max_tools, num_tools)
        for m in range(width):
            if m >= degree:
                tokens[b, m], edges[b, m], allowed[b, m] = -1, -1, False
            else:
                e = first + m
                tokens[b, m], edges[b, m] = edge_token[e], e
                allowed[b, m] = _edge_allowed(e, b, count, used, edge_kind, edge_bits, sep_ok, allow_empty)


@njit(nogil=True, cache=True, inline="always")
def _take(b, e, node, count, used, edge_token, edge_child, edge_kind, edge_tool, edge_bits, tokens, n, closed, c):
    """State b takes edge e, its token appended at tokens[b, n]; returns (n, c) after."""
    tokens[b, n] = edge_token[e]
    node[b] = edge_child[e]
    kind = edge_kind[e]
    if kind == EDGE_SEP or kind == EDGE_END:
        for w in range(used.shape[1]):
            used[b, w] |= edge_bits[e, w]
        count[b] += 1
    if edge_tool[e] >= 0:
        closed[b, c] = edge_tool[e]
        c += 1
    return n + 1, c


@njit(nogil=True, cache=True)
def take_and_force(node, count, used, taken, room, force, start, edge_token, edge_child, edge_kind, edge_tool,
                   edge_bits, chain_start, chain_token, chain_node, max_tools, num_tools, allow_empty, terminal,
                   tokens, n_tokens, closed, n_closed):
    """Each state b takes its picked edge ``taken[b]`` (allowed: not rechecked) and then, where ``force[b]``,
    the tokens forced after it, while it is not at ``terminal`` and has fewer than ``room[b]`` tokens: its
    node's name chain (cut to the room), then the one allowed edge where exactly one is, again. node,
    count, used are updated in place; the tokens appended go to tokens[b, :n_tokens[b]] (B, >= max room)
    and the tools closed to closed[b, :n_closed[b]] (B, >= max_tools + 1)."""
    for b in range(len(node)):
        n, c = _take(b, taken[b], node, count, used, edge_token, edge_child, edge_kind, edge_tool, edge_bits,
                     tokens, 0, closed, 0)
        while force[b] and node[b] != terminal and n < room[b]:
            first, last = chain_start[node[b]], chain_start[node[b] + 1]
            if last > first:  # the trie alone forces these name tokens (never the end of an answer)
                k = min(last - first, room[b] - n)
                for i in range(k):
                    tokens[b, n + i] = chain_token[first + i]
                n += k
                node[b] = chain_node[first + k - 1]
                if n >= room[b]:
                    break
            first, last = start[node[b]], start[node[b] + 1]
            sep_ok = _sep_ok(b, count, used, max_tools, num_tools)
            single, options = -1, 0
            for e in range(first, last):
                if _edge_allowed(e, b, count, used, edge_kind, edge_bits, sep_ok, allow_empty):
                    single, options = e, options + 1
            if options != 1:
                break
            n, c = _take(b, single, node, count, used, edge_token, edge_child, edge_kind, edge_tool, edge_bits,
                         tokens, n, closed, c)
        n_tokens[b], n_closed[b] = n, c


def allowed_edges_reference(node, count, used, start, edge_token, edge_kind, edge_bits, max_tools, num_tools,
                            allow_empty, width):
    """(tokens, edges, allowed) as ``allowed_edges`` fills them, in numpy (the tests' reference)."""
    node = node.astype(np.int64)
    first = start[node]
    degree = start[node + 1] - first
    slot = np.arange(width)
    valid = slot[None, :] < degree[:, None]  # [B, M]
    edges = np.where(valid, first[:, None] + slot[None, :], -1)
    tokens = np.where(valid, edge_token[np.maximum(edges, 0)], -1).astype(np.int32)
    rows, cols = np.nonzero(valid)  # only real (row, slot) pairs are tested
    e = edges[rows, cols]
    kind = edge_kind[e]
    row_count = count[rows].astype(np.int64)
    row_used = used[rows]  # (R, W)
    has_unused = ((edge_bits[e] & ~row_used) != 0).any(axis=1)
    used_bits = np.bitwise_count(row_used).sum(axis=1, dtype=np.int64)
    sep_ok = (row_count + 1 < np.asarray(max_tools)[rows]) & (used_bits + 1 < num_tools)
    ok = np.where(kind == EDGE_EMPTY_END, (row_count == 0) & np.asarray(allow_empty)[rows],
                  has_unused & ((kind != EDGE_SEP) | sep_ok))
    allowed = np.zeros(valid.shape, bool)
    allowed[rows, cols] = ok
    return tokens, edges.astype(np.int32), allowed
