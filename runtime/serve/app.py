"""The HTTP routes: discovery, OpenAI-compatible chat completions (runtime/serve/chat.py), models, contract,
health, metrics, and the API's own documentation.

Request bodies are JSON (Content-Type application/json), read as bytes: invalid UTF-8, bad JSON, lone
surrogates, wrong types and unknown fields are each a 400 ``request_invalid`` naming what and where
(runtime/serve/body.py). /openapi.json states every constraint a JSON Schema can express; the routes'
documented responses list the rest. /docs renders from assets this server serves itself (the
fastapi-offline package's Swagger UI): no network needed.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import threading
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from toolcall.common.errors import RequestError
from toolcall.runtime.batching.sampling import Sampling
from toolcall.runtime.bundle.files import CONTRACT_FILE
from toolcall.runtime.serve import chat
from toolcall.runtime.serve import schemas as S
from toolcall.runtime.serve.body import BodyError, parse_body
from toolcall.runtime.serve.http_errors import JSON, GuardMiddleware, http_exception_handler, typed_response
from toolcall.runtime.serve.metrics import CONTENT_TYPE_LATEST
from toolcall.runtime.serve.state import ServeState

ERRORS = {400: "Invalid body or parameters (request_invalid: JSON, UTF-8, schema, unknown fields, controls out of "
               "the bundle's range; unknown_tool: a tool outside the catalog)",
          404: "Unknown model (not_found)",
          413: "Body too large, or a prompt longer than the bundle's max_input_tokens or than its KV pool "
               "(body_too_large, prompt_too_long, kv_pages)",
          415: "Content-Type is not application/json (unsupported_media_type)",
          429: "Waiting queue full (queue_full); see Retry-After",
          503: "Loading or draining (draining); see Retry-After",
          504: "Past the request's deadline (deadline_exceeded)"}
REQUEST_ERRORS = {code: {"model": S.ErrorBody, "description": text} for code, text in ERRORS.items()}
NOT_READY = {503: {"model": S.ErrorBody, "description": "Loading, draining or failed"}}
DOCS_ASSETS = "/docs/assets"
SSE = "text/event-stream"


def _json(body: dict, status: int = 200) -> Response:
    return Response(json.dumps(body).encode(), status, media_type=JSON)


def _body_schema(name: str) -> dict:
    return {"requestBody": {"required": True, "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{name}"}}}}}


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

    app = FastAPI(title="toolcall runtime", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="One contract-bound tool-discovery engine. Every error is "
                  '{"error": {"code", "message", "details"}} with the runtime\'s stable codes.', **_NO_TELEMETRY)

    def refuse(err: RequestError) -> Response:
        state.metrics.refused(err.code)
        return typed_response(err)

    def refuse_body(request, exc: BodyError) -> Response:
        state.metrics.refused(exc.code)
        return exc.response

    app.add_exception_handler(HTTPException, http_exception_handler)
    app.add_exception_handler(BodyError, refuse_body)
    app.add_exception_handler(RequestError, lambda request, exc: refuse(exc))
    app.add_middleware(GuardMiddleware, max_body_bytes=state.config.max_body_bytes, refused=state.metrics.refused)

    def served() -> tuple[str, ...]:
        """The names a request may use for the model: the served names and the bundle id."""
        if state.engine is None:
            raise state.not_admitting()
        return (*state.model_names, state.engine.contract.engine.bundle_id)

    def card(name: str) -> dict:
        c = state.engine.contract
        return {"id": name, "object": "model", "created": 0, "owned_by": "toolcall", "bundle_id": c.engine.bundle_id,
                "target": c.target.name, "precision": c.precision.weights, "device": state.engine.device,
                "tools": list(state.engine.grammar.tool_names), "max_input_tokens": c.limits.max_input_tokens,
                "max_output_tokens": c.limits.max_output_tokens,
                "request_tools": None if c.request_tools is None else {
                    "max_tools": c.request_tools.max_tools,
                    "max_description_tokens": c.request_tools.max_description_tokens}}

    @app.post("/v1/discover", response_model=None, responses={200: {"model": S.DiscoverResponse}, **REQUEST_ERRORS},
              openapi_extra=_body_schema("DiscoverRequest"))
    async def discover(request: Request):
        """Names the tools a request needs (the catalog's, or those it brings), in the model's order."""
        body = parse_body(S.DiscoverRequest, request, await request.body())
        tools = None if body.tools is None else [chat.tool_of(t) for t in body.tools]
        ticket, res = await state.answer(request, body.request, Sampling(body.temperature, body.top_p, body.seed),
                                         tools, body.timeout_s, max_tools=body.max_tools,
                                         require_tool=body.require_tool, max_output_tokens=body.max_output_tokens)
        total = ticket.finished - ticket.submitted
        return _json({"tools": res.tools, "token_ids": res.token_ids,
                      "prompt_token_ids": list(ticket.request.prompt_ids), "finish": res.finish,
                      "ttft_ms": 1e3 * (total - res.total_s + res.ttft_s), "total_ms": 1e3 * total})

    @app.post("/v1/chat/completions", response_model=None,
              responses={200: {"model": S.ChatCompletionResponse, "content": {SSE: {}}}, **REQUEST_ERRORS},
              openapi_extra=_body_schema("ChatCompletionRequest"))
    async def chat_completions(request: Request):
        """OpenAI-compatible: the last user message is the request; the answer is tool_calls (streamed as
        server-sent events with stream=true)."""
        body = parse_body(S.ChatCompletionRequest, request, await request.body())
        if body.model not in served():
            raise RequestError("not_found", f"model {body.model!r} is not served here; this server serves "
                               f"{', '.join(map(repr, state.model_names))}", model=body.model,
                               served=list(state.model_names))
        p = chat.plan(body, state.engine.contract.limits.max_output_tokens)
        result, prompt_tokens = None, 0
        if p.text is not None:
            ticket, result = await state.answer(request, p.text, p.sampling, p.tools, body.timeout_s, only=p.only,
                                                max_tools=p.max_tools, require_tool=p.require_tool,
                                                max_output_tokens=p.max_output_tokens)
            prompt_tokens = len(ticket.request.prompt_ids)
        elif state.phase != "ready":
            raise state.not_admitting()
        answer = chat.Answer.of(body.model, result, prompt_tokens)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(answer.events(usage), media_type=SSE, headers={"Cache-Control": "no-cache"})
        return _json(answer.completion())

    @app.get("/v1/models", response_model=S.ModelList, responses=NOT_READY)
    async def models():
        """The served model, under each of its served names."""
        served()
        return _json({"object": "list", "data": [card(name) for name in state.model_names]})

    @app.get("/v1/models/{model_id}", response_model=S.ModelCard,
             responses={404: {"model": S.ErrorBody, "description": "Unknown model (not_found)"}, **NOT_READY})
    async def model(model_id: str):
        """One served model by a served name or its bundle id."""
        if model_id not in served():
            raise RequestError("not_found", f"model {model_id!r} is not served here; this server serves "
                               f"{', '.join(map(repr, state.model_names))}", model=model_id,
                               served=list(state.model_names))
        return _json(card(model_id))

    @app.get("/v1/contract", responses={200: {"description": "contract.json, byte for byte"}, **NOT_READY})
    async def contract():
        """The bundle's contract.json as it is on disk."""
        if state.engine is None:
            raise state.not_admitting()
        return Response((state.engine.folder / CONTRACT_FILE).read_bytes(), media_type=JSON)

    def health_response(ok: bool) -> Response:
        if ok:
            return _json({"status": "ready", "device": state.engine.device})
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
        """Prometheus metrics (vLLM's names under the toolcall: prefix, labelled model_name)."""
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    assets = resources.files("fastapi_offline") / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(assets)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} API",
                                   swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
                                   swagger_ui_parameters={"validatorUrl": None})  # no badge from the internet

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

