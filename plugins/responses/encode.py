"""Encoding engine results as OpenAI Responses objects and stream events."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import attrs

from mlxrt.api.errors import openai_error_body
from mlxrt.api.sse import sse_event
from mlxrt.api.timings import StreamTimings, progress_body, timings
from mlxrt.errors import MlxrtError
from mlxrt.records import FinishEvent, FinishReason, PromptProgress, ToolCall

__all__ = ["ROUTE_OPT", "ResponseFrame", "new_id", "base_response", "output_items", "finished",
           "error_event", "EventStream"]

#: Route options every Responses handler carries: errors render as OpenAI error objects.
ROUTE_OPT = {"dialect": "responses", "render_error": openai_error_body}


def new_id(prefix: str) -> str:
    """``prefix_`` and 192 random bits: a stored response's id is the key to it on a server
    without ``--api-key`` (docs/dialects.md), so it must not be guessable."""
    return f"{prefix}_{secrets.token_hex(24)}"


@attrs.frozen
class ResponseFrame:
    """What a response echoes of its request."""

    id: str
    model: str
    instructions: str | None
    previous_response_id: str | None
    store: bool
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    tools: tuple[Any, ...]
    tool_choice: Any
    parallel_tool_calls: bool
    reasoning_effort: str | None
    metadata: dict[str, Any]
    text_format: dict[str, Any] = attrs.field(factory=lambda: {"type": "text"})
    created_at: int = attrs.field(factory=lambda: int(time.time()))


def base_response(frame: ResponseFrame, *, status: str = "in_progress") -> dict[str, Any]:
    return {
        "id": frame.id, "object": "response", "created_at": frame.created_at, "status": status,
        "error": None, "incomplete_details": None, "instructions": frame.instructions,
        "max_output_tokens": frame.max_output_tokens, "model": frame.model, "output": [],
        "parallel_tool_calls": frame.parallel_tool_calls, "previous_response_id": frame.previous_response_id,
        "reasoning": {"effort": frame.reasoning_effort, "summary": None}, "store": frame.store,
        "temperature": frame.temperature, "text": {"format": frame.text_format},
        "tool_choice": frame.tool_choice, "tools": list(frame.tools), "top_p": frame.top_p,
        "truncation": "disabled", "usage": None, "user": None, "metadata": frame.metadata,
    }


def _reasoning_item(id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": id, "type": "reasoning", "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def _message_item(id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": id, "type": "message", "status": status, "role": "assistant", "content": content}


def _call_item(id: str, call: ToolCall, status: str, arguments: str | None = None) -> dict[str, Any]:
    return {"id": id, "type": "function_call", "status": status, "call_id": call.id or new_id("call"),
            "name": call.name, "arguments": call.arguments if arguments is None else arguments}


def output_items(*, reasoning: str, content: str, calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    items = []
    if reasoning:
        items.append(_reasoning_item(new_id("rs"), reasoning, "completed"))
    if content or not calls:
        items.append(_message_item(new_id("msg"), content, "completed"))
    items += [_call_item(new_id("fc"), c, "completed") for c in calls]
    return items


def finished(frame: ResponseFrame, output: list[dict[str, Any]], reason: FinishReason, finish: FinishEvent,
             reasoning_tokens: int) -> dict[str, Any]:
    """The final response object: status, output and usage."""
    body = base_response(frame, status="incomplete" if reason is FinishReason.LENGTH else "completed")
    if reason is FinishReason.LENGTH:
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    body["output"] = output
    body["usage"] = {
        "input_tokens": finish.prompt_tokens,
        "input_tokens_details": {"cached_tokens": finish.cached_tokens},
        "output_tokens": finish.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": finish.prompt_tokens + finish.completion_tokens,
    }
    return body


def error_event(exc: MlxrtError, sequence_number: int) -> bytes:
    """The ``error`` event: an error after the stream started."""
    return sse_event("error", {"type": "error", "sequence_number": sequence_number, "code": exc.code or exc.type,
                               "message": exc.message, "param": exc.param})


class EventStream:
    """Responses stream events with sequence numbers: one output item open at a time
    (reasoning, then the message), function calls at the end, then ``response.completed``
    (or ``response.incomplete``)."""

    def __init__(self, frame: ResponseFrame, *, count_tokens: Callable[[str], int],
                 on_done: Callable[[dict[str, Any]], None] | None = None,
                 clock: StreamTimings | None = None) -> None:
        """``count_tokens`` sizes the reasoning (``usage.output_tokens_details``); ``on_done``
        receives the final response (the route stores it) before ``response.completed``;
        ``clock``: the request asked for llama-server's ``timings_per_token``, and each
        ``response.output_text.delta`` carries the running ``timings``."""
        self.frame = frame
        self.count_tokens, self.on_done = count_tokens, on_done
        self.clock = clock
        self.reasoning: list[str] = []
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self._open: str | None = None
        self._id = ""
        self._text: list[str] = []

    def event(self, type_: str, **fields: Any) -> bytes:
        body = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse_event(type_, body)

    def error_frame(self, exc: MlxrtError) -> bytes:
        frame = error_event(exc, self.seq)
        self.seq += 1
        return frame

    def start(self) -> list[bytes]:
        response = base_response(self.frame)
        return [self.event("response.created", response=response),
                self.event("response.in_progress", response=response)]

    def observe(self, event: object) -> list[bytes]:
        """Every engine event, before it is assembled: a prefill report (``return_progress``)
        is another ``response.in_progress`` with llama-server's ``prompt_progress``."""
        if self.clock is not None:
            self.clock.feed(event)
        if isinstance(event, PromptProgress):
            return [self.event("response.in_progress", response=base_response(self.frame),
                               prompt_progress=progress_body(event))]
        return []

    @property
    def _index(self) -> int:
        return len(self.output)

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        text = "".join(self._text)
        where = {"item_id": self._id, "output_index": self._index, "content_index": 0}
        part: dict[str, Any]
        if self._open == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            item = _reasoning_item(self._id, text, "completed")
            frames = [self.event("response.reasoning_text.done", **where, text=text)]
        else:
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item = _message_item(self._id, text, "completed")
            frames = [self.event("response.output_text.done", **where, text=text, logprobs=[])]
        frames += [self.event("response.content_part.done", **where, part=part),
                   self.event("response.output_item.done", output_index=self._index, item=item)]
        self.output.append(item)
        self._open, self._text = None, []
        return frames

    def _begin(self, kind: str) -> list[bytes]:
        frames = self._close()
        self._open, self._id = kind, new_id("rs" if kind == "reasoning" else "msg")
        part: dict[str, Any]
        if kind == "reasoning":
            item = {**_reasoning_item(self._id, "", "in_progress"), "content": []}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = _message_item(self._id, None, "in_progress")
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        frames += [self.event("response.output_item.added", output_index=self._index, item=item),
                   self.event("response.content_part.added", item_id=self._id, output_index=self._index,
                              content_index=0, part=part)]
        return frames

    def feed(self, *, reasoning: str = "", text: str = "") -> list[bytes]:
        frames: list[bytes] = []
        for kind, delta, name in (("reasoning", reasoning, "response.reasoning_text.delta"),
                                  ("message", text, "response.output_text.delta")):
            if not delta:
                continue
            if self._open != kind:
                frames += self._begin(kind)
            self._text.append(delta)
            if kind == "reasoning":
                self.reasoning.append(delta)
            extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
            if kind == "message" and self.clock is not None:
                extra["timings"] = self.clock.now()
            frames.append(self.event(name, item_id=self._id, output_index=self._index, content_index=0,
                                     delta=delta, **extra))
        return frames

    def finish(self, calls: tuple[ToolCall, ...], reason: FinishReason, finish: FinishEvent) -> list[bytes]:
        """The closing events, ending with the final response."""
        frames = []
        if not calls and not any(i["type"] == "message" for i in self.output) and self._open != "message":
            frames += self._begin("message")  # an empty answer is still one (empty) message
        frames += self._close()
        for call in calls:
            id = new_id("fc")
            index = self._index
            frames.append(self.event("response.output_item.added", output_index=index,
                                     item=_call_item(id, call, "in_progress", arguments="")))
            frames.append(self.event("response.function_call_arguments.delta", item_id=id, output_index=index,
                                     delta=call.arguments))
            frames.append(self.event("response.function_call_arguments.done", item_id=id, output_index=index,
                                     arguments=call.arguments, name=call.name))
            item = _call_item(id, call, "completed")
            frames.append(self.event("response.output_item.done", output_index=index, item=item))
            self.output.append(item)
        body = finished(self.frame, self.output, reason, finish, self.count_tokens("".join(self.reasoning)))
        if self.on_done is not None:
            self.on_done(body)
        done = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        frames.append(self.event(done, response=body, timings=timings(finish)))  # llama-server's, beside the response
        return frames
