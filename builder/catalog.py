"""Tool catalog: loading, schema and semantic validation, and tokenization of tool names.

A catalog (``schemas/catalog.schema.json``) lists the tools a model may name and the answer
format ``tool (SEP tool)* END``. ``load_catalog`` checks everything that needs no tokenizer;
``tokenize_catalog`` checks the rest against the checkpoint's tokenizer and yields each tool's
token path, the input of the trie builder.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import tokenizers

from toolcall.common.errors import CatalogError
from toolcall.runtime.grammar.build import check_names, separator_token, tool_paths
from toolcall.runtime.grammar.tool_text import (  # noqa: F401  (re-exported: the catalog's text rules)
    DEFAULT_PROMPT_TEMPLATE,
    DEFAULT_TOOL_FORMAT,
    REQUEST_PLACEHOLDER,
    TOOLS_PLACEHOLDER,
    Tool,
    check_placeholders,
    render_template,
    render_tools,
)
from toolcall.schemas.load import load_schema

# Largest catalog: 256 words of 64 bits per edge bitset. The grammar's bitset bytes grow as
# tools x edges (both ~linear in the catalog), so 16,384 tools is ~100 MB of bitsets at ~3
# edges per tool; a larger catalog would need a sparse layout the kernels do not read.
MAX_CATALOG_TOOLS = 16_384
DEFAULT_SEPARATOR = "\n"
DEFAULT_MAX_TOOLS = 4


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
    template: str = DEFAULT_PROMPT_TEMPLATE  # as written: {tools} (if any) and {request} in place

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
    check_names(tools, answer.separator)
    tool_format = doc.get("tool_format", DEFAULT_TOOL_FORMAT)
    template = doc.get("prompt_template", DEFAULT_PROMPT_TEMPLATE)
    return Catalog(tools=tools, answer=answer, prompt_template=render_template(template, tools, tool_format),
                   tool_format=tool_format, template=template)


def _check_template_text(doc: Mapping) -> None:
    """Typed template errors before the schema's generic ones (the schema states the same rules)."""
    template, tool_format = doc.get("prompt_template"), doc.get("tool_format", DEFAULT_TOOL_FORMAT)
    if isinstance(template, str) and isinstance(tool_format, str):
        check_placeholders(template, tool_format)


def tokenize_catalog(catalog: Catalog, tokenizer: tokenizers.Tokenizer,
                     end_token_id: int) -> TokenizedCatalog:
    """Token path of every tool (standalone encoding, no special tokens added) and the SEP id.

    Checks: the separator is exactly one token and not END; each path is non-empty, within
    the vocabulary, free of SEP and END, and distinct from every other tool's path.
    """
    sep_id = separator_token(tokenizer, catalog.answer.separator, end_token_id)
    return TokenizedCatalog(catalog=catalog, paths=tool_paths(catalog.tools, tokenizer, sep_id, end_token_id),
                            sep_token_id=sep_id, end_token_id=end_token_id)


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
