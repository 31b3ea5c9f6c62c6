"""The hand-written evaluation set (models/recipe/handwritten.tsv): plain requests typed as a
person would, each with its expected tools. Reporting only: never training, tokenizer or model
choice (the file's header says how it was written and labelled).

Format: ``request<TAB>tool,tool,...`` a line (nothing after the TAB: no tool), "#" lines are
comments, and the request ``<empty>`` stands for "".
"""
from __future__ import annotations

import re
from pathlib import Path

from toolcall.common.errors import CatalogError

HANDWRITTEN = Path(__file__).with_name("handwritten.tsv")
# Development sets, written by hand apart from the test set and used for decisions (data design, run and
# checkpoint choice): mixed requests, and 2-4-tool requests. Like it, never trained on verbatim.
DEVSET = Path(__file__).with_name("devset.tsv")
DEVSET_MULTI = Path(__file__).with_name("devset_multi.tsv")
EMPTY = "<empty>"


def load_handwritten(path: str | Path = HANDWRITTEN, tool_names=None) -> list[tuple[str, tuple[str, ...]]]:
    """(request, expected tools in order) per line; ``CatalogError("catalog_invalid")`` for a line
    that is not ``request<TAB>tools`` or (given ``tool_names``) names a tool not in the catalog."""
    out = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").split("\n"), 1):
        if not line or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise CatalogError("catalog_invalid", f"{path}:{number}: expected 'request<TAB>tools', found "
                              f"{len(parts)} TAB-separated fields; fix the line")
        request, tools = parts[0], tuple(t for t in parts[1].split(",") if t)
        unknown = [t for t in tools if tool_names is not None and t not in tool_names]
        if unknown or len(set(tools)) != len(tools):
            raise CatalogError("catalog_invalid", f"{path}:{number}: tools {list(tools)} hold unknown or repeated "
                              f"names {unknown}; name each catalog tool at most once")
        out.append(("" if request == EMPTY else request, tools))
    return out


def normalized(text: str) -> str:
    """Lower case, punctuation dropped, spaces collapsed: how two requests compare as "the same"."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def without_evaluation_requests(examples, paths=(HANDWRITTEN, DEVSET, DEVSET_MULTI)) -> list:
    """``examples`` minus those whose request equals (``normalized``) a request of the evaluation sets
    at ``paths``, so no evaluation line is ever trained on verbatim; requests that normalize to ""
    (empty, blank, punctuation only) are content-free and kept."""
    held = {normalized(r) for path in paths for r, _ in load_handwritten(path)} - {""}
    return [e for e in examples if normalized(e.request) not in held]
