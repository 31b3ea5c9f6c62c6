"""OpenAI chat completions over the tool grammar: a request's controls as answer rules, and the answer as a
completion or as server-sent event chunks.

Controls (``plan``): ``tool_choice`` none (no tool calls: answered without the model), auto, required (at
least one tool: the grammar forbids the empty answer), a named function (exactly that one);
``parallel_tool_calls`` false (at most one tool); ``max_completion_tokens`` / ``max_tokens`` cap the answer
(the bundle's limit at most; a cut answer finishes "length"). A conversation whose last message is a tool
result or an assistant message has been served: it is answered with no tool calls, finish "stop"; a new
user message after it is a new request.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from toolcall.common.errors import RequestError
from toolcall.runtime.batching.batcher import Result
from toolcall.runtime.batching.sampling import Sampling
from toolcall.runtime.grammar.tool_text import Tool
from toolcall.runtime.serve.schemas import ChatCompletionRequest, ChatMessage, ChatTool, NamedToolChoice

ANSWERED_ROLES = ("tool", "function", "assistant")  # a conversation ending here needs no further tool call


@dataclass(frozen=True)
class ChatPlan:
    """What a chat request asks of the engine; ``text`` None: answer with no tool calls, no model run."""

    text: str | None
    sampling: Sampling
    tools: list[Tool] | None = None  # the request's tools (catalog names, or its own with descriptions)
    only: list[str] | None = None  # a named tool_choice: the one tool the answer names
    max_tools: int | None = None
    require_tool: bool = False
    max_output_tokens: int | None = None


def plan(body: ChatCompletionRequest, max_output_tokens: int) -> ChatPlan:
    """The engine request of a validated chat body (``max_output_tokens``: the bundle's limit)."""
    sampling = Sampling(body.temperature or 0.0, body.top_p if body.top_p is not None else 1.0, body.seed or 0)
    if body.tool_choice == "none" or body.messages[-1].role in ANSWERED_ROLES:
        return ChatPlan(None, sampling)
    tools = None if body.tools is None else [tool_of(t) for t in body.tools]
    require, only = body.tool_choice == "required", None
    if isinstance(body.tool_choice, NamedToolChoice):
        name = body.tool_choice.function.name
        if tools is not None and name not in [t.name for t in tools]:
            raise RequestError("request_invalid", f"tool_choice names {name!r}, which is not among the request's "
                               "tools; name one of them or leave tools out", field="tool_choice", name=name)
        only, require = [name], True
    cap = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return ChatPlan(last_user_text(body.messages), sampling, tools, only,
                    1 if body.parallel_tool_calls is False else None, require,
                    None if cap is None else min(cap, max_output_tokens))


def tool_of(tool: ChatTool | str) -> Tool:
    """A request's tool: a catalog name, or an OpenAI function tool (its parameters are not read: answers call
    a tool by name, with no arguments)."""
    return Tool(tool) if isinstance(tool, str) else Tool(tool.function.name, tool.function.description)


def last_user_text(messages: list[ChatMessage]) -> str:
    for m in reversed(messages):
        if m.role == "user":
            if isinstance(m.content, str):
                return m.content
            if m.content:
                return "".join(str(p.get("text", "")) for p in m.content if p.get("type") == "text")
    raise RequestError("request_invalid", "messages hold no user message with text; the last user message is "
                       "the request", field="messages", roles=[m.role for m in messages][:16])


@dataclass(frozen=True)
class Answer:
    """A chat answer's parts, shared by the completion and its stream."""

    id: str
    created: int
    model: str
    tools: list[str]
    call_ids: list[str]
    finish: str  # tool_calls, stop or length
    prompt_tokens: int
    completion_tokens: int

    @classmethod
    def of(cls, model: str, result: Result | None, prompt_tokens: int) -> "Answer":
        tools = [] if result is None else result.tools
        finish = "length" if result is not None and result.finish == "length" else "tool_calls" if tools else "stop"
        return cls(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), model, list(tools),
                   [f"call_{uuid.uuid4().hex[:24]}" for _ in tools], finish, prompt_tokens,
                   0 if result is None else len(result.token_ids))

    @property
    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def completion(self) -> dict:
        calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}}
                 for i, n in zip(self.call_ids, self.tools)]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "finish_reason": self.finish, "logprobs": None,
                             "message": {"role": "assistant", "content": None, "tool_calls": calls}}],
                "usage": self.usage}

    def events(self, include_usage: bool) -> Iterator[bytes]:
        """The stream (OpenAI's chunk format): the role, each tool call (its name, then its arguments), the
        finish reason, the usage when asked for, then ``[DONE]``."""
        def chunk(delta: dict | None, finish: str | None = None, usage: dict | None = None) -> bytes:
            body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                                          "finish_reason": finish}]}
            if include_usage:
                body["usage"] = usage
            return b"data: " + json.dumps(body).encode() + b"\n\n"

        yield chunk({"role": "assistant", "content": None})
        for index, (call_id, name) in enumerate(zip(self.call_ids, self.tools)):
            yield chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                         "function": {"name": name, "arguments": ""}}]})
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": "{}"}}]})
        yield chunk({}, self.finish)
        if include_usage:
            yield chunk(None, usage=self.usage)
        yield b"data: [DONE]\n\n"
