"""Error rendering at the HTTP edge: typed errors become the route's dialect's error body.

A route handler tags itself with ``opt={"dialect": name, "render_error": fn}``; ``fn(status,
type, message, param, code) -> dict`` builds the body. Routes without one (and unknown
paths) answer in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``. An
optional ``opt["error_message"]``, ``fn(exc) -> str``, words a typed error in the dialect's
own text where it differs (Anthropic's ``prompt is too long: …``). An
error with a ``retry_after`` (seconds; :class:`mlxrt.errors.QueueFull`) adds ``Retry-After``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, NotFoundException

from mlxrt.errors import MlxrtError

__all__ = ["openai_error_body", "exception_handlers", "ErrorRenderer"]

log = logging.getLogger("mlxrt.api")

ErrorRenderer = Callable[[int, str, str, str | None, str | None], dict[str, Any]]

_HTTP_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def openai_error_body(status: int, type_: str, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _opt(request: Request[Any, Any, Any]) -> Mapping[str, Any]:
    try:
        return request.route_handler.opt
    except Exception:  # no route matched (404/405 raised by the router)
        return {}


def _renderer(request: Request[Any, Any, Any]) -> ErrorRenderer:
    return _opt(request).get("render_error") or openai_error_body


def _respond(request: Request[Any, Any, Any], status: int, type_: str, message: str,
             param: str | None = None, code: str | None = None,
             headers: dict[str, str] | None = None) -> Response[Any]:
    body = _renderer(request)(status, type_, message, param, code)
    return Response(content=body, status_code=status, media_type="application/json", headers=headers)


def _mlxrt_error(request: Request[Any, Any, Any], exc: MlxrtError) -> Response[Any]:
    if exc.status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc.message)
    # Back-pressure (QueueFull) says when to come back; clients (the openai SDK) honour it.
    retry_after = getattr(exc, "retry_after", None)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    word = _opt(request).get("error_message")
    message = word(exc) if word is not None else exc.message
    return _respond(request, exc.status, exc.type, message, exc.param, exc.code, headers=headers)


#: Litestar's text when the client left (or the server closed it: a body deadline, the
#: connection cap) before the request body was read.
_LEFT_MID_BODY = "client disconnected prematurely"


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    if status == 500 and exc.detail == _LEFT_MID_BODY:
        # Nobody reads this answer; counted and logged as the client's departure, not a failure.
        from mlxrt.api.disconnect import ClientDisconnected

        return _mlxrt_error(request, ClientDisconnected("the connection closed before the request body arrived"))
    if isinstance(exc, NotFoundException) or status == 404:
        message = "not found"
    else:
        message = exc.detail or "error"
    return _respond(request, status, _HTTP_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
                    message, headers=dict(exc.headers or {}))


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _respond(request, 500, "server_error", f"internal error: {type(exc).__name__}: {exc}")


def exception_handlers() -> dict[Any, Callable[[Request[Any, Any, Any], Any], Response[Any]]]:
    return {MlxrtError: _mlxrt_error, HTTPException: _http_error, Exception: _unexpected}
