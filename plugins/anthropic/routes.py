"""Anthropic routes: ``POST /v1/messages`` (stream and not) and ``/v1/messages/count_tokens``.

Auth headers (``x-api-key``, ``anthropic-version``, ``anthropic-beta``) are accepted and not
acted on, as on the OpenAI routes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from litestar import Request, Response, post

from mlxrt.api.app import claimed_fields
from mlxrt.api.disconnect import off_loop
from mlxrt.api.models import model_for
from mlxrt.api.pipeline import Answer, Framed, Turn, serve_chat
from mlxrt.api.text_limits import refuse_overlong_text
from mlxrt.api.wire import parse_json_object
from mlxrt.plugins.anthropic.decode import decode_messages
from mlxrt.plugins.anthropic.encode import (
    ROUTE_OPT,
    BlockStream,
    anthropic_error_body,
    anthropic_message,
    error_frame,
    message_body,
    message_id,
)
from mlxrt.plugins.anthropic.wire import COUNT_RULES, MESSAGES_RULES
from mlxrt.records import CacheReport, RequestOptions

__all__ = ["ROUTES", "MESSAGES"]


def _host(request: Request[Any, Any, Any]) -> Any:
    return request.app.state.host


class Messages(Framed):
    """The Messages dialect (:class:`mlxrt.api.pipeline.Dialect`)."""

    name = "anthropic"
    #: Anthropic requires ``max_tokens``; this is never used.
    default_max_tokens = 1

    def decode(self, body: Mapping[str, Any], claimed: Mapping[str, type], *, strict: bool) -> Turn:
        decoded = decode_messages(body, claimed, strict=strict)
        wire = decoded.request
        single = bool(wire.tool_choice and wire.tool_choice.disable_parallel_tool_use)
        options = RequestOptions(
            sampling={"temperature": wire.temperature, "top_p": wire.top_p, "top_k": wire.top_k},
            max_tokens=wire.max_tokens, stop=decoded.stop, adapter=decoded.adapter,
            tools=decoded.chat.tools, forced_tools=decoded.forced, extra=decoded.extra, parallel_tool_calls=not single,
        )
        return Turn(chat=decoded.chat, options=options, model=wire.model, stream=bool(wire.stream),
                    headers=decoded.headers, single_call=single)

    def new_id(self) -> str:
        return message_id()

    def body(self, answer: Answer) -> dict[str, Any]:
        return message_body(id=answer.id, model=answer.model, content=answer.content, reasoning=answer.reasoning,
                            calls=answer.calls, reason=answer.reason, finish=answer.finish)

    def frames(self, *, id: str, model: str, report: CacheReport, turn: Turn) -> BlockStream:
        return BlockStream(id=id, model=model, report=report)

    render_error = staticmethod(anthropic_error_body)
    error_message = staticmethod(anthropic_message)
    error_frame = staticmethod(error_frame)


MESSAGES = Messages()


@post("/v1/messages", status_code=200, opt={**ROUTE_OPT, "field_rules": MESSAGES_RULES}, summary="Create a message (Anthropic Messages)",
      tags=["anthropic"])
async def messages(request: Request[Any, Any, Any]) -> Response[Any]:
    return await serve_chat(request, MESSAGES)


@post("/v1/messages/count_tokens", status_code=200, opt={**ROUTE_OPT, "field_rules": COUNT_RULES},
      summary="Count a message's input tokens (Anthropic Messages)", tags=["anthropic"])
async def count_tokens(request: Request[Any, Any, Any]) -> dict[str, int]:
    """``{"input_tokens": N}``: the prompt the same body would run with, canonicalized."""
    host = _host(request)
    body = parse_json_object(await request.body())
    decoded = decode_messages(body, claimed_fields(host, "anthropic"), strict=bool(host.options.get("strict")),
                              count_only=True)
    model = await model_for(request, decoded.request.model)
    await refuse_overlong_text(request, body, model)  # as /v1/messages: before anything templates it
    return {"input_tokens": await off_loop(request, lambda: model.count_tokens(decoded.chat, dialect="anthropic"))}


ROUTES = [messages, count_tokens]
