"""The word-overlap baseline: the one tool whose name and description share the most words with a request.

The rule, fixed so any answerer can be compared with it on the same cases:

- words: lower-cased runs of ASCII letters and digits (``[a-z0-9]+``), so "what's" gives "what" and
  "s", and "HIST 210" gives "hist" and "210"; then every word in ``STOPWORDS`` is dropped. No stemming:
  "invoice" and "invoices" are different words.
- a request's words are those of its text; a tool's are those of its name split on ``_`` plus those of
  its description.
- overlap: the number of distinct words the request and the tool share (each counts once, however
  often it occurs).
- answer: the single tool of highest overlap, ties going to the earliest tool in catalog order; the
  empty answer (no tool) when the best overlap is 0. It never names two tools, so it never gets a
  multi-tool request exactly right.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from toolcall.builder.catalog import Tool

# A small fixed English list: articles, pronouns, auxiliaries, prepositions, conjunctions, question
# words, politeness, and the fragments contractions split into ("what's" -> "what", "s"). Content
# words a tool could be about (time, day, new, send, ...) stay in.
STOPWORDS = frozenset("""
a an the this that these those some any all each every
i me my mine we us our you your he him his she her it its they them their
am is are was were be been being do does did done have has had having
can could will would shall should may might must
and or but if then so than as of to in on at by for with from into onto over under about up out off
not no yes just too very also there here
what which who whom whose when where why how
please pls thanks thank hi hello hey ok okay
s t d ll re ve m
""".split())
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> set[str]:
    """The distinct words of ``text`` (lower-cased ``[a-z0-9]+`` runs), stopwords dropped."""
    return set(_WORD.findall(text.lower())) - STOPWORDS


def tool_words(tool: Tool) -> set[str]:
    """A tool's words: its name split on ``_`` and its description (none: the name alone)."""
    return words(tool.name.replace("_", " ") + " " + (tool.description or ""))


def overlap_answer(request: str, tools: Sequence[Tool]) -> list[str]:
    """``[name]`` of the tool sharing the most words with ``request`` (earliest in ``tools`` on a tie),
    or ``[]`` when no tool shares a word."""
    asked = words(request)
    best, best_name = 0, None
    for tool in tools:
        shared = len(asked & tool_words(tool))
        if shared > best:  # strictly more: an equal count later in the catalog never displaces an earlier tool
            best, best_name = shared, tool.name
    return [best_name] if best_name is not None else []
