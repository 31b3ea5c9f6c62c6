"""Request and response bodies of the HTTP API (pydantic models; /openapi.json is built from them)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid")
_LENIENT = ConfigDict(extra="ignore")  # OpenAI clients send fields this server has no use for


class SamplingFields(BaseModel):
    temperature: float = Field(0.0, ge=0.0, description="0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = Field(0, description="Sampling seed: same seed, same answer.")
    timeout_s: float | None = Field(None, gt=0.0, description="Deadline in seconds (default: the server's); "
                                    "past it the request is dropped and answered 504.")


class DiscoverRequest(SamplingFields):
    model_config = _STRICT
    request: str = Field(..., description="The caller's request text.")
    tools: list[str] | None = Field(None, description="Catalog names the answer may name (default: all).")


class DiscoverResponse(BaseModel):
    tools: list[str] = Field(..., description="Tool names in the order the model names them.")
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish: Literal["done", "length"] = Field(..., description="done: END taken; length: output limit reached.")
    ttft_ms: float = Field(..., description="Arrival to first output token, queue included.")
    total_ms: float = Field(..., description="Arrival to the last output token.")


class ErrorDetail(BaseModel):
    code: str = Field(..., description="Stable error code (common/errors.py).")
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorBody(BaseModel):
    error: ErrorDetail


class ChatMessage(BaseModel):
    model_config = _LENIENT
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatFunction(BaseModel):
    model_config = _LENIENT
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatTool(BaseModel):
    model_config = _LENIENT
    type: Literal["function"] = "function"
    function: ChatFunction


class ChatCompletionRequest(BaseModel):
    model_config = _LENIENT
    model: str = Field(..., description="The served model's id (GET /v1/models) or its bundle_id.")
    messages: list[ChatMessage] = Field(..., min_length=1, description="The last user message is the request.")
    tools: list[ChatTool] | None = Field(None, description="Restricts the answer to these function names.")
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = Field(1, ge=1, le=1, description="One choice only.")
    stream: bool = Field(False, description="Streaming is not supported: false only.")
    timeout_s: float | None = Field(None, gt=0.0)


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
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "toolcall"
    bundle_id: str
    target: str
    precision: str
    tools: list[str]
    max_input_tokens: int
    max_output_tokens: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["loading", "ready", "draining", "failed", "alive"]
