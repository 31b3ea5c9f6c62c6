"""Tool catalog: loading, schema and semantic validation, and tokenization of tool names.

A catalog (``schemas/catalog.schema.json``) lists the tools a model may name and the answer
format ``tool (SEP tool)* END``. ``load_catalog`` checks everything that needs no tokenizer;
``tokenize_catalog`` checks the rest against the checkpoint's tokenizer and yields each tool's
token path, the input of the trie builder.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import tokenizers

from toolcall.common.errors import BuildError, CatalogError
from toolcall.schemas import load_schema

# Largest catalog: 256 words of 64 bits per edge bitset. The grammar's bitset bytes grow as
# tools x edges (both ~linear in the catalog), so 16,384 tools is ~100 MB of bitsets at ~3
# edges per tool; a larger catalog would need a sparse layout the kernels do not read.
MAX_CATALOG_TOOLS = 16_384
DEFAULT_SEPARATOR = "\n"
DEFAULT_MAX_TOOLS = 4
DEFAULT_PROMPT_TEMPLATE = "<|im_start|>user\n{request}<|im_end|>\n<|im_start|>assistant\n"
REQUEST_PLACEHOLDER = "{request}"
TOOLS_PLACEHOLDER = "{tools}"
# One line per tool, in catalog order, lines joined by "\n" (no trailing newline). In the line
# format, {name} is the tool's name and {description} its description (empty text when it has
# none); trailing whitespace of a line is dropped. No other braces are interpreted.
DEFAULT_TOOL_FORMAT = "- {name}: {description}"
_TOOL_FIELD = re.compile(r"\{(name|description)\}")


@dataclass(frozen=True)
class Tool:
    """One catalog tool; ``token_ids`` set only when the catalog overrides the tokenizer."""

    name: str
    description: str | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class AnswerFormat:
    """How an answer is laid out: tools joined by ``separator``, then END."""

    separator: str = DEFAULT_SEPARATOR
    max_tools: int = DEFAULT_MAX_TOOLS
    allow_empty: bool = False


@dataclass(frozen=True)
class Catalog:
    """A validated tool catalog; a tool's index in ``tools`` is its tool id."""

    tools: tuple[Tool, ...]
    answer: AnswerFormat = AnswerFormat()
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE  # rendered: {tools} replaced, {request} left once
    tool_format: str = DEFAULT_TOOL_FORMAT

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)


@dataclass(frozen=True)
class TokenizedCatalog:
    """Token paths of a catalog's tools (``paths[t]`` for tool id t) and its SEP/END ids."""

    catalog: Catalog
    paths: tuple[tuple[int, ...], ...]
    sep_token_id: int
    end_token_id: int


def load_catalog(source: str | os.PathLike | Mapping) -> Catalog:
    """Read (a path) or take (a parsed dict) a catalog, validate it and fill in defaults.

    Raises ``CatalogError("catalog_invalid", ...)`` naming the tool's index and name where
    one tool is at fault.
    """
    doc = _read_document(source) if isinstance(source, (str, os.PathLike)) else source
    if not isinstance(doc, Mapping):
        raise CatalogError("catalog_invalid",
                           f"catalog must be a JSON object, found {type(doc).__name__}; "
                           "expected {\"tools\": [...], ...} per schemas/catalog.schema.json")
    tools_doc = doc.get("tools")
    if isinstance(tools_doc, list) and len(tools_doc) > MAX_CATALOG_TOOLS:
        raise CatalogError("catalog_invalid",
                           f"catalog has {len(tools_doc)} tools, at most {MAX_CATALOG_TOOLS} are "
                           "supported (largest grammar bitset); split the catalog",
                           tools=len(tools_doc), max_tools_supported=MAX_CATALOG_TOOLS)
    _check_template_text(doc)
    _check_schema(doc)

    answer_doc = doc.get("answer", {})
    answer = AnswerFormat(separator=answer_doc.get("separator", DEFAULT_SEPARATOR),
                          max_tools=answer_doc.get("max_tools", DEFAULT_MAX_TOOLS),
                          allow_empty=answer_doc.get("allow_empty", False))
    tools = tuple(Tool(name=t["name"], description=t.get("description"),
                       token_ids=tuple(t["token_ids"]) if "token_ids" in t else None)
                  for t in tools_doc)
    first_index: dict[str, int] = {}
    for i, tool in enumerate(tools):
        if not tool.name.strip():
            raise CatalogError("catalog_invalid",
                               f"tool {i} has a blank name {tool.name!r}; expected visible text",
                               index=i, name=tool.name)
        if tool.name in first_index:
            j = first_index[tool.name]
            raise CatalogError("catalog_invalid",
                               f"tool {i} {tool.name!r} duplicates the name of tool {j}; "
                               "tool names must be unique: rename or remove one",
                               index=i, name=tool.name, first_index=j)
        first_index[tool.name] = i
        if answer.separator in tool.name:
            raise CatalogError("catalog_invalid",
                               f"tool {i} {tool.name!r} contains the answer separator "
                               f"{answer.separator!r}; expected names without it",
                               index=i, name=tool.name, separator=answer.separator)
    tool_format = doc.get("tool_format", DEFAULT_TOOL_FORMAT)
    template = render_template(doc.get("prompt_template", DEFAULT_PROMPT_TEMPLATE), tools, tool_format)
    return Catalog(tools=tools, answer=answer, prompt_template=template, tool_format=tool_format)


