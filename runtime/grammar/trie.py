"""The tool grammar: trie arrays in CSR form, per-edge tool bitsets, tool table, and the
``grammar.msgpack`` file that carries them (the format is defined here, once).

An answer is ``tool (SEP tool)* END``. Layout (the GPU kernels read the same arrays):

- nodes 0..N-1; node 0 = root (start of a tool), node N-1 = terminal (answer done, no edges).
- ``node_edge_start`` uint32[N+1]: edges of node n are ``node_edge_start[n]:node_edge_start[n+1]``,
  sorted by token id (tokens unique within a node).
- per edge: ``edge_token`` int32[E], ``edge_child`` int32[E], ``edge_kind`` uint8[E] (see
  EDGE_*), ``edge_tool`` int32[E] (tool closed by kinds 1/2, else -1), ``edge_bits``
  uint64[E, W]: bit t of word t//64 = tool t is in the edge's subtree (kinds 1/2: only the
  closed tool; kind 3: empty). W = bitset_words, the fewest words holding num_tools bits.
- tool table: ``tool_names``; token path of tool t = ``tool_path_tokens[tool_path_start[t]:
  tool_path_start[t+1]]`` (uint32[T+1], int32[P]).

File: one msgpack map (format name + version, sizes, scalars, tool names, arrays as ``{"dtype":
"<u4", "shape": [...], "data": <raw little-endian bytes>}``); fixed key order: same grammar, same bytes.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

import msgpack
import numpy as np

from toolcall.common.errors import Refusal

FORMAT_NAME = "toolcall-grammar"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1, 1)  # inclusive range this runtime reads

ROOT = 0
EDGE_NAME = 0  # next token of a tool name -> child node
EDGE_SEP = 1  # SEP closing a tool -> root
EDGE_END = 2  # END closing a tool -> terminal
EDGE_EMPTY_END = 3  # END of an empty answer, at root -> terminal

# array field -> little-endian dtype it must have; also the order arrays are written in.
ARRAY_DTYPES: dict[str, np.dtype] = {name: np.dtype(code) for name, code in (
    ("node_edge_start", "<u4"), ("edge_token", "<i4"), ("edge_child", "<i4"), ("edge_kind", "u1"),
    ("edge_tool", "<i4"), ("edge_bits", "<u8"), ("tool_path_start", "<u4"),
    ("tool_path_tokens", "<i4"))}
ARRAY_NDIM = {name: 2 if name == "edge_bits" else 1 for name in ARRAY_DTYPES}
RECORDED_SIZES = ("num_nodes", "num_edges", "num_tools", "bitset_words", "max_edges_per_node")
SCALAR_FIELDS = ("sep_token_id", "end_token_id", "max_tools", "allow_empty", "separator",
                 "prompt_template")


def bitset_words_for(num_tools: int) -> int:
    """Words of 64 bits in a tool bitset: the smallest multiple of 64 bits >= num_tools."""
    return max(1, -(-num_tools // 64))


@dataclass(frozen=True, eq=False)
class Grammar:
    """Tool trie + answer format; arrays are read-only and checked on construction."""

    node_edge_start: np.ndarray
    edge_token: np.ndarray
    edge_child: np.ndarray
    edge_kind: np.ndarray
    edge_tool: np.ndarray
    edge_bits: np.ndarray
    tool_path_start: np.ndarray
    tool_path_tokens: np.ndarray
    tool_names: tuple[str, ...]
    sep_token_id: int
    end_token_id: int
    max_tools: int
    allow_empty: bool
    separator: str
    prompt_template: str

    def __post_init__(self):
        for name in ARRAY_DTYPES:
            if isinstance(getattr(self, name), np.ndarray):
                getattr(self, name).setflags(write=False)
        object.__setattr__(self, "tool_names", tuple(self.tool_names))
        _check(self)

    # ---- sizes (recorded in the file and the contract) ----
    @property
    def num_nodes(self) -> int:
        return len(self.node_edge_start) - 1

    @property
    def num_edges(self) -> int:
        return len(self.edge_token)

    @property
    def num_tools(self) -> int:
        return len(self.tool_names)

    @property
    def bitset_words(self) -> int:
        return self.edge_bits.shape[1]

    @property
    def terminal(self) -> int:
        return self.num_nodes - 1

    @property
    def max_edges_per_node(self) -> int:
        return int(np.diff(self.node_edge_start.astype(np.int64)).max())

    @property
    def max_answer_tokens(self) -> int:
        """Longest answer the grammar admits, END included: the max_tools longest tools + SEPs."""
        k = min(self.max_tools, self.num_tools)
        lengths = np.sort(np.diff(self.tool_path_start.astype(np.int64)))[::-1]
        return int(lengths[:k].sum()) + k

    def tool_path(self, tool: int) -> tuple[int, ...]:
        lo, hi = self.tool_path_start[tool], self.tool_path_start[tool + 1]
        return tuple(int(t) for t in self.tool_path_tokens[lo:hi])

    def render_prompt(self, request: str) -> str:
        """The prompt text of a request (the template with ``{request}`` replaced), for reading; the
        model's input ids come from runtime/batching/prompt.py, which tokenizes the parts apart and the
        request as plain text (so ids of this text may differ)."""
        return self.prompt_template.replace("{request}", request)

    def summary(self) -> dict:
        """The numbers a contract records about this grammar."""
        return {"num_tools": self.num_tools, "bitset_bits": 64 * self.bitset_words,
                "num_nodes": self.num_nodes, "num_edges": self.num_edges,
                "max_edges_per_node": self.max_edges_per_node,
                "sep_token_id": self.sep_token_id, "end_token_id": self.end_token_id,
                "max_tools": self.max_tools, "allow_empty": self.allow_empty,
                "max_answer_tokens": self.max_answer_tokens}

    def __eq__(self, other) -> bool:
        if not isinstance(other, Grammar):
            return NotImplemented
        return all(np.array_equal(getattr(self, f.name), getattr(other, f.name))
                   if f.name in ARRAY_DTYPES else getattr(self, f.name) == getattr(other, f.name)
                   for f in fields(self))

    __hash__ = None

    # ---- file format ----
    def to_msgpack(self) -> bytes:
        """The grammar.msgpack bytes; deterministic (fixed key order, raw LE arrays)."""
        doc = {"format": FORMAT_NAME, "version": FORMAT_VERSION}
        doc.update({name: getattr(self, name) for name in RECORDED_SIZES})
        doc.update({name: getattr(self, name) for name in SCALAR_FIELDS})
        doc["tool_names"] = list(self.tool_names)
        doc["arrays"] = {name: {"dtype": dtype.str, "shape": list(getattr(self, name).shape),
                                "data": np.ascontiguousarray(getattr(self, name), dtype).tobytes()}
                         for name, dtype in ARRAY_DTYPES.items()}
        return msgpack.packb(doc, use_bin_type=True)

    @classmethod
    def from_msgpack(cls, data: bytes, source: str = "grammar.msgpack") -> "Grammar":
        """Parse grammar.msgpack bytes; ``Refusal`` (bundle_invalid / format_unsupported)."""
        def bad(what: str, **details) -> Refusal:
            return Refusal("bundle_invalid", f"{source}: {what}; rebuild the bundle", file=source, **details)
        try:
            doc = msgpack.unpackb(data, raw=False)
        except Exception as e:  # msgpack raises several unrelated types on bad input
            raise bad(f"not a msgpack document ({type(e).__name__}: {e})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise bad(f"format name {found!r}, expected {FORMAT_NAME!r}")
        version = doc.get("version")
        lo, hi = SUPPORTED_VERSIONS
        if not isinstance(version, int) or not lo <= version <= hi:
            raise Refusal("format_unsupported", f"{source}: grammar format version {version!r}, this runtime reads "
                          f"versions {lo}..{hi}; rebuild the bundle or upgrade the runtime",
                          file=source, found=version, supported_min=lo, supported_max=hi)
        kwargs: dict = {}
        arrays = doc["arrays"] if isinstance(doc.get("arrays"), dict) else {}
        for name, dtype in ARRAY_DTYPES.items():
            spec = arrays.get(name)
            if not isinstance(spec, dict) or spec.get("dtype") != dtype.str:
                found = spec.get("dtype") if isinstance(spec, dict) else None
                raise bad(f"array {name!r} has dtype {found!r}, expected {dtype.str!r}", array=name)
            shape, raw = spec.get("shape"), spec.get("data")
            if (not isinstance(shape, list) or len(shape) != ARRAY_NDIM[name]
                    or not all(isinstance(d, int) and d >= 0 for d in shape)
                    or not isinstance(raw, bytes) or len(raw) != math.prod(shape) * dtype.itemsize):  # no wrap
                raise bad(f"array {name!r}: shape {shape!r} does not match "
                          f"{len(raw) if isinstance(raw, bytes) else None} data bytes", array=name)
            kwargs[name] = np.frombuffer(raw, dtype).reshape(shape)
        missing = [name for name in (*SCALAR_FIELDS, "tool_names") if name not in doc]
        if missing or not isinstance(doc["tool_names"], list):
            raise bad(f"missing fields {missing} or 'tool_names' not a list", missing=missing)
        try:
            grammar = cls(tool_names=tuple(doc["tool_names"]), **kwargs, **{k: doc[k] for k in SCALAR_FIELDS})
        except Refusal as e:
            raise bad(e.message, **e.details) from None
        recorded = {k: doc.get(k) for k in RECORDED_SIZES}
        derived = {k: getattr(grammar, k) for k in RECORDED_SIZES}
        if recorded != derived:
            raise bad(f"recorded sizes {recorded} disagree with the arrays {derived}")
        return grammar

    def write(self, path: str | os.PathLike) -> None:
        Path(path).write_bytes(self.to_msgpack())

    @classmethod
    def read(cls, path: str | os.PathLike) -> "Grammar":
        """Read grammar.msgpack; ``Refusal`` if missing, malformed or of another version."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise Refusal("file_missing" if isinstance(e, FileNotFoundError) else "bundle_invalid",
                          f"{path}: cannot read grammar ({e.strerror}); expected the bundle's grammar.msgpack",
                          file=str(path)) from None
        return cls.from_msgpack(data, source=str(path))


