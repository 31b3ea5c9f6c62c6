"""A request body read as the API promises: JSON (Content-Type application/json) in strict UTF-8, no lone
surrogate, valid against its model. Each failure is a ``BodyError`` whose response names what is wrong
and where (a byte offset, a line and column, a field path), never echoing more than 100 characters."""
from __future__ import annotations

import json

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from toolcall.runtime.serve.http_errors import error_response, validation_response

JSON_TYPES = ("application/json",)


class BodyError(Exception):
    """A body refused: ``code`` (request_invalid or unsupported_media_type) and the typed ``response``."""

    def __init__(self, code: str, response: Response):
        super().__init__(code)
        self.code, self.response = code, response


def _invalid(message: str, **details) -> BodyError:
    return BodyError("request_invalid", error_response("request_invalid", message, 400, **details))


def _surrogate_path(value, path: str = "body") -> str | None:
    """The path of the first string holding a lone surrogate (a \\uD800-\\uDFFF escape without its pair)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _surrogate_path(key) is not None:
            return f"{path} (a key)"
        found = _surrogate_path(item, f"{path}.{key}")
        if found is not None:
            return found
    return None


def parse_body(model: type[BaseModel], request: Request, raw: bytes):
    """``model`` validated from the request's body, or a BodyError."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media not in JSON_TYPES:
        raise BodyError("unsupported_media_type", error_response(
            "unsupported_media_type", f"the body must be JSON sent as Content-Type: application/json; got "
            f"{media or 'no Content-Type'!r}", 415, content_type=media[:100] or None))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _invalid(f"the body is not valid UTF-8: byte {e.start} (0x{raw[e.start]:02x}) starts no character; "
                       "send the JSON encoded as UTF-8", byte=e.start) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise _invalid(f"the body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}",
                       line=e.lineno, column=e.colno) from None
    where = _surrogate_path(value)
    if where is not None:
        raise _invalid(f"{where} holds a lone surrogate (a \\\\uD800-\\\\uDFFF escape without its pair): not a "
                       "character; send text as UTF-8 or a complete surrogate pair", field=where[:100])
    try:
        return model.model_validate(value)
    except ValidationError as e:
        raise BodyError("request_invalid", validation_response(e)) from None
