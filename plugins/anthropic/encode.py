"""Encoding engine results as Anthropic bodies: messages, usage, stream events and errors."""

from __future__ import annotations

import uuid
from typing import Any

from mlxrt.api.sse import sse_event
from mlxrt.api.wire import tool_input
from mlxrt.errors import ContextOverflow, MlxrtError
from mlxrt.records import CacheReport, FinishEvent, FinishReason, ToolCall

__all__ = ["ROUTE_OPT", "anthropic_error_body", "anthropic_message", "error_frame", "stop_reason", "usage", "message_body",
           "BlockStream", "tool_use_id", "message_id"]

#: Anthropic's error types by status; anything else ≥ 500 is ``api_error``.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def anthropic_error_body(status: int, type_: str, message: str, param: str | None,
                         code: str | None) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``: mlxrt's own error type (e.g.
    ``model_unavailable``) maps to Anthropic's by status, so its SDK raises the right class."""
    kind = _TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_message(exc: MlxrtError) -> str:
    """An error's text in Anthropic's words where they differ from mlxrt's (OpenAI's): a prompt
    over the context is ``prompt is too long: M tokens > N maximum``, the text Claude Code
    recognises as overflow (it then compacts the conversation); what caps the context, when
    it is not the model's window, follows in parentheses."""
    if isinstance(exc, ContextOverflow):
        why = f" ({exc.why()})" if exc.window is not None else ""
        return f"prompt is too long: {exc.prompt_tokens} tokens > {exc.limit} maximum{why}"
    return exc.message


#: Route options every Anthropic handler carries: errors render in Anthropic's shape and words.
ROUTE_OPT = {"dialect": "anthropic", "render_error": anthropic_error_body, "error_message": anthropic_message}


def error_frame(exc: MlxrtError) -> bytes:
    return sse_event("error", anthropic_error_body(exc.status, exc.type, anthropic_message(exc), exc.param, exc.code))


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id(call_id: str | None) -> str:
    """Anthropic's ``toolu_`` ids for the calls mlxrt parsed (``call_…`` from the router)."""
    if call_id and call_id.startswith("toolu_"):
        return call_id
    tail = call_id[5:] if call_id and call_id.startswith("call_") else uuid.uuid4().hex[:24]
    return f"toolu_{tail}"


def stop_reason(reason: FinishReason, finish: FinishEvent) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)``; the engine names the stop string that matched."""
    if reason is FinishReason.TOOL_CALLS:
        return "tool_use", None
    if reason is FinishReason.LENGTH:
        return "max_tokens", None
    matched = getattr(finish, "stop_sequence", None)
    return ("stop_sequence", matched) if matched else ("end_turn", None)


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens *not* read from the cache
    (its accounting: the prompt is input + cache reads + cache writes)."""
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}


def _tool_block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": tool_input(call)}


def message_body(*, id: str, model: str, content: str, reasoning: str, calls: tuple[ToolCall, ...],
                 reason: FinishReason, finish: FinishEvent) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if content:
        blocks.append({"type": "text", "text": content})
    blocks += [_tool_block(c) for c in calls]
    stop, sequence = stop_reason(reason, finish)
    return {"id": id, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": stop, "stop_sequence": sequence,
            "usage": usage(finish.prompt_tokens, finish.cached_tokens, finish.completion_tokens)}


class BlockStream:
    """Anthropic's stream grammar: one content block open at a time, each
    ``content_block_start`` → ``content_block_delta``… → ``content_block_stop``, indexed in order.

    Feed reasoning and text deltas as they come; :meth:`finish` adds the tool_use blocks,
    ``message_delta`` and ``message_stop``.
    """

    def __init__(self, *, id: str, model: str, report: CacheReport) -> None:
        self.id, self.model, self.report = id, model, report
        self._open: str | None = None
        self._index = -1

    def start(self) -> list[bytes]:
        """``message_start`` (usage as known at admission) and a ``ping``, as Anthropic sends."""
        message: dict[str, Any] = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": usage(self.report.prompt_tokens, self.report.cached_tokens, 0)}
        return [sse_event("message_start", {"type": "message_start", "message": message}),
                sse_event("ping", {"type": "ping"})]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        frames = []
        if self._open == "thinking":
            frames.append(self._delta({"type": "signature_delta", "signature": ""}))
        frames.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": self._index}))
        self._open = None
        return frames

    def _begin(self, block: dict[str, Any]) -> list[bytes]:
        frames = self._close()
        self._index += 1
        self._open = block["type"]
        frames.append(sse_event("content_block_start",
                                {"type": "content_block_start", "index": self._index, "content_block": block}))
        return frames

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def feed(self, *, reasoning: str = "", text: str = "") -> list[bytes]:
        frames: list[bytes] = []
        if reasoning:
            if self._open != "thinking":
                frames += self._begin({"type": "thinking", "thinking": "", "signature": ""})
            frames.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        if text:
            if self._open != "text":
                frames += self._begin({"type": "text", "text": ""})
            frames.append(self._delta({"type": "text_delta", "text": text}))
        return frames

    def finish(self, calls: tuple[ToolCall, ...], reason: FinishReason, finish: FinishEvent) -> list[bytes]:
        frames: list[bytes] = []
        for call in calls:
            block = _tool_block(call)
            arguments = block.pop("input")
            frames += self._begin({**block, "input": {}})
            frames.append(self._delta({"type": "input_json_delta", "partial_json": _dumps(arguments)}))
        # no empty text block for an empty answer: the message body has none either
        frames += self._close()
        stop, sequence = stop_reason(reason, finish)
        frames.append(sse_event("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": sequence},
            "usage": usage(finish.prompt_tokens, finish.cached_tokens, finish.completion_tokens)}))
        frames.append(sse_event("message_stop", {"type": "message_stop"}))
        return frames


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, ensure_ascii=False)
