"""Tools a request brings itself (names outside the bundle's catalog, with descriptions): the prompt rendered
with them and the grammar built for them, under the contract's ``request_tools`` limits.

A tool set is keyed by its tools' names and descriptions, in order; the last ``CACHED_TOOL_SETS`` sets are
kept, so requests repeating a tool list share one trie, one stepper and one encoder, and their identical prompt
prefix shares KV pages through the pool's prefix cache (runtime/batching/prefix_cache.py). The answer keeps the
catalog's format (separator, tools per answer, empty answer), so the same grammar guarantees hold: each tool at
most once, only the offered names.
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from toolcall.common.errors import CatalogError, RequestError
from toolcall.runtime.batching.prompt import PromptEncoder
from toolcall.runtime.bundle.contract import RequestToolsSection
from toolcall.runtime.grammar.build import check_names, tool_paths, trie_grammar
from toolcall.runtime.grammar.stepper import GrammarStepper
from toolcall.runtime.grammar.tool_text import Tool, render_template
from toolcall.runtime.grammar.trie import Grammar

CACHED_TOOL_SETS = 256  # distinct tool lists kept (a set of 64 tools holds well under 1 MB)


@dataclass(frozen=True)
class ToolSet:
    """One request tool list: its grammar's ``stepper`` and the ``prompt`` encoder of the template it renders."""

    key: str  # sha256 (hex) of the tools' names and descriptions, in order
    stepper: GrammarStepper
    prompt: PromptEncoder

    @property
    def names(self) -> tuple[str, ...]:
        return self.stepper.grammar.tool_names


class RequestTools:
    """The tool sets of one bundle: ``section`` (the contract's request_tools; None: the bundle takes no tools
    of a request, and ``takes_tools`` is False), the bundle's ``grammar`` (answer format, SEP and END) and its
    catalog ``prompt`` encoder (the tokenizers)."""

    def __init__(self, section: RequestToolsSection | None, grammar: Grammar, prompt: PromptEncoder):
        self.section, self.grammar, self.prompt = section, grammar, prompt
        self._sets: OrderedDict[str, ToolSet] = OrderedDict()
        self._added: tuple[dict[int, str], Counter] | None = None  # _added_tokens, once
        self._lock = threading.Lock()  # HTTP handlers and the engine thread ask at once

    @property
    def takes_tools(self) -> bool:
        return self.section is not None

    def tool_set(self, tools: Sequence[Tool]) -> ToolSet:
        """The tool set of ``tools`` (cached; only where ``takes_tools``); RequestError where a limit is passed
        ("request_tools_too_large", with the numbers) or a tool is malformed ("request_invalid": blank or repeated
        name, name holding the separator, a name that tokenizes into the separator or END, two names with one
        token path, text holding ``{request}`` or one of the model's special tokens)."""
        key = hashlib.sha256(json.dumps([[t.name, t.description or ""] for t in tools]).encode()).hexdigest()
        with self._lock:
            found = self._sets.get(key)
            if found is not None:
                self._sets.move_to_end(key)
                return found
        made = self._build(key, tuple(tools))
        with self._lock:
            self._sets[key] = made
            while len(self._sets) > CACHED_TOOL_SETS:
                self._sets.popitem(last=False)
        return made

    def _build(self, key: str, tools: tuple[Tool, ...]) -> ToolSet:
        section, g = self.section, self.grammar
        assert section is not None, "a bundle without request_tools builds no tool set"
        if not tools:
            raise RequestError("request_invalid", "the request's tools list is empty; send at least one tool or "
                               "leave tools out", field="tools")
        if len(tools) > section.max_tools:
            raise RequestError("request_tools_too_large", f"the request brings {len(tools)} tools; this bundle takes "
                               f"at most {section.max_tools} tools from a request (contract request_tools.max_tools): "
                               "send fewer", tools=len(tools), limit=section.max_tools)
        for i, tool in enumerate(tools):
            n = len(self.prompt.plain_ids(tool.description or ""))
            if n > section.max_description_tokens:
                raise RequestError("request_tools_too_large", f"tool {i} {tool.name!r}: its description takes {n} "
                                   f"tokens; this bundle takes at most {section.max_description_tokens} (contract "
                                   "request_tools.max_description_tokens): shorten it", index=i, name=tool.name,
                                   tokens=n, limit=section.max_description_tokens)
        try:
            check_names(tools, g.separator)
            rendered = render_template(section.prompt_template, tools, section.tool_format)  # refuses {request}
            paths = tool_paths(tools, self.prompt.plain_tokenizer, g.sep_token_id, g.end_token_id)
        except CatalogError as e:
            raise RequestError("request_invalid", f"request tools: {e.message}",
                               **{"field": "tools", **e.details}) from None
        encoder = self.prompt.with_template(rendered)  # as a catalog of these tools: the same ids
        self._check_no_special_tokens(tools, section, encoder)
        grammar = trie_grammar([t.name for t in tools], paths, sep_token_id=g.sep_token_id,
                               end_token_id=g.end_token_id, max_tools=g.max_tools, allow_empty=g.allow_empty,
                               separator=g.separator, prompt_template=rendered)
        return ToolSet(key, GrammarStepper(grammar), encoder)

    def _check_no_special_tokens(self, tools: tuple[Tool, ...], section: RequestToolsSection,
                                 encoder: PromptEncoder) -> None:
        """RequestError("request_invalid") where the tools' text adds an added token (``<|im_end|>``, ``<think>``)
        to the prompt: caller text never steers the chat format."""
        added, bare = self._added_tokens(section)
        found = Counter(t for t in encoder.prefix_ids + encoder.suffix_ids if t in added)
        found.subtract(bare)
        extra = sorted(t for t, n in found.items() if n > 0)
        if extra:
            tokens = [added[t] for t in extra]
            where = next((i for i, t in enumerate(tools)
                          if any(s in f"{t.name} {t.description or ''}" for s in tokens)), None)
            who = "the tool list" if where is None else f"tool {where} {tools[where].name!r}"
            raise RequestError("request_invalid", f"request tools: {who} holds the model's special token(s) {tokens}; "
                               "remove them: caller text never steers the chat format", field="tools", index=where,
                               tokens=tokens)

    def _added_tokens(self, section: RequestToolsSection) -> tuple[dict[int, str], Counter]:
        """The tokenizer's added tokens by id, and how often each is in the template rendered with no tools
        (computed once)."""
        if self._added is None:
            added = {i: t.content for i, t in self.prompt.template_tokenizer.get_added_tokens_decoder().items()}
            bare = self.prompt.with_template(render_template(section.prompt_template, (), section.tool_format))
            self._added = added, Counter(t for t in bare.prefix_ids + bare.suffix_ids if t in added)
        return self._added
