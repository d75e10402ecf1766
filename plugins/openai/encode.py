"""Encoding engine results as OpenAI bodies and stream chunks (chat and text completions)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from mlxrt.api import generation
from mlxrt.api.errors import openai_error_body
from mlxrt.api.generation import CACHE_HEADER, response_headers
from mlxrt.api.sse import sse_data
from mlxrt.errors import MlxrtError
from mlxrt.records import FinishEvent, TokenEvent, ToolCall

__all__ = [
    "ROUTE_OPT", "CACHE_HEADER", "response_headers",
    "usage", "completion_body", "chunk", "finish_usage", "closing_frames", "tool_calls_json",
    "logprob_entries", "logprobs_block", "text_completion_body", "text_completion_chunk", "guarded",
    "error_frame",
]

#: Route options every OpenAI handler carries: errors render as OpenAI error objects.
ROUTE_OPT = {"dialect": "openai", "render_error": openai_error_body}

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


def _utf8(text: str) -> list[int]:
    # A lone surrogate cannot come out of a tokenizer's decode, but never fail on one.
    return list(text.encode("utf-8", errors="surrogatepass"))


def logprob_entries(events: Sequence[TokenEvent]) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content`` entries for the emitted tokens, plus each token's ``id``.

    ``token`` is the text the token added to the output (see :class:`mlxrt.records.TokenEvent`
    ``piece``), ``bytes`` its UTF-8; ``top_logprobs`` are best first.
    """
    return [{
        "token": ev.piece,
        "logprob": ev.logprob,
        "bytes": _utf8(ev.piece),
        "top_logprobs": [{"token": alt.text, "logprob": alt.logprob, "bytes": _utf8(alt.text), "id": alt.id}
                         for alt in ev.top_logprobs],
        "id": ev.token,
    } for ev in events]


def logprobs_block(events: Sequence[TokenEvent] | None, *, legacy: bool = False) -> dict[str, Any] | None:
    """``choices[i].logprobs``: ``None`` when not requested, else ``{"content": [...]}``.

    ``legacy`` adds the text-completions fields OpenAI's completions API used (``tokens``,
    ``token_logprobs``, ``top_logprobs`` as token → logprob maps, ``text_offset``), so both
    kinds of client find what they read.
    """
    if events is None:
        return None
    block: dict[str, Any] = {"content": logprob_entries(events)}
    if legacy:
        offsets, at = [], 0
        for ev in events:
            offsets.append(at)
            at += len(ev.piece)
        block.update(
            tokens=[ev.piece for ev in events],
            token_logprobs=[ev.logprob for ev in events],
            top_logprobs=[{alt.text: alt.logprob for alt in ev.top_logprobs} for ev in events],
            text_offset=offsets,
        )
    return block


def completion_body(*, id: str, created: int, model: str, content: str, reasoning: str,
                    calls: tuple[ToolCall, ...], finish_reason: str, finish: FinishEvent,
                    logprobs: Sequence[TokenEvent] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content if (content or not calls) else None}
    if reasoning:
        # mlx_lm.server and mlx-bun say "reasoning"; vLLM/DeepSeek clients read "reasoning_content".
        message["reasoning"] = message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = tool_calls_json(calls)
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs_block(logprobs),
                     "finish_reason": finish_reason}],
        "usage": usage(finish),
    }


def chunk(*, id: str, created: int, model: str, delta: dict[str, Any],
          finish_reason: str | None = None, usage_body: dict[str, Any] | None = None,
          logprobs: Sequence[TokenEvent] | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``logprobs`` are the entries of the tokens it carries."""
    body: dict[str, Any] = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": logprobs_block(logprobs or None),
                     "finish_reason": finish_reason}],
    }
    if usage_body is not None:
        body["usage"] = usage_body
    return body


def finish_usage(finish: FinishEvent, include_usage: bool) -> dict[str, Any] | None:
    """Usage for the finish chunk: there unless ``include_usage`` moves it to its own chunk.

    Without ``stream_options.include_usage`` usage rides on the finish chunk (mlx-bun's habit;
    OpenAI clients ignore it there)."""
    return None if include_usage else usage(finish)


def closing_frames(*, id: str, created: int, model: str, object: str, finish: FinishEvent,
                   include_usage: bool) -> list[bytes]:
    """What follows the finish chunk: with ``include_usage``, OpenAI's last chunk (no choices,
    the usage); then ``data: [DONE]``."""
    frames = []
    if include_usage:
        frames.append(sse_data({"id": id, "object": object, "created": created, "model": model,
                                "choices": [], "usage": usage(finish)}))
    frames.append(sse_data("[DONE]"))
    return frames


def text_completion_body(*, id: str, created: int, model: str, text: str, finish_reason: str,
                         finish: FinishEvent, logprobs: Sequence[TokenEvent] | None = None) -> dict[str, Any]:
    return {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": logprobs_block(logprobs, legacy=True),
                     "finish_reason": finish_reason}],
        "usage": usage(finish),
    }


def text_completion_chunk(*, id: str, created: int, model: str, text: str, finish_reason: str | None = None,
                          usage_body: dict[str, Any] | None = None,
                          logprobs: Sequence[TokenEvent] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": logprobs_block(logprobs or None, legacy=True),
                     "finish_reason": finish_reason}],
    }
    if usage_body is not None:
        body["usage"] = usage_body
    return body


def error_frame(exc: MlxrtError) -> bytes:
    # Then [DONE], as every OpenAI stream ends: clients that wait for it (rather than for the
    # connection to close) stop reading instead of hanging.
    return sse_data(openai_error_body(exc.status, exc.type, exc.message, exc.param, exc.code)) + sse_data("[DONE]")


def guarded(frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Pass SSE frames through; an error mid-stream becomes an OpenAI error frame followed by
    ``[DONE]`` (:func:`mlxrt.api.generation.guarded`)."""
    return generation.guarded(frames, error_frame)
