"""Responses routes: ``POST /v1/responses`` (stream and not; also ``/responses``, as
llama-server serves it), ``GET`` and ``DELETE /v1/responses/{id}``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from litestar import Request, Response, delete, get, post

from mlxrt.api.auth import caller_of
from mlxrt.api.errors import openai_error_body
from mlxrt.api.framing import assembled_stream, guarded
from mlxrt.api.pipeline import Answer, Turn, serve_chat
from mlxrt.api.timings import StreamTimings
from mlxrt.assembly import ResponseAssembler
from mlxrt.errors import NotFound
from mlxrt.plugins.responses.decode import (
    DecodedResponse,
    chat_input,
    decode_response,
    output_as_input,
)
from mlxrt.plugins.responses.encode import (
    ROUTE_OPT,
    EventStream,
    ResponseFrame,
    finished,
    new_id,
    output_items,
)
from mlxrt.plugins.responses.store import DEFAULT_MAX_BYTES, DEFAULT_TTL_S, ResponseStore
from mlxrt.plugins.responses.wire import RESPONSES_RULES
from mlxrt.records import CacheReport, ChatInput, RequestOptions

if TYPE_CHECKING:
    from mlxrt.registry import PluginHost

__all__ = ["ROUTES", "RESPONSES", "store_of", "owner_of"]

#: Like chat completions: room for reasoning traces; admission caps it to the context.
RESPONSES_DEFAULT_MAX_TOKENS = 65536


def store_of(host: PluginHost) -> ResponseStore:
    """The app host's response store (its ``plugin_state("responses")``), made on first use
    with the server's options."""
    options = host.options
    store: ResponseStore = host.plugin_state("responses", lambda: ResponseStore(
        ttl_s=float(options.get("response_store_ttl") or DEFAULT_TTL_S),
        max_bytes=int(options.get("response_store_bytes") or DEFAULT_MAX_BYTES)))
    return store


def owner_of(request: Request[Any, Any, Any]) -> str:
    """Who a stored response belongs to: :func:`mlxrt.api.auth.caller_of` (so each key sees
    only its own), ``""`` on a server without ``--api-key``, where the 192-bit id is the only
    key (it is never shown to anyone but its creator)."""
    return caller_of(request)


def _not_found(id: str, param: str | None = None) -> NotFound:
    code = "previous_response_not_found" if param else "response_not_found"
    return NotFound(f"response '{id}' not found or expired", param=param, code=code)


@attrs.frozen
class Exchange:
    """A resolved request (``Turn.wire``): the decoded body, the whole conversation it runs
    with, and where its answer is kept."""

    decoded: DecodedResponse
    #: The previous response's input and output, then this request's input.
    items: tuple[Mapping[str, Any], ...]
    #: The API key's digest the answer is stored under (:func:`owner_of`).
    owner: str
    #: The app's host, whose store keeps the answer; ``None``: the body said ``store: false``.
    keeper: Any = None

    def keep(self, id: str, body: Mapping[str, Any]) -> None:
        """Store the finished response (resumable by ``previous_response_id``, ``GET`` …)."""
        if self.keeper is not None:
            store_of(self.keeper).put(id, self.items, body, self.owner)

    def frame(self, id: str, model: str, created: int) -> ResponseFrame:
        """What the response echoes of its request."""
        wire = self.decoded.request
        return ResponseFrame(
            id=id, model=model, instructions=wire.instructions, previous_response_id=wire.previous_response_id,
            store=wire.store, max_output_tokens=wire.max_output_tokens, temperature=wire.temperature,
            top_p=wire.top_p, tools=tuple(t["function"] | {"type": "function"} for t in self.decoded.tools or ()),
            tool_choice=self.decoded.tool_choice, parallel_tool_calls=wire.parallel_tool_calls,
            reasoning_effort=wire.reasoning.effort if wire.reasoning else None,
            metadata=dict(wire.metadata or {}), text_format=dict(self.decoded.text_format), created_at=created,
        )


def _reasoning_tokens(turn: Turn, reasoning: str) -> int:
    if not reasoning or turn.served is None:
        return 0
    return len(turn.served.tokenizer.encode(reasoning, add_special_tokens=False))


