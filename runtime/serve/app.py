"""The HTTP routes: discovery, OpenAI-compatible chat completions, models, contract, health, metrics.

Bodies are read as bytes and validated by pydantic straight from JSON (bad JSON, wrong
types and invalid UTF-8 are all a 400 ``request_invalid``); /openapi.json carries the
request schemas and every route's error responses.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from toolcall.common.errors import RequestError
from toolcall.runtime.batching.sampling import Sampling
from toolcall.runtime.bundle.files import CONTRACT_FILE
from toolcall.runtime.serve import schemas as S
from toolcall.runtime.serve.http_errors import (
    JSON,
    GuardMiddleware,
    http_exception_handler,
    typed_response,
    validation_response,
)
from toolcall.runtime.serve.metrics import CONTENT_TYPE_LATEST
from toolcall.runtime.serve.state import ServeState

ERRORS = {400: "Invalid body or parameters (request_invalid, unknown_tool)",
          413: "Body too large, or a prompt that can never fit (body_too_large, prompt_too_long, kv_pages)",
          429: "Waiting queue full (queue_full); see Retry-After",
          503: "Loading or draining (draining); see Retry-After",
          504: "Past the request's deadline (deadline_exceeded)"}
REQUEST_ERRORS = {code: {"model": S.ErrorBody, "description": text} for code, text in ERRORS.items()}
NOT_READY = {503: {"model": S.ErrorBody, "description": "Loading, draining or failed"}}


def _json(body: dict, status: int = 200) -> Response:
    return Response(json.dumps(body).encode(), status, media_type=JSON)


def _body_schema(name: str) -> dict:
    return {"requestBody": {"required": True, "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{name}"}}}}}


def _parse(model: type[BaseModel], body: bytes):
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise _Invalid(validation_response(e)) from None


class _Invalid(Exception):
    def __init__(self, response: Response):
        self.response = response


# FastAPI >= 0.16x instruments every request for OpenTelemetry unless told not to (it looks the providers
# up per request); this server exports Prometheus metrics only. Older FastAPI has no such argument.
_NO_TELEMETRY = ({"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}
                 if "telemetry" in inspect.signature(FastAPI).parameters else {})


def create_app(state: ServeState) -> FastAPI:
    """The FastAPI app over a ServeState; its lifespan loads the engine in the background
    (the port answers 503 on /health meanwhile) and closes it at shutdown."""

    @asynccontextmanager
    async def lifespan(app):
        if state.phase == "loading":
            state.loop_thread = threading.get_native_id()  # the event loop's (kernel_threads leaves its time out)
            app.state.loader = asyncio.get_running_loop().run_in_executor(None, state.load)
        yield
        await asyncio.get_running_loop().run_in_executor(None, state.close)

    app = FastAPI(title="toolcall runtime", version="1", lifespan=lifespan,
                  description="One contract-bound tool-discovery engine. Every error is "
                  '{"error": {"code", "message", "details"}} with the runtime\'s stable codes.', **_NO_TELEMETRY)
    app.add_exception_handler(HTTPException, http_exception_handler)
    app.add_exception_handler(_Invalid, lambda request, exc: exc.response)
    app.add_exception_handler(RequestError, lambda request, exc: typed_response(exc))
    app.add_middleware(GuardMiddleware, max_body_bytes=state.config.max_body_bytes)

    def model_id() -> str:
        return state.engine.folder.name

    def timings(ticket, res) -> tuple[float, float]:
        total = ticket.finished - ticket.submitted
        return 1e3 * (total - res.total_s + res.ttft_s), 1e3 * total

    @app.post("/v1/discover", response_model=None, responses={200: {"model": S.DiscoverResponse}, **REQUEST_ERRORS},
              openapi_extra=_body_schema("DiscoverRequest"))
    async def discover(request: Request):
        """Names the catalog tools a request needs, in the model's order."""
        body = _parse(S.DiscoverRequest, await request.body())
        ticket, res = await state.answer(request, body.request, Sampling(body.temperature, body.top_p, body.seed),
                                         body.tools, body.timeout_s)
        ttft, total = timings(ticket, res)
        return _json({"tools": res.tools, "token_ids": res.token_ids,
                      "prompt_token_ids": list(ticket.request.prompt_ids), "finish": res.finish,
                      "ttft_ms": ttft, "total_ms": total})

    @app.post("/v1/chat/completions", response_model=None,
              responses={200: {"model": S.ChatCompletionResponse}, 404: {"model": S.ErrorBody,
                         "description": "Unknown model (not_found)"}, **REQUEST_ERRORS},
              openapi_extra=_body_schema("ChatCompletionRequest"))
    async def chat_completions(request: Request):
        """OpenAI-compatible: the last user message is the request; the answer is tool_calls."""
        body = _parse(S.ChatCompletionRequest, await request.body())
        if state.engine is None:
            raise state.not_admitting()
        if body.model not in (model_id(), state.engine.contract.engine.bundle_id):
            raise RequestError("not_found", f"model {body.model!r} is not served here; this server serves "
                               f"{model_id()!r}", model=body.model, served=model_id())
        if body.stream:
            raise RequestError("request_invalid", "streaming is not supported; send stream=false", stream=True)
        text = _last_user_text(body.messages)
        tools = None if body.tools is None else [t.function.name for t in body.tools]
        sampling = Sampling(body.temperature or 0.0, body.top_p if body.top_p is not None else 1.0, body.seed or 0)
        ticket, res = await state.answer(request, text, sampling, tools, body.timeout_s)
        calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                  "function": {"name": name, "arguments": "{}"}} for name in res.tools]
        finish = "length" if res.finish == "length" else "tool_calls" if calls else "stop"
        prompt, completion = len(ticket.request.prompt_ids), len(res.token_ids)
        return _json({"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                      "model": model_id(),
                      "choices": [{"index": 0, "finish_reason": finish, "logprobs": None,
                                   "message": {"role": "assistant", "content": None, "tool_calls": calls}}],
                      "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                "total_tokens": prompt + completion}})

    @app.get("/v1/models", response_model=S.ModelList, responses=NOT_READY)
    async def models():
        """The served bundle."""
        if state.engine is None:
            raise state.not_admitting()
        c = state.engine.contract
        return _json({"object": "list", "data": [{
            "id": model_id(), "object": "model", "created": 0, "owned_by": "toolcall",
            "bundle_id": c.engine.bundle_id, "target": c.target.name, "precision": c.precision.weights,
            "tools": list(state.engine.grammar.tool_names), "max_input_tokens": c.limits.max_input_tokens,
            "max_output_tokens": c.limits.max_output_tokens}]})

    @app.get("/v1/contract", responses={200: {"description": "contract.json, byte for byte"}, **NOT_READY})
    async def contract():
        """The bundle's contract.json as it is on disk."""
        if state.engine is None:
            raise state.not_admitting()
        return Response((state.engine.folder / CONTRACT_FILE).read_bytes(), media_type=JSON)

    def health_response(ok: bool) -> Response:
        if ok:
            return _json({"status": "ready"})
        err = state.not_admitting()
        status = "failed" if state.phase == "failed" else state.phase if state.phase != "ready" else "stale"
        return typed_response(RequestError(err.code, err.message if status != "stale" else
                                           "the engine loop has not beaten recently", phase=status, retry_after_s=1))

    @app.get("/health", response_model=S.Health, responses=NOT_READY)
    async def health():
        """200 when bound and the engine loop beats; 503 while loading or draining."""
        return health_response(state.ready())

    @app.get("/health/ready", response_model=S.Health, responses=NOT_READY)
    async def health_ready():
        """Readiness: the same rule as /health (the engine loop's heartbeat, not a probe request)."""
        return health_response(state.ready())

    @app.get("/health/live", response_model=S.Health, responses=NOT_READY)
    async def health_live():
        """Liveness: the process answers and the engine loop, once started, still beats."""
        thread = state.engine_thread
        if state.phase == "failed" or (thread is not None and not thread.alive(state.config.stale_s)):
            return health_response(False)
        return _json({"status": "alive"})

    @app.get("/metrics", responses={200: {"description": "Prometheus text format", "content": {"text/plain": {}}}})
    async def metrics():
        """Prometheus metrics (vLLM's names under the toolcall: prefix)."""
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def openapi():
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            _, defs = models_json_schema([(S.DiscoverRequest, "validation"), (S.ChatCompletionRequest, "validation")],
                                         ref_template="#/components/schemas/{model}")
            spec.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi
    return app


def _last_user_text(messages: list[S.ChatMessage]) -> str:
    for m in reversed(messages):
        if m.role == "user":
            if isinstance(m.content, str):
                return m.content
            if m.content:
                return "".join(p.get("text", "") for p in m.content if p.get("type") == "text")
    raise RequestError("request_invalid", "messages hold no user message with text; the last user message is "
                       "the request", roles=[m.role for m in messages][:16])
