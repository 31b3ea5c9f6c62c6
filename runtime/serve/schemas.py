"""Request and response bodies of the HTTP API (pydantic models; /openapi.json is built from them).

Every constraint a JSON Schema can state and the server enforces is stated here (lengths, roles, bounds,
non-empty lists); what it cannot (token counts, queue state, catalog names) is listed in the routes'
documented error responses (runtime/serve/app.py). Request bodies forbid unknown fields: a field the
server cannot honour is refused, naming it, rather than ignored.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# request bodies: JSON types as declared (no "0" for false or "3" for 3), unknown fields refused
_STRICT = ConfigDict(extra="forbid", strict=True)
_OPEN = ConfigDict(extra="allow", strict=True)  # OpenAI message and tool objects carry fields read no further

ToolName = Field(..., min_length=1, max_length=256)
MAX_TIMEOUT_S = 86_400.0  # a day: the longest deadline a request (timeout_s) or the server (--request-timeout) sets


class SamplingFields(BaseModel):
    model_config = _STRICT
    temperature: float = Field(0.0, ge=0.0, le=10_000.0, allow_inf_nan=False, description="0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False, description="Any value in (0, 1]; a tiny one "
                         "keeps only the most likely tool token (greedy).")
    seed: int = Field(0, ge=0, lt=2**63, description="Sampling seed: same seed, same answer.")
    timeout_s: float | None = Field(None, ge=0.1, le=MAX_TIMEOUT_S, allow_inf_nan=False, description="Deadline in "
                                    "seconds (default: the server's); past it the request is dropped and answered 504.")


class ChatFunction(BaseModel):
    model_config = _OPEN
    name: str = ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatTool(BaseModel):
    model_config = _OPEN
    type: Literal["function"] = "function"
    function: ChatFunction


class DiscoverRequest(SamplingFields):
    model_config = _STRICT
    request: str = Field(..., min_length=1, pattern=r"\S", description="The caller's request text (not blank).")
    tools: list[str | ChatTool] | None = Field(
        None, min_length=1, description="The tools the answer may name (default: the catalog's): catalog names, or "
        "OpenAI function tools with descriptions; a name outside the catalog makes the list the request's own tools "
        "(the prompt lists them; bundles whose template holds {tools}, GET /v1/models request_tools).")
    max_tools: int | None = Field(None, ge=1, description="The most tools the answer may name (default: the "
                                  "catalog's).")
    require_tool: bool = Field(False, description="The answer names at least one tool.")
    max_output_tokens: int | None = Field(None, ge=1, description="Caps the answer's tokens (default and most: "
                                          "the bundle's); a cut answer has finish \"length\".")


class DiscoverResponse(BaseModel):
    tools: list[str] = Field(..., description="Tool names in the order the model names them.")
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish: Literal["done", "length"] = Field(..., description="done: END taken; length: output limit reached.")
    ttft_ms: float = Field(..., description="Arrival to first output token.")
    total_ms: float = Field(..., description="Arrival to the last output token.")


class ErrorDetail(BaseModel):
    code: str = Field(..., description="Stable error code (common/errors.py).")
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorBody(BaseModel):
    error: ErrorDetail


class ChatMessage(BaseModel):
    model_config = _OPEN
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class NamedFunction(BaseModel):
    model_config = _STRICT
    name: str = ToolName


class NamedToolChoice(BaseModel):
    model_config = _OPEN
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class TextFormat(BaseModel):
    model_config = _STRICT
    type: Literal["text"] = "text"


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request, as far as a tool-discovery engine can honour it."""

    model_config = _STRICT
    model: str = Field(..., min_length=1, description="A served model name (GET /v1/models) or the bundle_id.")
    messages: list[ChatMessage] = Field(..., min_length=1, description="The last user message is the request; a "
                                        "conversation ending in a tool result or an assistant message is answered "
                                        "without tool calls.")
    tools: list[ChatTool] | None = Field(
        None, min_length=1, description="The functions the answer may call: catalog names restrict the answer to "
        "them; a name outside the catalog makes the list the request's own tools, named and described in the prompt "
        "(bundles whose template holds {tools}: GET /v1/models request_tools gives the limits).")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="none: no tool calls; auto (default): any; required: at least one; a named function: "
        "exactly that one.")
    parallel_tool_calls: bool | None = Field(None, description="false: at most one tool call.")
    max_completion_tokens: int | None = Field(None, ge=1, description="Caps the answer's tokens (the bundle's "
                                              "limit at most); a cut answer has finish_reason \"length\".")
    max_tokens: int | None = Field(None, ge=1, description="The older name of max_completion_tokens.")
    temperature: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False, description="As /v1/discover's.")
    seed: int | None = Field(None, ge=0, lt=2**63)
    n: int = Field(1, ge=1, le=1, description="One choice only.")
    stream: bool = Field(False, description="Server-sent events in OpenAI's chunk format.")
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256, description="The caller's id (recorded nowhere).")
    timeout_s: float | None = Field(None, ge=0.1, le=MAX_TIMEOUT_S, allow_inf_nan=False, description="As /v1/discover's.")
    # OpenAI fields with no effect on a tool-discovery answer: accepted at their neutral value only, so a
    # caller relying on another value is told, not ignored
    logprobs: Literal[False] | None = Field(None, description="Not available: false or absent.")
    top_logprobs: Literal[0] | None = Field(None, description="Not available: 0 or absent.")
    stop: list[str] | None = Field(None, max_length=0, description="Not available: the grammar ends answers.")
    presence_penalty: float | None = Field(None, ge=0.0, le=0.0, allow_inf_nan=False, description="Not available: 0 or absent.")
    frequency_penalty: float | None = Field(None, ge=0.0, le=0.0, allow_inf_nan=False, description="Not available: 0 or absent.")
    logit_bias: dict[str, float] | None = Field(None, max_length=0, description="Not available: empty or absent.")
    response_format: TextFormat | None = Field(None, description="text only: answers are tool calls.")
    store: Literal[False] | None = Field(None, description="Nothing is stored: false or absent.")


class ChatFunctionCall(BaseModel):
    name: str
    arguments: str = "{}"


class ChatToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class ChatAnswer(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ChatToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatAnswer
    finish_reason: Literal["tool_calls", "stop", "length"]
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str = Field(..., description="The model name the request sent.")
    choices: list[ChatChoice]
    usage: Usage


class RequestToolLimits(BaseModel):
    max_tools: int = Field(..., description="Most tools one request may bring.")
    max_description_tokens: int = Field(..., description="Most tokens of one tool's description.")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "toolcall"
    bundle_id: str
    target: str
    precision: str
    device: str = Field(..., description="native, or sim: the GPU bundle runs on the simulated device.")
    tools: list[str]
    max_input_tokens: int
    max_output_tokens: int
    request_tools: RequestToolLimits | None = Field(..., description="Limits on tools a request brings itself; "
                                                    "null: the bundle answers from its catalog only.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["loading", "ready", "draining", "failed", "alive"]
    device: str | None = Field(None, description="Where the engine runs when ready: native, or sim (the simulated "
                               "device: answers checked, not speed).")
