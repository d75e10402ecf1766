"""Request ids, access logs and request metrics, around every HTTP request.

:func:`observe` wraps the app's ASGI handler (outside routing, so 404s and CORS preflights
are seen too). Each request gets an id: the client's ``x-request-id`` when it sends a sane
one (up to 128 visible ASCII characters), else a fresh one; it is echoed in the response's
``x-request-id`` header, bound to :data:`REQUEST_ID` while the request runs (so every log
record emitted on its behalf carries it, see :class:`RequestIdFilter`), and logged with the
method, route, status and duration when the response ends; a 4xx or 5xx line also says why
(the error body's message), and each body field named in ``x-mlxrt-ignored`` is logged the
first time it is seen.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from mlxrt.api.connections import BODY_TIMED_OUT
from mlxrt.metrics import LATENCY_BUCKETS, Counter, Histogram

__all__ = ["REQUEST_ID", "HttpMetrics", "observe", "error_reason", "RequestIdFilter", "JsonFormatter", "TextFormatter",
           "escape_controls"]

access = logging.getLogger("mlxrt.access")

#: The id of the request being served in this context ("-" outside a request).
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("mlxrt_request_id", default="-")

_SANE_ID = re.compile(r"[\x21-\x7e]{1,128}")
#: C0 controls (newline, carriage return, ESC ...), DEL and C1 controls (0x9b is a CSI too).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class HttpMetrics:
    """What ``/metrics`` reports about HTTP traffic."""

    def __init__(self) -> None:
        self.requests = Counter("mlxrt_http_requests_total", "HTTP requests by method, route and status.",
                                ("method", "route", "status"))
        self.duration = Histogram("mlxrt_http_request_duration_seconds",
                                  "Time from request start to the end of its response.", LATENCY_BUCKETS)

    def families(self) -> list[Any]:
        return [self.requests.lines(), self.duration.lines()]


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if _SANE_ID.fullmatch(text) else None
    return None


#: Bytes of an error body kept to find its message (error bodies are small JSON objects).
ERROR_BODY_KEPT = 4096
#: Ignored field names remembered for the once-per-name log line (names are the client's:
#: past this many, new ones are no longer logged, so memory stays bounded).
IGNORED_NAMES_KEPT = 1024


def error_reason(body: bytes) -> str:
    """The message of an error body in any dialect's shape (``{"error": {"message"}}``, also
    Anthropic's), else its text, shortened to one line."""
    try:
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    text = message if isinstance(message, str) else body.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text if len(text) <= 500 else text[:500] + "…"


def observe(app: ASGIApp, metrics: HttpMetrics) -> ASGIApp:
    """``app`` with request ids, an access log line and request metrics per HTTP request."""
    seen_ignored: set[str] = set()  # per app: the once-per-field-name log of ignored fields

    def note_ignored(value: bytes) -> None:
        from mlxrt.api.wire import IGNORED_HEADER

        for name in value.decode("latin-1").split(" (and ")[0].split(", "):
            if name and name not in seen_ignored and len(seen_ignored) < IGNORED_NAMES_KEPT:
                seen_ignored.add(name)
                access.info("request field %r is not read by mlxrt (named in %s; logged once per name)",
                            name, IGNORED_HEADER)

    async def handler(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:  # a str enum: equal to the server's plain "http"
            await app(scope, receive, send)
            return
        request_id = _incoming_id(scope) or f"req-{uuid.uuid4().hex[:20]}"
        token = REQUEST_ID.set(request_id)
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500
        error_body = bytearray()
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", ()):
                    if name.lower() == b"x-mlxrt-ignored":
                        note_ignored(value)
                headers = [*message.get("headers", ()), (b"x-request-id", request_id.encode())]
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and status >= 400 and len(error_body) < ERROR_BODY_KEPT:
                error_body.extend(message.get("body", b"")[:ERROR_BODY_KEPT - len(error_body)])
            await send(message)

        try:
            await app(scope, receive, send_with_id)
        finally:
            took = time.perf_counter() - started
            if scope.get(BODY_TIMED_OUT):  # the client got the protocol's 408, whatever the app made of it
                status = 408
            # The route's template, not the raw path: unknown paths must not mint label values.
            route = scope.get("path_template") if scope.get("route_handler") is not None else "unmatched"
            metrics.requests.inc(scope["method"], str(route), str(status))
            metrics.duration.observe(took)
            fields = {"method": scope["method"], "path": scope["path"], "status": status,
                      "duration_ms": round(took * 1000, 1)}
            if status >= 400:  # the reason is in the body only: the log says it too
                reason = error_reason(bytes(error_body)) if error_body else "(no body)"
                access.info("%s %s %d %.1f ms: %s", scope["method"], scope["path"], status, took * 1000, reason,
                            extra={**fields, "reason": reason})
            else:
                access.info("%s %s %d %.1f ms", scope["method"], scope["path"], status, took * 1000, extra=fields)
            REQUEST_ID.reset(token)

    return handler


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` (the current request's, or "-") to every record it sees."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "request_id"}


def escape_controls(text: str) -> str:
    """``text`` with every control character written as ``\\xNN``: a request's path, headers or
    body quoted in a log line can then neither start a forged line nor send terminal escapes."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class TextFormatter(logging.Formatter):
    """The text log line, ``LEVEL logger [request id]: message``, with control characters in
    the message escaped (:func:`escape_controls`); a traceback still follows on its own lines."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s [%(request_id)s]: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id and any extras
    (``json.dumps`` escapes every control character)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)
