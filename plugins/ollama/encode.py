"""Encoding answers in Ollama's shapes: ``/api/chat`` messages, ``/api/generate`` responses,
their NDJSON streams, the closing object's ``done_reason`` and timings (nanoseconds)."""

from __future__ import annotations

import time
from typing import Any

from mlxrt.api.wire import tool_input
from mlxrt.errors import MlxrtError
from mlxrt.plugins.ollama.decode import OllamaWire
from mlxrt.plugins.ollama.wire import created_at, error_body, nanos, ndjson, ollama_name
from mlxrt.records import FinishEvent, FinishReason, ToolCall

__all__ = ["done_fields", "tool_calls", "chat_body", "generate_body", "ChatLines", "GenerateLines", "error_line"]


def error_line(exc: MlxrtError) -> bytes:
    """An error after the stream started: Ollama's clients raise on a line with ``error``."""
    return ndjson(error_body(exc.status, exc.type, exc.message, exc.param, exc.code))


def done_reason(reason: FinishReason) -> str:
    """``length`` when the limit cut the answer, else ``stop`` (Ollama's tool calls end with ``stop``)."""
    return "length" if reason is FinishReason.LENGTH else "stop"


def done_fields(wire: OllamaWire | None, finish: FinishEvent, reason: FinishReason) -> dict[str, Any]:
    """The closing object's fields: ``done_reason`` and the timings, in nanoseconds.
    ``prompt_eval_count`` is the whole prompt (cached tokens included), as clients read it as the
    context used; ``prompt_eval_duration`` and ``eval_duration`` are the engine's clock."""
    total = time.monotonic_ns() - wire.started if wire is not None else 0
    return {"done": True, "done_reason": done_reason(reason), "total_duration": total,
            "load_duration": wire.load_ns if wire is not None else 0,
            "prompt_eval_count": finish.prompt_tokens, "prompt_eval_duration": nanos(finish.prompt_seconds),
            "eval_count": finish.completion_tokens, "eval_duration": nanos(finish.decode_seconds)}


def tool_calls(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """Ollama's tool calls: ``arguments`` is an object."""
    return [{"id": call.id, "function": {"index": i, "name": call.name, "arguments": tool_input(call)}}
            for i, call in enumerate(calls)]


def _message(content: str, reasoning: str = "", calls: tuple[ToolCall, ...] = ()) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["thinking"] = reasoning
    if calls:
        message["tool_calls"] = tool_calls(calls)
    return message


def chat_body(*, model: str, content: str, reasoning: str, calls: tuple[ToolCall, ...], reason: FinishReason,
              finish: FinishEvent, wire: OllamaWire | None) -> dict[str, Any]:
    return {"model": ollama_name(model), "created_at": created_at(), "message": _message(content, reasoning, calls),
            **done_fields(wire, finish, reason)}


def generate_body(*, model: str, content: str, reasoning: str, reason: FinishReason, finish: FinishEvent,
                  wire: OllamaWire | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": ollama_name(model), "created_at": created_at(), "response": content}
    if reasoning:
        body["thinking"] = reasoning
    return {**body, **done_fields(wire, finish, reason)}


class ChatLines:
    """``/api/chat``'s stream (a :class:`~mlxrt.api.framing.FrameWriter`): a line per delta
    (``message.content`` / ``message.thinking``), the tool calls in a line of their own, then
    the closing line with ``done: true``."""

    def __init__(self, *, model: str, wire: OllamaWire | None) -> None:
        self.model, self.wire = ollama_name(model), wire

    def _line(self, message: dict[str, Any], **fields: Any) -> bytes:
        return ndjson({"model": self.model, "created_at": created_at(), "message": message, "done": False, **fields})

    def start(self) -> list[bytes]:
        return []

    def feed(self, *, reasoning: str = "", text: str = "") -> list[bytes]:
        if not reasoning and not text:
            return []
        return [self._line(_message(text, reasoning))]

    def finish(self, calls: tuple[ToolCall, ...], reason: FinishReason, finish: FinishEvent) -> list[bytes]:
        lines = [self._line(_message("", "", calls))] if calls else []
        return [*lines, self._line(_message(""), **done_fields(self.wire, finish, reason))]


class GenerateLines:
    """``/api/generate``'s stream: a line per delta (``response`` / ``thinking``), then the closing line."""

    def __init__(self, *, model: str, wire: OllamaWire | None) -> None:
        self.model, self.wire = ollama_name(model), wire

    def _line(self, **fields: Any) -> bytes:
        return ndjson({"model": self.model, "created_at": created_at(), "done": False, **fields})

    def start(self) -> list[bytes]:
        return []

    def feed(self, *, reasoning: str = "", text: str = "") -> list[bytes]:
        if not reasoning and not text:
            return []
        return [self._line(response=text, **({"thinking": reasoning} if reasoning else {}))]

    def finish(self, calls: tuple[ToolCall, ...], reason: FinishReason, finish: FinishEvent) -> list[bytes]:
        return [self._line(response="", **done_fields(self.wire, finish, reason))]
