"""Packed training rows for the catalog-reading model, and their batch tensors.

A row is one catalog prefix (the template up to ``{request}``, the tool lines rendered through the
runtime's own ``render_template``) followed by many requests, each seeing only the prefix and itself
(positions restart after the prefix). A request's answer is the runtime grammar's: the tools' token
paths joined by SEP ("\\n") and closed by END; END alone is the empty answer.

Per row, besides the answer targets, the labels of the training-only losses (train_catalog.py):
- ``line_labels``: a catalog token's line (the first token of that line's name), -1 outside the lines;
- ``request_labels``: a request token's tool (its first name token), END for a content word no tool
  holds, -1 otherwise (function words, verbs, words several tools hold);
- ``same_word``: (request position, catalog positions of the same token in its tool's line);
- ``evidence``: (first answer position, request positions labelled with the first tool);
- ``copy``: (answer position, catalog position of the name token it emits next).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

import torch
from tokenizers import Tokenizer

from toolcall.models.recipe.catalog_gen import TOKENIZER, VERB_STEMS, tool_words, words
from toolcall.models.recipe.train import END_ID, PAD_ID
from toolcall.runtime.batching.prompt import PromptEncoder
from toolcall.runtime.grammar.tool_text import Tool, render_template

TEMPLATE = ("<|im_start|>system\nTools:\n{tools}<|im_end|>\n<|im_start|>user\n{request}<|im_end|>\n"
            "<|im_start|>assistant\n")
# After the newline a name tokenizes exactly as its answer path does ("- {name}" would not).
TOOL_FORMAT = "{name}: {description}"
END, PAD = END_ID, PAD_ID
SUPERVISED = ("same_word", "evidence", "copy")


@dataclass
class Row:
    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    segment: list[int] = field(default_factory=list)  # -1: the shared prefix; j: request j
    targets: list[tuple[int, int, float, int, int, bool]] = field(default_factory=list)
    line_labels: list[int] = field(default_factory=list)
    request_labels: list[int] = field(default_factory=list)
    supervised: dict[str, list[tuple[int, list[int]]]] = field(default_factory=lambda: {k: [] for k in SUPERVISED})


@dataclass(frozen=True)
class Prefix:
    ids: tuple[int, ...]
    suffix: tuple[int, ...]
    paths: dict
    line_labels: tuple[int, ...]
    name_at: dict  # name -> prefix position of its line's first token
    in_line: dict  # (token id, line label) -> the prefix positions holding that token in that line


class RowEncoder:
    def __init__(self):
        self.tokenizer = Tokenizer.from_file(str(TOKENIZER))
        self.base = PromptEncoder.create(self.tokenizer, TEMPLATE.replace("{tools}", "x"))
        (self.sep,) = self.tokenizer.encode("\n", add_special_tokens=False).ids

    @lru_cache(maxsize=4)
    def prefix(self, tools: tuple[tuple[str, str], ...]) -> Prefix:
        rendered = render_template(TEMPLATE, tuple(Tool(n, d) for n, d in tools), TOOL_FORMAT)
        prompt = self.base.with_template(rendered)
        head = rendered.split("{request}")[0]
        enc = self.tokenizer.encode(head, add_special_tokens=False)
        assert enc.ids == list(prompt.prefix_ids)
        paths = {n: self.tokenizer.encode(n, add_special_tokens=False).ids for n, _ in tools}
        spans, at = [], head.index("Tools:\n") + len("Tools:\n")
        for n, d in tools:
            line = TOOL_FORMAT.replace("{name}", n).replace("{description}", d).rstrip()
            assert head[at:at + len(line)] == line
            spans.append((at, at + len(line), n))
            at += len(line) + 1
        labels = [next((paths[n][0] for x, y, n in spans if x <= a < y), -1) for a, _ in enc.offsets]
        name_at = {}
        for x, _, n in spans:
            i = next(i for i, (a, _) in enumerate(enc.offsets) if a == x)
            assert enc.ids[i:i + len(paths[n])] == paths[n]
            name_at[n] = i
        in_line: dict[tuple[int, int], list[int]] = {}
        for q, (token, label) in enumerate(zip(enc.ids, labels)):
            if label >= 0:
                in_line.setdefault((token, label), []).append(q)
        return Prefix(tuple(enc.ids), tuple(prompt.suffix_ids), paths, tuple(labels), name_at, in_line)

    def answer(self, names, paths) -> list[int]:
        out = []
        for i, n in enumerate(names):
            out += paths[n] + [self.sep if i + 1 < len(names) else END]
        return out or [END]

    def row(self, tools, requests) -> Row:
        """``requests``: (text, answer names, clause spans or None); a span is (start, end, tool name) in
        characters of the text, and a request with spans labels its tokens by clause, not by word match."""
        p = self.prefix(tuple(tools))
        encoded = self.base.plain_tokenizer.encode_batch([r[0] for r in requests], add_special_tokens=False)
        line_words = [({w for w in tool_words(t) if w not in VERB_STEMS}, p.paths[t[0]][0]) for t in tools]
        first_token = {n: p.paths[n][0] for n, _ in tools}
        r = Row(list(p.ids), list(range(len(p.ids))), [-1] * len(p.ids), [], list(p.line_labels), [-1] * len(p.ids))
        for j, ((text, names, spans), enc) in enumerate(zip(requests, encoded)):
            start = len(r.ids)
            labels = [self._token_label(text, a, b, spans, line_words, first_token) for a, b in enc.offsets]
            for k, label in enumerate(labels):
                if label >= 0 and label != END and (enc.ids[k], label) in p.in_line:
                    r.supervised["same_word"].append((start + k, p.in_line[enc.ids[k], label]))
            body = enc.ids + list(p.suffix)
            answer = self.answer(names, p.paths)
            first_at = start + len(body) - 1  # the position that predicts the answer's first token
            if names:
                evidence = [start + k for k, label in enumerate(labels) if label == first_token[names[0]]]
                if evidence:
                    r.supervised["evidence"].append((first_at, evidence))
            at = first_at
            for n in names:
                for m in range(len(p.paths[n])):
                    r.supervised["copy"].append((at, [p.name_at[n] + m]))
                    at += 1
                at += 1  # SEP or END
            seq = body + answer[:-1]
            r.ids += seq
            r.positions += range(len(p.ids), len(p.ids) + len(seq))
            r.segment += [j] * len(seq)
            r.request_labels += labels + [-1] * (len(seq) - len(labels))
            r.line_labels += [-1] * len(seq)
            opens_tool = True
            for k, t in enumerate(answer):  # a tool's first token weighs double: it is the choice
                r.targets.append((first_at + k, t, 2.0 if opens_tool else 1.0, j, len(names), k == 0))
                opens_tool = t == self.sep
        return r

    @staticmethod
    def _token_label(text, a, b, spans, line_words, first_token) -> int:
        if spans is not None:
            return next((first_token[n] for x, y, n in spans if x <= a < y and n in first_token), -1)
        m = next((m for m in re.finditer(r"[A-Za-z0-9]+", text) if m.start() <= a < m.end() or a < m.start() < b),
                 None)
        if m is None:
            return -1
        w = words(m.group()) - VERB_STEMS
        if not w:
            return -1
        hits = {first for ws, first in line_words if w & ws}
        return END if not hits else hits.pop() if len(hits) == 1 else -1


def collate(rows: list[Row]) -> dict:
    """Right-padded tensors for a list of rows: ids/positions [B, T], mask [B, 1, T, T] (True: attend),
    answer targets as flat (row, position, target, weight), per-token labels [B, T] (-1: none), and per
    supervised loss flat (row, query, key, group) index tensors plus the number of groups."""
    T, B = max(len(r.ids) for r in rows), len(rows)
    ids = torch.full((B, T), PAD, dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T, T), dtype=torch.bool)
    lines = torch.full((B, T), -1, dtype=torch.long)
    reqs = torch.full((B, T), -1, dtype=torch.long)
    tb, tc, tt, tw, meta = [], [], [], [], []
    sup = {k: ([], [], [], []) for k in SUPERVISED}
    groups = dict.fromkeys(SUPERVISED, 0)
    for b, r in enumerate(rows):
        n = len(r.ids)
        ids[b, :n], pos[b, :n] = torch.tensor(r.ids), torch.tensor(r.positions)
        lines[b, :n], reqs[b, :n] = torch.tensor(r.line_labels), torch.tensor(r.request_labels)
        seg = torch.tensor(r.segment)
        visible = (seg[:, None] == seg[None, :]) | (seg[None, :] == -1)  # own request, or the shared prefix
        mask[b, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril() & visible
        mask[b, n:, :1] = True  # pad rows look at token 0 (no NaN)
        for c, t, w, j, kind, first in r.targets:
            tb.append(b)
            tc.append(c)
            tt.append(t)
            tw.append(w)
            meta.append((b, j, kind, first))
        for key in SUPERVISED:
            bb, qq, kk, gg = sup[key]
            for q, keys in r.supervised[key]:
                bb += [b] * len(keys)
                qq += [q] * len(keys)
                kk += keys
                gg += [groups[key]] * len(keys)
                groups[key] += 1
    long = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return {"ids": ids, "pos": pos, "mask": mask[:, None], "rows": long(tb), "cols": long(tc), "targets": long(tt),
            "weights": torch.tensor(tw), "meta": meta, "line_labels": lines, "request_labels": reqs,
            "supervised": {k: (*(long(x) for x in v), groups[k]) for k, v in sup.items()}}