def render_tools(tools: tuple[Tool, ...], tool_format: str = DEFAULT_TOOL_FORMAT) -> str:
    """The ``{tools}`` text: one ``tool_format`` line per tool, catalog order, joined by newlines."""
    def line(tool: Tool) -> str:
        fields = {"name": tool.name, "description": tool.description or ""}
        return _TOOL_FIELD.sub(lambda m: fields[m.group(1)], tool_format).rstrip()
    return "\n".join(line(t) for t in tools)


def render_template(template: str, tools: tuple[Tool, ...], tool_format: str = DEFAULT_TOOL_FORMAT) -> str:
    """The template a bundle stores: ``{tools}`` (if present) replaced by ``render_tools``; ``{request}``
    left in place, exactly once (CatalogError("template_invalid") if a tool's text would add another)."""
    _check_placeholders(template, tool_format)
    if TOOLS_PLACEHOLDER not in template:
        return template
    for i, tool in enumerate(tools):
        for what, text in (("name", tool.name), ("description", tool.description or "")):
            if REQUEST_PLACEHOLDER in text:
                raise CatalogError("template_invalid", f"tool {i} {tool.name!r}: its {what} holds "
                                   f"{REQUEST_PLACEHOLDER}, which would put a second request slot into the "
                                   "prompt; reword it", index=i, name=tool.name, field=what)
    before, after = template.split(TOOLS_PLACEHOLDER)
    return before + render_tools(tools, tool_format) + after


def _check_placeholders(template: str, tool_format: str) -> None:
    requests, tools = template.count(REQUEST_PLACEHOLDER), template.count(TOOLS_PLACEHOLDER)
    if requests != 1:
        raise CatalogError("template_invalid", f"prompt_template holds {REQUEST_PLACEHOLDER} {requests} times, "
                           f"expected exactly once (where the request text goes); found in {template[:80]!r}...",
                           placeholder=REQUEST_PLACEHOLDER, expected=1, found=requests)
    if tools > 1:
        raise CatalogError("template_invalid", f"prompt_template holds {TOOLS_PLACEHOLDER} {tools} times, expected "
                           "at most once (where the tool list goes)", placeholder=TOOLS_PLACEHOLDER,
                           expected="0 or 1", found=tools)
    if "{name}" not in tool_format:
        raise CatalogError("template_invalid", f"tool_format {tool_format!r} has no {{name}}; expected a line "
                           "format like '- {name}: {description}'", tool_format=tool_format)


def _check_template_text(doc: Mapping) -> None:
    """Typed template errors before the schema's generic ones (the schema states the same rules)."""
    template, tool_format = doc.get("prompt_template"), doc.get("tool_format", DEFAULT_TOOL_FORMAT)
    if isinstance(template, str) and isinstance(tool_format, str):
        _check_placeholders(template, tool_format)