def _check(g: Grammar) -> None:
    """Every invariant the stepper and kernels rely on; ``Refusal("bundle_invalid")`` if not."""
    def fail(what: str, **details):
        raise Refusal("bundle_invalid", f"grammar arrays inconsistent: {what}", **details)

    for name, dtype in ARRAY_DTYPES.items():
        a = getattr(g, name)
        if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != ARRAY_NDIM[name]:
            fail(f"{name} must be a {ARRAY_NDIM[name]}-d {dtype.str} array", array=name)
    for name, kind in zip(SCALAR_FIELDS, (int, int, int, bool, str, str)):
        value = getattr(g, name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            fail(f"{name} = {value!r}, expected {kind.__name__}", field=name)
    n, e, t, w = g.num_nodes, g.num_edges, g.num_tools, g.bitset_words
    if n < 2 or t < 1 or g.max_tools < 1 or g.sep_token_id == g.end_token_id or not all(
            isinstance(name, str) for name in g.tool_names):
        fail(f"{n} nodes, {t} tools, max_tools {g.max_tools}: expected >= 2, >= 1, >= 1, SEP != END, names str")
    starts = g.node_edge_start.astype(np.int64)
    if starts[0] != 0 or starts[-1] != e or (np.diff(starts) < 0).any() or starts[-2] != e:
        fail("node_edge_start must rise from 0 to num_edges, the terminal node without edges")
    if g.edge_bits.shape[0] != e or w != bitset_words_for(t) or any(
            len(getattr(g, k)) != e for k in ("edge_child", "edge_kind", "edge_tool")):
        fail(f"edge arrays must all have {e} rows and {bitset_words_for(t)} bitset words")
    node_of_edge = np.repeat(np.arange(n), np.diff(starts))
    kind, child, tool = g.edge_kind, g.edge_child.astype(np.int64), g.edge_tool.astype(np.int64)
    closes = (kind == EDGE_SEP) | (kind == EDGE_END)
    expected_child = np.select([kind == EDGE_SEP, kind == EDGE_NAME], [ROOT, child], n - 1)
    if ((kind > EDGE_EMPTY_END).any() or (child != expected_child).any()
            or ((kind == EDGE_NAME) & ((child <= ROOT) | (child >= n - 1))).any()
            or (node_of_edge[kind == EDGE_EMPTY_END] != ROOT).any()
            or (kind == EDGE_EMPTY_END).sum() != int(g.allow_empty)):
        fail("edge kinds and children disagree (SEP -> root, END -> terminal, names -> inner, empty END at "
             "root iff allow_empty)")
    if (closes & ((tool < 0) | (tool >= t))).any() or (~closes & (tool != -1)).any():
        fail("edge_tool must name a tool on SEP/END edges and be -1 elsewhere")
    token = g.edge_token
    expected_token = np.select([kind == EDGE_SEP, kind == EDGE_NAME], [g.sep_token_id, token], g.end_token_id)
    is_special = (token == g.sep_token_id) | (token == g.end_token_id)
    if (token != expected_token).any() or ((kind == EDGE_NAME) & is_special).any():
        fail("SEP edges must carry the SEP token, END edges END, name edges neither")
    # Every tool has one END edge, and a SEP edge beside it iff an answer can hold 2 tools.
    sep_count = np.bincount(tool[kind == EDGE_SEP], minlength=t)
    if ((np.bincount(tool[kind == EDGE_END], minlength=t) != 1).any()
            or (sep_count != int(min(g.max_tools, t) > 1)).any()):
        fail("each tool needs one END edge, and one SEP edge when max_tools > 1")
    same_node = node_of_edge[1:] == node_of_edge[:-1]
    if (token < 0).any() or (same_node & (np.diff(token) <= 0)).any():
        fail("edge tokens must be >= 0 and strictly increasing within each node")
    # The trie is a tree: every inner node has exactly one incoming name edge.
    indegree = np.bincount(child[kind == EDGE_NAME], minlength=n)
    if (indegree[1:-1] != 1).any():
        fail("every inner node needs exactly one incoming name edge")
    # Bitsets: SEP/END edges hold their tool only; a name edge holds the union of its child's
    # edges; the root holds every tool. This is what makes every allowed edge lead somewhere.
    # Checked in pieces (edges x words is ~150 MB at 16,384 tools: no second array of that size).
    bits = g.edge_bits
    rows = np.flatnonzero(closes)
    own = bits[rows]  # (closing edges, w): their tool's bit, then nothing else
    bit = np.uint64(1) << (tool[rows] % 64).astype(np.uint64)
    has_own = (own[np.arange(len(rows)), tool[rows] // 64] == bit).all()
    own[np.arange(len(rows)), tool[rows] // 64] = 0
    union = _node_unions(bits, starts, n)  # OR of each node's edge bitsets
    names = np.flatnonzero(kind == EDGE_NAME)
    all_tools = np.packbits(np.arange(w * 64) < t, bitorder="little").view("<u8")  # bits 0..t-1 set
    if (not has_own or own.any() or bits[kind == EDGE_EMPTY_END].any() or (bits[names] != union[child[names]]).any()
            or (union[ROOT] != all_tools).any()):
        fail("edge_bits are not the tool sets of the edges' subtrees")
    path_start = g.tool_path_start.astype(np.int64)
    if len(path_start) != t + 1 or path_start[0] != 0 or path_start[-1] != len(g.tool_path_tokens) or (
            np.diff(path_start) < 1).any():
        fail("tool_path_start must rise strictly from 0 to len(tool_path_tokens)")
    # Each tool's path, walked from the root, must end at the node whose END edge closes it.
    end_node = np.full(t, -1, np.int64)
    end_rows = np.flatnonzero(kind == EDGE_END)
    end_node[tool[end_rows]] = node_of_edge[end_rows]
    sep_rows = np.flatnonzero(kind == EDGE_SEP)
    if (node_of_edge[sep_rows] != end_node[tool[sep_rows]]).any():
        fail("a tool's SEP edge must leave the node its END edge leaves")
    for k in range(t):
        node = ROOT
        for step in g.tool_path_tokens[path_start[k]:path_start[k + 1]]:
            lo, hi = starts[node], starts[node + 1]
            i = lo + int(np.searchsorted(token[lo:hi], step))
            if i >= hi or token[i] != step or kind[i] != EDGE_NAME:
                fail(f"tool {k} {g.tool_names[k]!r}: its path leaves the trie", index=k)
            node = int(child[i])
        if end_node[k] != node:
            fail(f"tool {k} {g.tool_names[k]!r}: no END edge where its path ends", index=k)


def _node_unions(bits: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    """(n, words) OR of each node's edge bitsets ``bits`` (edges, words), the edges of node v being rows
    starts[v] .. starts[v + 1] - 1: one pass per edge rank (the k-th edge of every node with more than k),
    so the work is the edges' rows once, with no per-node call."""
    union = np.zeros((n, bits.shape[1]), np.uint64)
    counts = np.diff(starts)
    for k in range(int(counts.max()) if n else 0):
        nodes = np.flatnonzero(counts > k)
        union[nodes] |= bits[starts[nodes] + k]
    return union
