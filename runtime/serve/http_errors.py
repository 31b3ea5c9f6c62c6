"""Error bodies and status codes: every error is {"error": {"code", "message", "details"}}.

The outermost ASGI middleware (``GuardMiddleware``) bounds the body size (413 before the
body is read when Content-Length says so, else as it streams in) and turns any exception a
route lets through into a typed 500 with one log line: no traceback reaches a response
or the log.
"""
from __future__ import annotations

import json
import logging

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from toolcall.common.errors import EngineError

log = logging.getLogger("toolcall.runtime.serve")

# code -> HTTP status (codes not listed: 400 if a request's fault, else 500; see status_for)
STATUS = {"request_invalid": 400, "unknown_tool": 400, "request_tools_too_large": 400, "usage": 400,
          "prompt_too_long": 413, "kv_pages": 413, "body_too_large": 413, "queue_full": 429, "too_many_sequences": 429,
          "draining": 503, "device_failed": 503, "deadline_exceeded": 504, "not_found": 404, "method_not_allowed": 405,
          "unsupported_media_type": 415, "request_aborted": 499}
JSON = "application/json"


def status_for(err: EngineError) -> int:
    return STATUS.get(err.code, 500)


def error_response(code: str, message: str, status: int, headers: dict | None = None, **details) -> Response:
    body = {"error": {"code": code, "message": message, "details": details}}
    return Response(json.dumps(body).encode(), status, headers=headers, media_type=JSON)


def typed_response(err: EngineError) -> Response:
    headers = None
    if err.code in ("queue_full", "too_many_sequences", "draining", "device_failed"):
        headers = {"Retry-After": str(err.details.get("retry_after_s", 1))}
    return error_response(err.code, err.message, status_for(err), headers, **err.details)


def validation_response(err: ValidationError) -> Response:
    """400 listing each invalid field (location, problem); never echoes more than 100 chars of input."""
    problems = [{"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]} for e in err.errors()[:16]]
    where = "; ".join(f"{'.'.join(p['loc']) or 'body'}: {p['msg']}" for p in problems[:4])
    return error_response("request_invalid", f"the request body is not valid: {where}; see /openapi.json",
                          400, problems=problems)


async def http_exception_handler(request: Request, exc: HTTPException) -> Response:
    """Starlette's own 404/405/400s in the typed body (a 405 keeps its Allow header)."""
    path = request.url.path
    if exc.status_code == 404:
        return error_response("not_found", f"no such endpoint: {path}; see /docs", 404, path=path,
                              method=request.method)
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        return error_response("method_not_allowed", f"method {request.method} is not allowed on {path}; allowed: "
                              f"{allow or 'none'}", 405, headers={"Allow": allow}, path=path, method=request.method,
                              allowed=[m.strip() for m in allow.split(",") if m.strip()])
    code = "request_invalid" if exc.status_code < 500 else "internal"
    return error_response(code, str(exc.detail), exc.status_code)


class _BodyTooLarge(Exception):
    pass


class GuardMiddleware:
    """Pure ASGI: a byte limit on request bodies, and no exception past this point."""

    def __init__(self, app, max_body_bytes: int, refused=lambda code: None):
        self.app, self.max_body_bytes, self.refused = app, max_body_bytes, refused  # refused(code): counts one

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.max_body_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > limit:
                    return await self._send(send, self._too_large(declared))
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _BodyTooLarge()
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._send(send, self._too_large(seen))
        except Exception as e:  # a bug: typed 500, one line in the log, no traceback anywhere
            log.error("internal error on %s %s: %s: %s", scope.get("method"), scope.get("path"), type(e).__name__, e)
            if not started:
                self.refused("internal")
                await self._send(send, error_response("internal", f"internal error ({type(e).__name__}); "
                                                      "this is a bug, report it", 500, exception=type(e).__name__))

    def _too_large(self, got: int) -> Response:
        self.refused("body_too_large")
        return error_response("body_too_large", f"the request body has {got} bytes or more; this server accepts "
                              f"at most {self.max_body_bytes}", 413, limit=self.max_body_bytes, got=got)

    @staticmethod
    async def _send(send, response: Response) -> None:
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})
