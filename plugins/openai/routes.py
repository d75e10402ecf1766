"""OpenAI routes: chat completions (stream and not) and the model list."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from litestar import Request, Response, post

from mlxrt.admission import plan_max_tokens
from mlxrt.api.app import claimed_fields
from mlxrt.api.errors import openai_error_body
from mlxrt.api.sse import sse_data, sse_response
from mlxrt.api.wire import parse_json_object
from mlxrt.errors import MlxrtError
from mlxrt.plugins.openai.decode import DecodedChat, decode_chat
from mlxrt.plugins.openai.embeddings import embeddings
from mlxrt.plugins.openai.encode import chunk, completion_body, tool_calls_json, usage
from mlxrt.plugins.openai.models import get_model, list_models
from mlxrt.records import FinishEvent, GenerationRequest
from mlxrt.responses import ResponseAssembler
from mlxrt.sampling import resolve_sampling
from mlxrt.templating import RenderedPrompt, canonicalize, render_chat

__all__ = ["ROUTES"]

#: mlx-bun keeps a large chat default so reasoning traces are not cut; admission caps it to
#: what fits the context. ``--max-tokens`` overrides it.
CHAT_DEFAULT_MAX_TOKENS = 65536
_OPT = {"dialect": "openai", "render_error": openai_error_body}


def _host(request: Request) -> Any:
    return request.app.state.host


async def _prepare(request: Request) -> tuple[DecodedChat, RenderedPrompt, GenerationRequest]:
    host = _host(request)
    engine = host.engine
    decoded = decode_chat(parse_json_object(await request.body()), claimed_fields(host, "openai"))
    rendered = await anyio.to_thread.run_sync(
        render_chat, host, engine.tokenizer, engine.profile, decoded.chat
    )
    wire = decoded.request
    requested = wire.max_completion_tokens if wire.max_completion_tokens is not None else wire.max_tokens
    option = host.options.get("max_tokens")
    max_tokens = plan_max_tokens(
        len(rendered.ids), requested, option if option is not None else CHAT_DEFAULT_MAX_TOKENS,
        engine.info.context_window,
    )
    sampling = resolve_sampling(
        {"temperature": wire.temperature, "top_p": wire.top_p, "top_k": wire.top_k, "min_p": wire.min_p},
        host.options, engine.info.generation_config, seed=wire.seed,
    )
    gen = GenerationRequest(
        request_id=f"chatcmpl-{uuid.uuid4()}",
        prompt_ids=rendered.ids,
        max_tokens=max_tokens,
        sampling=sampling,
        stop=decoded.stop,
        dialect="openai",
        extra=decoded.extra,
    )
    return decoded, rendered, canonicalize(host, gen, "openai")


@post(["/v1/chat/completions", "/chat/completions"], status_code=200, opt=_OPT,
      summary="Create a chat completion", tags=["openai"])
async def chat_completions(request: Request) -> Response:
    decoded, rendered, gen = await _prepare(request)
    engine = _host(request).engine
    model = engine.info.model_id
    created = int(time.time())
    assembler = ResponseAssembler(engine.profile, tools=decoded.chat.tools,
                                  starts_in_thinking=rendered.starts_in_thinking)
    if decoded.request.stream:
        return sse_response(_stream(engine, gen, assembler, model, created))
    finish: FinishEvent | None = None
    async for event in engine.generate(gen):
        if isinstance(event, FinishEvent):
            finish = event
        else:
            assembler.feed(event.text)
    assert finish is not None
    _delta, reason = assembler.finish(finish)
    body = completion_body(
        id=gen.request_id, created=created, model=model, content="".join(assembler.content),
        reasoning="".join(assembler.reasoning), calls=assembler.tool_calls,
        finish_reason=str(reason), finish=finish,
    )
    return Response(content=body, status_code=200)


async def _stream(engine: Any, gen: GenerationRequest, assembler: ResponseAssembler,
                  model: str, created: int) -> AsyncIterator[bytes]:
    def frame(delta: dict[str, Any], **kw: Any) -> bytes:
        return sse_data(chunk(id=gen.request_id, created=created, model=model, delta=delta, **kw))

    def delta_body(content: str, reasoning: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if reasoning:
            out["reasoning"] = reasoning
        if content:
            out["content"] = content
        return out

    yield frame({"role": "assistant", "content": ""})
    try:
        async for event in engine.generate(gen):
            if isinstance(event, FinishEvent):
                last, reason = assembler.finish(event)
                if last:
                    yield frame(delta_body(last.content, last.reasoning))
                if assembler.tool_calls:
                    yield frame({"tool_calls": tool_calls_json(assembler.tool_calls, indexed=True)})
                yield frame({}, finish_reason=str(reason), usage_body=usage(event))
                yield sse_data("[DONE]")
                return
            delta = assembler.feed(event.text)
            if delta:
                yield frame(delta_body(delta.content, delta.reasoning))
    except MlxrtError as exc:
        # Headers are gone: the error travels in the stream, which then closes without [DONE].
        yield sse_data(openai_error_body(exc.status, exc.type, exc.message, exc.param, exc.code))


ROUTES = [chat_completions, embeddings, list_models, get_model]
