"""Tools -> grammar: each tool's token path (checked against the tokenizer) and the trie built from the paths
(``toolcall.runtime.grammar.trie.Grammar``: CSR arrays, subtree bitsets). The builder runs it on a catalog, the
runtime on a request's own tools (runtime/grammar/request_tools.py).

Nodes are numbered breadth-first from the root (0), children in token order, so the numbering depends only on
the set of token paths; the terminal node is appended last (N-1). Edges of a node are sorted by token id. A
tool's end is a pair of edges at the node its path reaches: SEP (back to the root, only when an answer can hold
two tools) and END (to the terminal). An empty-answer END edge leaves the root when empty answers are allowed.
A node has at most T + 1 edges for T tools (the root: one first token a tool, and the empty END; a tool's end:
SEP, END and one a longer tool through it).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from toolcall.common.errors import BuildError, CatalogError
from toolcall.runtime.grammar.tool_text import Tool
from toolcall.runtime.grammar.trie import EDGE_EMPTY_END, EDGE_END, EDGE_NAME, EDGE_SEP, ROOT, Grammar, bitset_words_for


def check_names(tools: Sequence[Tool], separator: str) -> None:
    """CatalogError("catalog_invalid") for a blank name, a repeated one, or one holding the answer separator."""
    first_index: dict[str, int] = {}
    for i, tool in enumerate(tools):
        if not tool.name.strip():
            raise CatalogError("catalog_invalid", f"tool {i} has a blank name {tool.name!r}; expected visible text",
                               index=i, name=tool.name)
        if tool.name in first_index:
            j = first_index[tool.name]
            raise CatalogError("catalog_invalid", f"tool {i} {tool.name!r} duplicates the name of tool {j}; "
                               "tool names must be unique: rename or remove one", index=i, name=tool.name,
                               first_index=j)
        first_index[tool.name] = i
        if separator in tool.name:
            raise CatalogError("catalog_invalid", f"tool {i} {tool.name!r} contains the answer separator "
                               f"{separator!r}; expected names without it", index=i, name=tool.name,
                               separator=separator)


def separator_token(tokenizer: Tokenizer, separator: str, end_token_id: int) -> int:
    """The separator's one token id; CatalogError unless it is exactly one token and not END."""
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if not 0 <= end_token_id < vocab:
        raise BuildError("build_failed", f"END token id {end_token_id} is outside the tokenizer's vocabulary "
                         f"[0, {vocab}); check the checkpoint's eos_token_id", end_token_id=end_token_id,
                         vocab_size=vocab)
    sep_ids = tokenizer.encode(separator, add_special_tokens=False).ids
    if len(sep_ids) != 1:
        raise CatalogError("catalog_invalid", f"separator {separator!r} tokenizes to {len(sep_ids)} tokens "
                           f"{sep_ids}, expected exactly 1; choose a separator that is one token",
                           separator=separator, token_ids=sep_ids)
    if sep_ids[0] == end_token_id:
        raise CatalogError("catalog_invalid", f"separator {separator!r} is token {sep_ids[0]}, the END token "
                           "itself; choose another separator", separator=separator, token_id=sep_ids[0])
    return sep_ids[0]


def tool_paths(tools: Sequence[Tool], tokenizer: Tokenizer, sep_id: int,
               end_token_id: int) -> tuple[tuple[int, ...], ...]:
    """Token path of every tool (its ``token_ids``, else its name encoded standalone, no special tokens added).

    CatalogError("catalog_invalid") unless each path is non-empty, within the vocabulary, free of SEP and END,
    and distinct from every other tool's path."""
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    paths: list[tuple[int, ...]] = []
    owner: dict[tuple[int, ...], int] = {}
    for i, tool in enumerate(tools):
        if tool.token_ids is not None:
            path = tool.token_ids
            bad = [t for t in path if not 0 <= t < vocab]
            if bad:
                raise CatalogError("catalog_invalid", f"tool {i} {tool.name!r}: token_ids {bad} outside the "
                                   f"vocabulary [0, {vocab}); fix or drop token_ids", index=i, name=tool.name,
                                   token_ids=bad, vocab_size=vocab)
        else:
            path = tuple(tokenizer.encode(tool.name, add_special_tokens=False).ids)
        if not path:
            raise CatalogError("catalog_invalid", f"tool {i} {tool.name!r} tokenizes to no tokens; expected at "
                               "least one: rename the tool or give token_ids", index=i, name=tool.name)
        for what, special in (("separator", sep_id), ("END", end_token_id)):
            if special in path:
                raise CatalogError("catalog_invalid", f"tool {i} {tool.name!r}: its token path {list(path)} "
                                   f"contains the {what} token {special} at position {path.index(special)}; "
                                   "rename the tool so the answer stays unambiguous", index=i, name=tool.name,
                                   token_id=special, position=path.index(special))
        if path in owner:
            j = owner[path]
            raise CatalogError("catalog_invalid", f"tool {i} {tool.name!r} has the same token path {list(path)} "
                               f"as tool {j} {tools[j].name!r}; expected distinct paths", index=i, name=tool.name,
                               other_index=j)
        owner[path] = i
        paths.append(path)
    return tuple(paths)


def trie_grammar(names: Sequence[str], paths: Sequence[tuple[int, ...]], *, sep_token_id: int, end_token_id: int,
                 max_tools: int, allow_empty: bool, separator: str, prompt_template: str) -> Grammar:
    """The grammar of checked token paths (``tool_paths``): tool t is ``names[t]`` with path ``paths[t]``."""
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

    with_sep = min(max_tools, num_tools) > 1
    sep, end = int(sep_token_id), int(end_token_id)
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
        if old == ROOT and allow_empty:
            edges.append((end, EDGE_EMPTY_END, terminal, -1))
        edges.sort()  # by token id; tokens are unique within a node (SEP/END not in paths)
        rows.extend(edges)
        edge_start.append(len(rows))
    edge_start.append(len(rows))  # terminal: no edges

    table = np.asarray(rows, np.int64).reshape(-1, 4)
    token, kind, child, tool = table.T
    # A name edge holds its child's subtree, a SEP/END edge its tool's bit, the empty END none: filled in place
    # (edges x words is ~150 MB at 16,384 tools: no second array of that size)
    bits = np.zeros((len(table), words), np.uint64)
    name = np.flatnonzero(kind == EDGE_NAME)
    bits[name] = node_bits[child[name]]
    closing = np.flatnonzero((kind == EDGE_SEP) | (kind == EDGE_END))
    bits[closing, tool[closing] // 64] = np.uint64(1) << (tool[closing] % 64).astype(np.uint64)

    path_start = np.zeros(num_tools + 1, np.int64)
    path_start[1:] = np.cumsum([len(p) for p in paths])
    return Grammar(
        node_edge_start=np.asarray(edge_start, np.uint32),
        edge_token=token.astype(np.int32), edge_child=child.astype(np.int32),
        edge_kind=kind.astype(np.uint8), edge_tool=tool.astype(np.int32),
        edge_bits=bits,
        tool_path_start=path_start.astype(np.uint32),
        tool_path_tokens=np.asarray([t for p in paths for t in p], np.int32),
        tool_names=tuple(names), sep_token_id=sep, end_token_id=end, max_tools=max_tools,
        allow_empty=allow_empty, separator=separator, prompt_template=prompt_template)
