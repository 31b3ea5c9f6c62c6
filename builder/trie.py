"""Tool trie builder: catalog token paths -> ``toolcall.runtime.grammar.trie.Grammar`` (CSR arrays, bitsets).

Nodes are numbered breadth-first from the root (0), children in token order, so the
numbering depends only on the set of token paths; the terminal node is appended last (N-1).
Edges of a node are sorted by token id. A tool's end is a pair of edges at the node its path
reaches: SEP (back to the root, only when an answer can hold two tools) and END (to the
terminal). An empty-answer END edge leaves the root when the catalog allows empty answers.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import tokenizers

from toolcall.builder.catalog import Catalog, TokenizedCatalog, tokenize_catalog
from toolcall.runtime.grammar.trie import EDGE_EMPTY_END, EDGE_END, EDGE_NAME, EDGE_SEP, ROOT, Grammar, bitset_words_for


def build_grammar(catalog: Catalog, tokenizer: tokenizers.Tokenizer, end_token_id: int) -> Grammar:
    """Tokenize the catalog's tool names (checking them) and build its grammar."""
    return grammar_from_paths(tokenize_catalog(catalog, tokenizer, end_token_id))


def grammar_from_paths(tokenized: TokenizedCatalog) -> Grammar:
    """Build the grammar of already tokenized (and checked) tool paths."""
    catalog, paths = tokenized.catalog, tokenized.paths
    num_tools = len(paths)
    words = bitset_words_for(num_tools)

    # Trie as nested dicts: children[i] maps token -> temporary node id (insertion order).
    children: list[dict[int, int]] = [{}]
    tool_end = np.full(num_tools, -1, np.int64)  # tool -> temporary node id its path reaches
    on_path_node: list[int] = []  # (node, tool) pairs: node lies on tool's path (root excluded)
    on_path_tool: list[int] = []
    ended: set[int] = set()
    for tool, path in enumerate(paths):
        node = ROOT
        for token in path:
            nxt = children[node].get(token)
            if nxt is None:
                nxt = len(children)
                children[node][token] = nxt
                children.append({})
            node = nxt
            on_path_node.append(node)
            on_path_tool.append(tool)
        assert node != ROOT and node not in ended, "empty or duplicate token path slipped through"
        ended.add(node)
        tool_end[tool] = node

    # Breadth-first renumbering, children in token order: order[new] = old, new_id[old] = new.
    order: list[int] = []
    queue = deque([ROOT])
    while queue:
        old = queue.popleft()
        order.append(old)
        queue.extend(children[old][token] for token in sorted(children[old]))
    num_nodes = len(order) + 1  # + terminal
    terminal = num_nodes - 1
    new_id = np.empty(len(order), np.int64)
    new_id[np.asarray(order)] = np.arange(len(order))
    ending_tool = np.full(len(order), -1, np.int64)  # old node id -> tool ending there
    ending_tool[tool_end] = np.arange(num_tools)

    # Subtree bitsets per node [num_nodes, words]: bit t set on every node of tool t's path.
    node_bits = np.zeros((num_nodes, words), np.uint64)
    nodes = new_id[np.asarray(on_path_node, np.int64)]
    tools = np.asarray(on_path_tool, np.int64)
    np.bitwise_or.at(node_bits, (nodes, tools // 64), np.uint64(1) << (tools % 64).astype(np.uint64))
    tool_bits = np.zeros((num_tools, words), np.uint64)
    tool_ids = np.arange(num_tools)
    tool_bits[tool_ids, tool_ids // 64] = np.uint64(1) << (tool_ids % 64).astype(np.uint64)

    with_sep = min(catalog.answer.max_tools, num_tools) > 1
    sep, end = int(tokenized.sep_token_id), int(tokenized.end_token_id)
    # One row per edge: (token, kind, child, tool); bits are filled from child / tool below.
    rows: list[tuple[int, int, int, int]] = []
    edge_start = [0]
    for old in order:
        edges = [(token, EDGE_NAME, int(new_id[child]), -1) for token, child in children[old].items()]
        tool = int(ending_tool[old])
        if tool >= 0:
            edges.append((end, EDGE_END, terminal, tool))
            if with_sep:
                edges.append((sep, EDGE_SEP, ROOT, tool))
        if old == ROOT and catalog.answer.allow_empty:
            edges.append((end, EDGE_EMPTY_END, terminal, -1))
        edges.sort()  # by token id; tokens are unique within a node (SEP/END not in paths)
        rows.extend(edges)
        edge_start.append(len(rows))
    edge_start.append(len(rows))  # terminal: no edges

    table = np.asarray(rows, np.int64).reshape(-1, 4)
    token, kind, child, tool = table.T
    bits = np.where((kind == EDGE_NAME)[:, None], node_bits[child], tool_bits[np.maximum(tool, 0)])
    bits[kind == EDGE_EMPTY_END] = 0

    path_start = np.zeros(num_tools + 1, np.int64)
    path_start[1:] = np.cumsum([len(p) for p in paths])
    return Grammar(
        node_edge_start=np.asarray(edge_start, np.uint32),
        edge_token=token.astype(np.int32), edge_child=child.astype(np.int32),
        edge_kind=kind.astype(np.uint8), edge_tool=tool.astype(np.int32),
        edge_bits=np.ascontiguousarray(bits, np.uint64),
        tool_path_start=path_start.astype(np.uint32),
        tool_path_tokens=np.asarray([t for p in paths for t in p], np.int32),
        tool_names=catalog.names, sep_token_id=sep, end_token_id=end,
        max_tools=catalog.answer.max_tools, allow_empty=catalog.answer.allow_empty,
        separator=catalog.answer.separator, prompt_template=catalog.prompt_template)
