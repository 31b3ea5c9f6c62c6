"""The tool list as prompt text: a tool's name and description, the ``{tools}`` lines a template holds, and the
template checks. The builder renders a catalog's tools with it; the runtime a request's own tools
(runtime/grammar/request_tools.py), so both give the same text for the same tools.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from toolcall.common.errors import CatalogError

REQUEST_PLACEHOLDER = "{request}"
TOOLS_PLACEHOLDER = "{tools}"
DEFAULT_PROMPT_TEMPLATE = "<|im_start|>user\n{request}<|im_end|>\n<|im_start|>assistant\n"
# One line per tool, in list order, lines joined by "\n" (no trailing newline). In the line format,
# {name} is the tool's name and {description} its description (empty text when it has none); trailing
# whitespace of a line is dropped. No other braces are interpreted.
DEFAULT_TOOL_FORMAT = "- {name}: {description}"
_TOOL_FIELD = re.compile(r"\{(name|description)\}")


@dataclass(frozen=True)
class Tool:
    """One tool; ``token_ids`` set only when a catalog overrides the tokenizer for its name."""

    name: str
    description: str | None = None
    token_ids: tuple[int, ...] | None = None


def render_tools(tools: tuple[Tool, ...], tool_format: str = DEFAULT_TOOL_FORMAT) -> str:
    """The ``{tools}`` text: one ``tool_format`` line per tool, in order, joined by newlines."""
    def line(tool: Tool) -> str:
        fields = {"name": tool.name, "description": tool.description or ""}
        return _TOOL_FIELD.sub(lambda m: fields[m.group(1)], tool_format).rstrip()
    return "\n".join(line(t) for t in tools)


def render_template(template: str, tools: tuple[Tool, ...], tool_format: str = DEFAULT_TOOL_FORMAT) -> str:
    """The template with ``{tools}`` (if present) replaced by ``render_tools``; ``{request}`` left in place,
    exactly once (CatalogError("template_invalid") if a tool's text would add another)."""
    check_placeholders(template, tool_format)
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


def check_placeholders(template: str, tool_format: str) -> None:
    """CatalogError("template_invalid") unless ``template`` holds ``{request}`` once and ``{tools}`` at most
    once, and ``tool_format`` names the tool."""
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
