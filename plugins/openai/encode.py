"""Encoding engine results as OpenAI chat-completion bodies and stream chunks."""

from __future__ import annotations

from typing import Any

from mlxrt.records import FinishEvent, ToolCall

__all__ = ["usage", "completion_body", "chunk", "tool_calls_json"]


def usage(finish: FinishEvent) -> dict[str, Any]:
    return {
        "prompt_tokens": finish.prompt_tokens,
        "completion_tokens": finish.completion_tokens,
        "total_tokens": finish.prompt_tokens + finish.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finish.cached_tokens},
    }


def tool_calls_json(calls: tuple[ToolCall, ...], *, indexed: bool = False) -> list[dict[str, Any]]:
    out = []
    for i, call in enumerate(calls):
        item: dict[str, Any] = {"id": call.id, "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments}}
        if indexed:
            item = {"index": i, **item}
        out.append(item)
    return out


def completion_body(*, id: str, created: int, model: str, content: str, reasoning: str,
                    calls: tuple[ToolCall, ...], finish_reason: str, finish: FinishEvent) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content if (content or not calls) else None}
    if reasoning:
        message["reasoning"] = reasoning
    if calls:
        message["tool_calls"] = tool_calls_json(calls)
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage(finish),
    }


def chunk(*, id: str, created: int, model: str, delta: dict[str, Any],
          finish_reason: str | None = None, usage_body: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
    if usage_body is not None:
        body["usage"] = usage_body
    return body