class Responses:
    """The Responses dialect (:class:`mlxrt.api.pipeline.Dialect`), with the optional
    ``resolve`` step: a request continues a stored conversation and its answer is stored."""

    name = "responses"
    default_max_tokens = RESPONSES_DEFAULT_MAX_TOKENS

    def decode(self, body: Mapping[str, Any], claimed: Mapping[str, type], *, strict: bool) -> Turn:
        decoded = decode_response(body, claimed, strict=strict)
        wire = decoded.request
        options = RequestOptions(
            sampling={"temperature": wire.temperature, "top_p": wire.top_p, "top_k": wire.top_k},
            max_tokens=wire.max_output_tokens, seed=wire.seed, adapter=decoded.adapter, tools=decoded.tools,
            forced_tools=decoded.forced, structured=decoded.structured, extra=decoded.extra,
            progress=bool(wire.return_progress and wire.stream), parallel_tool_calls=wire.parallel_tool_calls,
        )
        # The chat is known once resolve() has found the conversation this request continues.
        return Turn(chat=ChatInput(messages=()), options=options, model=wire.model, stream=bool(wire.stream),
                    headers=decoded.headers, single_call=not wire.parallel_tool_calls, wire=decoded,
                    store=bool(wire.store))

    async def resolve(self, request: Request[Any, Any, Any], turn: Turn) -> Turn:
        """The whole conversation (a stored response's input and output before this request's
        input) as the chat to render; a ``previous_response_id`` the caller cannot see is a 404."""
        decoded: DecodedResponse = turn.wire
        wire = decoded.request
        host, owner = request.app.state.host, owner_of(request)
        items = decoded.input
        if wire.previous_response_id is not None:
            prior = store_of(host).get(wire.previous_response_id, owner)
            if prior is None:
                raise _not_found(wire.previous_response_id, "previous_response_id")
            items = (*prior.input, *output_as_input(prior.body.get("output") or ()), *items)
        effort = wire.reasoning.effort if wire.reasoning else None
        return attrs.evolve(turn, chat=chat_input(wire.instructions, items, decoded.tools, effort),
                            wire=Exchange(decoded=decoded, items=items, owner=owner,
                                          keeper=host if wire.store else None))

    def new_id(self) -> str:
        return new_id("resp")

    def body(self, answer: Answer) -> dict[str, Any]:
        turn: Turn = answer.turn
        exchange: Exchange = turn.wire
        output = output_items(reasoning=answer.reasoning, content=answer.content, calls=answer.calls)
        body = finished(exchange.frame(answer.id, answer.model, answer.created), output, answer.reason,
                        answer.finish, _reasoning_tokens(turn, answer.reasoning))
        exchange.keep(answer.id, body)
        return body

    def stream(self, gen: Any, assembler: ResponseAssembler, *, id: str, model: str, created: int,
               report: CacheReport, turn: Turn) -> AsyncGenerator[bytes, None]:
        exchange: Exchange = turn.wire
        events = EventStream(exchange.frame(id, model, created),
                             count_tokens=lambda text: _reasoning_tokens(turn, text),
                             on_done=lambda body: exchange.keep(id, body),
                             clock=StreamTimings(report) if exchange.decoded.request.timings_per_token else None)
        # Error events carry the stream's next sequence number: the stream catches its own.
        return guarded(assembled_stream(gen, assembler, events, single_call=turn.single_call), events.error_frame)

    render_error = staticmethod(openai_error_body)
    error_frame = None  # the stream numbers and sends its own (EventStream.error_frame)


RESPONSES = Responses()


@post(["/v1/responses", "/responses"], status_code=200, opt={**ROUTE_OPT, "field_rules": RESPONSES_RULES},
      summary="Create a response (OpenAI Responses)", tags=["responses"])
async def create_response(request: Request[Any, Any, Any]) -> Response[Any]:
    return await serve_chat(request, RESPONSES)


@get("/v1/responses/{response_id:str}", opt=ROUTE_OPT, summary="Retrieve a stored response", tags=["responses"])
async def get_response(request: Request[Any, Any, Any]) -> dict[str, Any]:
    response_id = request.path_params["response_id"]
    stored = store_of(request.app.state.host).get(response_id, owner_of(request))
    if stored is None:
        raise _not_found(response_id)
    return dict(stored.body)


@delete("/v1/responses/{response_id:str}", status_code=200, opt=ROUTE_OPT, summary="Delete a stored response",
        tags=["responses"])
async def delete_response(request: Request[Any, Any, Any]) -> dict[str, Any]:
    response_id = request.path_params["response_id"]
    if not store_of(request.app.state.host).delete(response_id, owner_of(request)):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


ROUTES = [create_response, get_response, delete_response]
