"""Server-sent events: frames and the streaming response that carries them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from litestar.response import Stream

__all__ = ["sse_data", "sse_event", "sse_response", "SSE_HEADERS"]

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse_data(obj: Any) -> bytes:
    """A ``data:`` frame; strings are sent bare (``data: [DONE]``), anything else as JSON."""
    payload = obj if isinstance(obj, str) else _dumps(obj)
    return f"data: {payload}\n\n".encode()


def sse_event(event: str, obj: Any) -> bytes:
    """An ``event:`` + ``data:`` frame, as Anthropic sends them."""
    return f"event: {event}\ndata: {_dumps(obj)}\n\n".encode()


def sse_response(frames: AsyncIterator[bytes], headers: dict[str, str] | None = None) -> Stream:
    return Stream(frames, media_type="text/event-stream", headers={**SSE_HEADERS, **(headers or {})},
                  status_code=200)
