"""Anthropic routes: ``POST /v1/messages`` (stream and not) and ``/v1/messages/count_tokens``.

Auth headers (``x-api-key``, ``anthropic-version``, ``anthropic-beta``) are accepted and not
acted on, as on the OpenAI routes.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post

from mlxrt.api.app import claimed_fields
from mlxrt.api.disconnect import (
    closing_on_error,
    drain_until_disconnect,
    off_loop,
    start_generation,
)
from mlxrt.api.generation import (
    assembled_stream,
    forced_tool_call,
    guarded,
    plan_generation,
    refuse_overlong_text,
    response_headers,
    turn_observer,
)
from mlxrt.api.models import host_for
from mlxrt.api.sse import sse_response
from mlxrt.api.wire import parse_json_object
from mlxrt.assembly import ResponseAssembler
from mlxrt.plugins.anthropic.decode import DecodedMessages, decode_messages
from mlxrt.plugins.anthropic.encode import (
    ROUTE_OPT,
    BlockStream,
    error_frame,
    message_body,
    message_id,
)
from mlxrt.records import GenerationRequest
from mlxrt.templating import RenderedPrompt, render_chat, rendered_request

__all__ = ["ROUTES"]


def _host(request: Request) -> Any:
    return request.app.state.host


def _prepare_sync(host: Any, decoded: DecodedMessages) -> tuple[RenderedPrompt, GenerationRequest]:
    """Render, tokenize and build the engine request (off the event loop: templating and the
    canonicalize hook may take milliseconds on long agent prompts)."""
    engine = host.engine
    rendered = render_chat(host, engine.tokenizer, engine.profile, decoded.chat)
    wire = decoded.request
    forced, structured = forced_tool_call(host, decoded.forced, decoded.chat.tools, rendered.ids)
    gen = plan_generation(
        host, dialect="anthropic", request_id=message_id(), prompt_ids=rendered.ids,
        requested_max_tokens=wire.max_tokens, default_max_tokens=wire.max_tokens or 1, max_tokens_is_ceiling=True,
        sampling={"temperature": wire.temperature, "top_p": wire.top_p, "top_k": wire.top_k},
        stop=decoded.stop, extra=decoded.extra, forced_prefixes=forced, adapter=decoded.adapter,
        structured=structured,
    )
    return rendered, rendered_request(gen, rendered)


@post("/v1/messages", status_code=200, opt=ROUTE_OPT, summary="Create a message (Anthropic Messages)",
      tags=["anthropic"])
async def messages(request: Request) -> Response:
    host = _host(request)
    body = parse_json_object(await request.body())
    decoded = decode_messages(body, claimed_fields(host, "anthropic"), strict=bool(host.options.get("strict")))
    host = await host_for(request, decoded.request.model)
    await refuse_overlong_text(request, body, host)
    rendered, generation = await off_loop(request, _prepare_sync, host, decoded)
    engine = host.engine
    model = engine.info.model_id
    assembler = ResponseAssembler(engine.profile, tools=decoded.chat.tools,
                                  starts_in_thinking=rendered.starts_in_thinking,
                                  on_finish=turn_observer(host, dialect="anthropic", request_id=generation.request_id,
                                                          messages=decoded.chat.messages))
    single = bool(decoded.request.tool_choice and decoded.request.tool_choice.disable_parallel_tool_use)
    gen, report = await start_generation(request, engine, generation)
    async with closing_on_error(gen):  # until a stream owns it
        headers = response_headers(decoded.headers, report)
        if decoded.request.stream:
            blocks = BlockStream(id=generation.request_id, model=model, report=report)
            return sse_response(guarded(assembled_stream(gen, assembler, blocks, single_call=single), error_frame),
                                headers=headers)
    finish, _logprobs = await drain_until_disconnect(request, gen, assembler.feed)
    _delta, reason = assembler.finish(finish)
    calls = assembler.tool_calls[:1] if single else assembler.tool_calls
    body = message_body(id=generation.request_id, model=model, content="".join(assembler.content),
                        reasoning="".join(assembler.reasoning), calls=calls, reason=reason, finish=finish)
    return Response(content=body, status_code=200, headers=headers)


@post("/v1/messages/count_tokens", status_code=200, opt=ROUTE_OPT,
      summary="Count a message's input tokens (Anthropic Messages)", tags=["anthropic"])
async def count_tokens(request: Request) -> dict[str, int]:
    """``{"input_tokens": N}``: the prompt the same body would run with, canonicalized."""
    host = _host(request)
    decoded = decode_messages(parse_json_object(await request.body()), claimed_fields(host, "anthropic"),
                              strict=bool(host.options.get("strict")), count_only=True)
    host = await host_for(request, decoded.request.model)

    def count() -> int:
        from mlxrt.templating import canonicalize

        engine = host.engine
        rendered = render_chat(host, engine.tokenizer, engine.profile, decoded.chat)
        probe = GenerationRequest(request_id="count", prompt_ids=rendered.ids, max_tokens=1, dialect="anthropic")
        return len(canonicalize(host, probe, "anthropic").prompt_ids)

    return {"input_tokens": await off_loop(request, count)}


ROUTES = [messages, count_tokens]
