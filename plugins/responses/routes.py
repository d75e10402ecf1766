"""Responses routes: ``POST /v1/responses`` (stream and not), ``GET`` and ``DELETE
/v1/responses/{id}``."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from litestar import Request, Response, delete, get, post

from mlxrt.api.app import claimed_fields
from mlxrt.api.auth import presented_key
from mlxrt.api.disconnect import closing_on_error, drain_until_disconnect, start_generation
from mlxrt.api.generation import assembled_stream, guarded, refuse_overlong_text, response_headers
from mlxrt.api.models import host_for
from mlxrt.api.pipeline import Turn, assembler_for, planned_chat
from mlxrt.api.sse import sse_response
from mlxrt.api.wire import parse_json_object
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
from mlxrt.records import RequestOptions

__all__ = ["ROUTES", "store_of", "owner_of"]

#: Like chat completions: room for reasoning traces; admission caps it to the context.
RESPONSES_DEFAULT_MAX_TOKENS = 65536


def store_of(request: Request) -> ResponseStore:
    """The host's response store (its ``plugin_state("responses")``), made on first use with
    the server's options."""
    host = request.app.state.host
    options = host.options
    return host.plugin_state("responses", lambda: ResponseStore(
        ttl_s=float(options.get("response_store_ttl") or DEFAULT_TTL_S),
        max_bytes=int(options.get("response_store_bytes") or DEFAULT_MAX_BYTES)))


def owner_of(request: Request) -> str:
    """Who a stored response belongs to: a digest of the API key the request authenticated
    with (so each key sees only its own), or ``""`` on a server without ``--api-key``, where
    the 192-bit id is the only key (it is never shown to anyone but its creator)."""
    if not request.app.state.host.options.get("api_keys"):
        return ""
    key = presented_key(request) or ""
    return hashlib.sha256(key.encode()).hexdigest()


def _not_found(id: str, param: str | None = None) -> NotFound:
    code = "previous_response_not_found" if param else "response_not_found"
    return NotFound(f"response '{id}' not found or expired", param=param, code=code)


def _conversation(request: Request, decoded: DecodedResponse) -> tuple[Mapping[str, Any], ...]:
    """The whole input: the previous response's input and output, then this request's."""
    prev_id = decoded.request.previous_response_id
    if prev_id is None:
        return decoded.input
    prior = store_of(request).get(prev_id, owner_of(request))
    if prior is None:
        raise _not_found(prev_id, "previous_response_id")
    return (*prior.input, *output_as_input(prior.body.get("output") or ()), *decoded.input)


def _turn(decoded: DecodedResponse, items: tuple[Mapping[str, Any], ...]) -> Turn:
    """The whole conversation as the chat to render, and the request's options."""
    wire = decoded.request
    effort = wire.reasoning.effort if wire.reasoning else None
    options = RequestOptions(
        sampling={"temperature": wire.temperature, "top_p": wire.top_p, "top_k": wire.top_k},
        max_tokens=wire.max_output_tokens, seed=wire.seed, adapter=decoded.adapter, tools=decoded.tools,
        forced_tools=decoded.forced, structured=decoded.structured, extra=decoded.extra,
    )
    return Turn(chat=chat_input(wire.instructions, items, decoded.tools, effort), options=options,
                model=wire.model, stream=bool(wire.stream), headers=decoded.headers,
                single_call=not wire.parallel_tool_calls)


def _frame(decoded: DecodedResponse, id: str, model: str) -> ResponseFrame:
    wire = decoded.request
    return ResponseFrame(
        id=id, model=model, instructions=wire.instructions, previous_response_id=wire.previous_response_id,
        store=wire.store, max_output_tokens=wire.max_output_tokens, temperature=wire.temperature,
        top_p=wire.top_p, tools=tuple(t["function"] | {"type": "function"} for t in decoded.tools or ()),
        tool_choice=decoded.tool_choice, parallel_tool_calls=wire.parallel_tool_calls,
        reasoning_effort=wire.reasoning.effort if wire.reasoning else None, metadata=dict(wire.metadata or {}),
        text_format=dict(decoded.text_format),
    )


def _reasoning_tokens(engine: Any, reasoning: str) -> int:
    return len(engine.tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0


@post("/v1/responses", status_code=200, opt=ROUTE_OPT, summary="Create a response (OpenAI Responses)",
      tags=["responses"])
async def create_response(request: Request) -> Response:
    host = request.app.state.host
    body = parse_json_object(await request.body())
    decoded = decode_response(body, claimed_fields(host, "responses"), strict=bool(host.options.get("strict")))
    items = _conversation(request, decoded)
    host = await host_for(request, decoded.request.model)
    await refuse_overlong_text(request, body, host)
    id = new_id("resp")
    turn = _turn(decoded, items)
    rendered, generation = await planned_chat(request, host, turn.chat, turn.options, dialect="responses",
                                              request_id=id, default_max_tokens=RESPONSES_DEFAULT_MAX_TOKENS)
    engine = host.engine
    frame = _frame(decoded, id, engine.info.model_id)
    assembler = assembler_for(host, turn, rendered, generation)
    single = turn.single_call
    store = store_of(request) if decoded.request.store else None
    owner = owner_of(request)
    gen, report = await start_generation(request, engine, generation)
    async with closing_on_error(gen):  # until a stream owns it
        headers = response_headers(decoded.headers, report)
        if decoded.request.stream:
            events = EventStream(frame, count_tokens=lambda text: _reasoning_tokens(engine, text),
                                 on_done=(lambda body: store.put(id, items, body, owner)) if store is not None else None)
            return sse_response(guarded(assembled_stream(gen, assembler, events, single_call=single),
                                        events.error_frame), headers=headers)
    finish, _logprobs = await drain_until_disconnect(request, gen, assembler.feed)
    _delta, reason = assembler.finish(finish)
    calls = assembler.tool_calls[:1] if single else assembler.tool_calls
    reasoning = "".join(assembler.reasoning)
    output = output_items(reasoning=reasoning, content="".join(assembler.content), calls=calls)
    body = finished(frame, output, reason, finish, _reasoning_tokens(engine, reasoning))
    if store is not None:
        store.put(id, items, body, owner)
    return Response(content=body, status_code=200, headers=headers)


@get("/v1/responses/{response_id:str}", opt=ROUTE_OPT, summary="Retrieve a stored response", tags=["responses"])
async def get_response(request: Request) -> dict[str, Any]:
    response_id = request.path_params["response_id"]
    stored = store_of(request).get(response_id, owner_of(request))
    if stored is None:
        raise _not_found(response_id)
    return dict(stored.body)


@delete("/v1/responses/{response_id:str}", status_code=200, opt=ROUTE_OPT, summary="Delete a stored response",
        tags=["responses"])
async def delete_response(request: Request) -> dict[str, Any]:
    response_id = request.path_params["response_id"]
    if not store_of(request).delete(response_id, owner_of(request)):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


ROUTES = [create_response, get_response, delete_response]