def tokenize_catalog(catalog: Catalog, tokenizer: tokenizers.Tokenizer,
                     end_token_id: int) -> TokenizedCatalog:
    """Token path of every tool (standalone encoding, no special tokens added) and the SEP id.

    Checks: the separator is exactly one token and not END; each path is non-empty, within
    the vocabulary, free of SEP and END, and distinct from every other tool's path.
    """
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if not 0 <= end_token_id < vocab:
        raise BuildError("build_failed",
                         f"END token id {end_token_id} is outside the tokenizer's vocabulary "
                         f"[0, {vocab}); check the checkpoint's eos_token_id",
                         end_token_id=end_token_id, vocab_size=vocab)
    sep = catalog.answer.separator
    sep_ids = tokenizer.encode(sep, add_special_tokens=False).ids
    if len(sep_ids) != 1:
        raise CatalogError("catalog_invalid",
                           f"separator {sep!r} tokenizes to {len(sep_ids)} tokens {sep_ids}, "
                           "expected exactly 1; choose a separator that is one token",
                           separator=sep, token_ids=sep_ids)
    sep_id = sep_ids[0]
    if sep_id == end_token_id:
        raise CatalogError("catalog_invalid",
                           f"separator {sep!r} is token {sep_id}, the END token itself; "
                           "choose another separator", separator=sep, token_id=sep_id)

    paths: list[tuple[int, ...]] = []
    owner: dict[tuple[int, ...], int] = {}
    for i, tool in enumerate(catalog.tools):
        if tool.token_ids is not None:
            path = tool.token_ids
            bad = [t for t in path if not 0 <= t < vocab]
            if bad:
                raise CatalogError("catalog_invalid",
                                   f"tool {i} {tool.name!r}: token_ids {bad} outside the vocabulary "
                                   f"[0, {vocab}); fix or drop token_ids",
                                   index=i, name=tool.name, token_ids=bad, vocab_size=vocab)
        else:
            path = tuple(tokenizer.encode(tool.name, add_special_tokens=False).ids)
        if not path:
            raise CatalogError("catalog_invalid",
                               f"tool {i} {tool.name!r} tokenizes to no tokens; expected at least "
                               "one: rename the tool or give token_ids", index=i, name=tool.name)
        for what, special in (("separator", sep_id), ("END", end_token_id)):
            if special in path:
                raise CatalogError("catalog_invalid",
                                   f"tool {i} {tool.name!r}: its token path {list(path)} contains the "
                                   f"{what} token {special} at position {path.index(special)}; "
                                   "rename the tool so the answer stays unambiguous",
                                   index=i, name=tool.name, token_id=special,
                                   position=path.index(special))
        if path in owner:
            j = owner[path]
            raise CatalogError("catalog_invalid",
                               f"tool {i} {tool.name!r} has the same token path {list(path)} as tool "
                               f"{j} {catalog.tools[j].name!r}; expected distinct paths",
                               index=i, name=tool.name, other_index=j)
        owner[path] = i
        paths.append(path)
    return TokenizedCatalog(catalog=catalog, paths=tuple(paths), sep_token_id=sep_id,
                            end_token_id=end_token_id)


def _read_document(path: str | os.PathLike) -> object:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CatalogError("catalog_invalid", f"{path}: catalog file not found; expected a JSON "
                           "file per schemas/catalog.schema.json", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogError("catalog_invalid", f"{path}: cannot read catalog ({e}); expected a "
                           "UTF-8 JSON file", file=str(path)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CatalogError("catalog_invalid", f"{path}: not valid JSON at line {e.lineno} column "
                           f"{e.colno} ({e.msg}); fix the file", file=str(path), line=e.lineno,
                           column=e.colno) from None
    except RecursionError:
        raise CatalogError("catalog_invalid", f"{path}: JSON nested too deeply; expected a catalog object "
                           "per schemas/catalog.schema.json", file=str(path)) from None


def _check_schema(doc: Mapping) -> None:
    validator = jsonschema.Draft202012Validator(load_schema("catalog"))
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is None:
        return
    where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
    details: dict = {"path": where}
    prefix = "catalog"
    path = list(error.absolute_path)
    if len(path) >= 2 and path[0] == "tools" and isinstance(path[1], int):
        index = path[1]
        tool = doc["tools"][index]
        name = tool.get("name") if isinstance(tool, Mapping) else None
        details.update(index=index, name=name if isinstance(name, str) else None)
        prefix = f"tool {index} {name!r}" if isinstance(name, str) else f"tool {index}"
    raise CatalogError("catalog_invalid",
                       f"{prefix}: {error.message} at {where}; expected a catalog valid against "
                       "schemas/catalog.schema.json", **details)
