"""Ollama's wire conventions shared by every route: model names, ``keep_alive``, errors,
NDJSON lines and timestamps."""

from __future__ import annotations

import json
import math
import re
import time
from datetime import UTC, datetime
from typing import Any

from mlxrt.errors import InvalidRequest

__all__ = ["ollama_name", "pool_name", "keep_alive_seconds", "error_body", "ROUTE_OPT", "ndjson", "created_at",
           "NDJSON", "VERSION", "nanos"]

#: The Ollama version ``GET /api/version`` reports: clients gate features on it (tools, ``think``,
#: ``/api/embed``), and mlxrt serves the API those versions have.
VERSION = "0.12.0"
#: The media type of Ollama's streams: one JSON object per line.
NDJSON = "application/x-ndjson"
#: Ollama's implicit tag: ``smollm2`` and ``smollm2:latest`` name one model.
LATEST = ":latest"
#: ``keep_alive`` past this many seconds (a century) is forever.
FOREVER = 100 * 365 * 86400.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def ollama_name(model_id: str) -> str:
    """A model id as Ollama clients list and send it: ``name:tag`` (``:latest`` unless it has a tag)."""
    tail = model_id.rsplit("/", 1)[-1]
    return model_id if ":" in tail else model_id + LATEST


def pool_name(name: Any) -> str | None:
    """A request's model name as the model pool resolves it: ``:latest`` and Ollama's Hugging
    Face prefix (``hf.co/ORG/NAME``) dropped (``None``: the served model). Any other tag stays,
    so a name nothing serves is reported as a fallback."""
    if not isinstance(name, str) or not name:
        return None
    text: str = name[: -len(LATEST)] if name.endswith(LATEST) else name
    for prefix in ("hf.co/", "huggingface.co/"):
        if text.startswith(prefix) and text.count("/") == 2:
            return text[len(prefix):]
    return text


def keep_alive_seconds(value: Any) -> float | None:
    """``keep_alive``: seconds as a number, or a Go duration (``"5m"``, ``"1h30m"``, ``"-1"``,
    ``"0"``); negative (or past a century) keeps the model resident for good. ``None``: not given."""
    if value is None:
        return None
    seconds = _seconds(value)
    if seconds is None:
        raise InvalidRequest(f"keep_alive: {json.dumps(value)} is not a duration (seconds, or e.g. \"5m\", "
                             "\"1h\", \"-1\")", param="keep_alive")
    return -1.0 if seconds > FOREVER or math.isinf(seconds) else seconds


def _seconds(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if abs(value) < FOREVER else (math.inf if value > 0 else -math.inf)
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        seconds = float(text)  # "1e999" is inf, a number past FOREVER
        return None if math.isnan(seconds) else seconds
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    parts = _DURATION.findall(body)
    if parts and "".join(n + u for n, u in parts) == body:
        return sign * sum(float(n) * _UNITS[u] for n, u in parts)
    return None


def error_body(status: int, type_: str, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    """Ollama's error body: ``{"error": "..."}`` (the status carries the kind)."""
    return {"error": message}


#: Route options every Ollama handler carries: errors render in Ollama's shape.
ROUTE_OPT = {"dialect": "ollama", "render_error": error_body}


def ndjson(obj: Any) -> bytes:
    """One NDJSON line."""
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def created_at(at: float | None = None) -> str:
    """RFC 3339 in UTC with a ``Z``, as Ollama writes ``created_at`` and ``modified_at``."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def nanos(seconds: float) -> int:
    return int(round(seconds * 1e9))
