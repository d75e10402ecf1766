"""OpenAI routes: chat completions (stream and not); text completions live in
:mod:`mlxrt.plugins.openai.completions`, the model list in :mod:`mlxrt.plugins.openai.models`."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from litestar import Request, Response, post

from mlxrt.api.app import claimed_fields
from mlxrt.api.disconnect import closing_on_error, drain_until_disconnect, start_generation
from mlxrt.api.generation import refuse_overlong_text
from mlxrt.api.models import host_for
from mlxrt.api.pipeline import Turn, assembler_for, planned_chat
from mlxrt.api.sse import sse_data, sse_response
from mlxrt.api.wire import parse_json_object
from mlxrt.plugins.openai.completions import completions
from mlxrt.plugins.openai.decode import DecodedChat, decode_chat
from mlxrt.plugins.openai.embeddings import embeddings
from mlxrt.plugins.openai.encode import (
    ROUTE_OPT,
    chunk,
    closing_frames,
    completion_body,
    finish_usage,
    guarded,
    response_headers,
    tool_calls_json,
)
from mlxrt.plugins.openai.models import get_model, list_models
from mlxrt.records import FinishEvent, GenerationRequest, TokenEvent
from mlxrt.responses import LogprobTrail, ResponseAssembler
from mlxrt.templating import RenderedPrompt

__all__ = ["ROUTES"]

#: mlx-bun keeps a large chat default so reasoning traces are not cut; admission caps it to
#: what fits the context. ``--max-tokens`` overrides it.
CHAT_DEFAULT_MAX_TOKENS = 65536


def _host(request: Request) -> Any:
    return request.app.state.host


async def _prepare(request: Request) -> tuple[Any, DecodedChat, Turn, RenderedPrompt, GenerationRequest]:
    host = _host(request)
    body = parse_json_object(await request.body())
    decoded = decode_chat(body, claimed_fields(host, "openai"), strict=bool(host.options.get("strict")))
    host = await host_for(request, decoded.request.model)
    await refuse_overlong_text(request, body, host)
    turn = Turn(chat=decoded.chat, options=decoded.options.run)
    rendered, gen = await planned_chat(request, host, turn.chat, turn.options, dialect="openai",
                                       request_id=f"chatcmpl-{uuid.uuid4()}",
                                       default_max_tokens=CHAT_DEFAULT_MAX_TOKENS)
    return host, decoded, turn, rendered, gen


@post(["/v1/chat/completions", "/chat/completions"], status_code=200, opt=ROUTE_OPT,
      summary="Create a chat completion", tags=["openai"])
async def chat_completions(request: Request) -> Response:
    host, decoded, turn, rendered, generation = await _prepare(request)
    engine = host.engine
    model = engine.info.model_id
    created = int(time.time())
    assembler = assembler_for(host, turn, rendered, generation)
    # Admission errors (queue full, a failing sampler hook) surface here, as the status.
    gen, report = await start_generation(request, engine, generation)
    async with closing_on_error(gen):  # until a stream owns it
        headers = response_headers(decoded.options.headers, report)
        if decoded.request.stream:
            return sse_response(guarded(_stream(gen, generation, assembler, model, created,
                                                include_usage=decoded.options.include_usage)),
                                headers=headers)
    finish, logprobs = await drain_until_disconnect(request, gen, assembler.feed)
    _delta, reason = assembler.finish(finish)
    body = completion_body(
        id=generation.request_id, created=created, model=model, content="".join(assembler.content),
        reasoning="".join(assembler.reasoning), calls=assembler.tool_calls, finish_reason=str(reason),
        finish=finish, logprobs=logprobs if generation.logprobs is not None else None,
    )
    return Response(content=body, status_code=200, headers=headers)


async def _stream(gen: Any, generation: GenerationRequest, assembler: ResponseAssembler,
                  model: str, created: int, *, include_usage: bool) -> AsyncIterator[bytes]:
    """Chat chunks. Each carries the logprobs of the tokens released since the previous one:
    text the reasoning splitter or tool router holds back keeps its entries until it is sent.

    Owns ``gen``: closing this stream (the client left) closes the engine request."""
    trail = LogprobTrail()
    carried: list[TokenEvent] = []

    def frame(delta: dict[str, Any], **kw: Any) -> bytes:
        entries = carried[:]
        carried.clear()
        return sse_data(chunk(id=generation.request_id, created=created, model=model, delta=delta,
                              logprobs=entries, **kw))

    def delta_body(content: str, reasoning: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if reasoning:
            out["reasoning"] = out["reasoning_content"] = reasoning
        if content:
            out["content"] = content
        return out

    async with aclosing(gen):
        yield frame({"role": "assistant", "content": ""})
        # One frame per run of ready events: a stream that falls behind catches up in fewer frames.
        async for run in gen.batches():
            content: list[str] = []
            reasoning: list[str] = []
            for event in run:
                if isinstance(event, FinishEvent):
                    if content or reasoning:
                        yield frame(delta_body("".join(content), "".join(reasoning)))
                    carried.extend(trail.finish(event))
                    last, reason = assembler.finish(event)
                    if last:
                        yield frame(delta_body(last.content, last.reasoning))
                    if assembler.tool_calls:
                        yield frame({"tool_calls": tool_calls_json(assembler.tool_calls, indexed=True)})
                    yield frame({}, finish_reason=str(reason), usage_body=finish_usage(event, include_usage))
                    for closing in closing_frames(id=generation.request_id, created=created, model=model,
                                                  object="chat.completion.chunk", finish=event,
                                                  include_usage=include_usage):
                        yield closing
                    return
                carried.extend(trail.feed(event))
                delta = assembler.feed(event.text)
                if delta:
                    content.append(delta.content)
                    reasoning.append(delta.reasoning)
            if any(content) or any(reasoning):
                yield frame(delta_body("".join(content), "".join(reasoning)))


ROUTES = [chat_completions, completions, embeddings, list_models, get_model]
