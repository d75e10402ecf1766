"""Ollama's generation routes, ``POST /api/chat`` and ``POST /api/generate``, and the list of
every Ollama route.

Both are :func:`mlxrt.api.pipeline.serve_chat` with Ollama's shapes (a ``raw`` generate is
``serve_text``: no template), answered as NDJSON unless ``stream: false``. Their ``resolve``
step picks the model first, to time its load (``load_duration``) and to apply ``keep_alive``
to it through the model pool. A body without ``messages`` (chat) or ``prompt`` (generate) only
loads the model, or with ``keep_alive: 0`` unloads it, as Ollama does (``done_reason`` ``load``
/ ``unload``): that is how ``ollama stop`` and ``mlxrt stop`` unload a model.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import attrs
from litestar import Request, Response, post
from litestar.response import Stream

from mlxrt.api.models import pool_of
from mlxrt.api.pipeline import Answer, Framed, TextAnswer, TextTurn, Turn, serve_chat, serve_text
from mlxrt.api.wire import parse_json_object
from mlxrt.plugins.ollama.decode import (
    CHAT_DEFAULT_MAX_TOKENS,
    OllamaWire,
    decode_chat,
    decode_generate,
)
from mlxrt.plugins.ollama.encode import (
    ChatLines,
    GenerateLines,
    chat_body,
    done_fields,
    error_line,
    generate_body,
)
from mlxrt.plugins.ollama.residency import chosen
from mlxrt.plugins.ollama.schemas import CHAT as CHAT_SCHEMA
from mlxrt.plugins.ollama.schemas import GENERATE as GENERATE_SCHEMA
from mlxrt.plugins.ollama.schemas import opt
from mlxrt.plugins.ollama.wire import (
    NDJSON,
    created_at,
    error_body,
    keep_alive_seconds,
    ndjson,
    ollama_name,
    pool_name,
)
from mlxrt.records import CacheReport, FinishEvent, PromptProgress

if TYPE_CHECKING:
    from mlxrt.engine.bridge import Generation


__all__ = ["ROUTES", "CHAT", "GENERATE"]


def _ndjson(response: Response[Any]) -> Response[Any]:
    """A stream the pipeline made (as SSE) sent as Ollama's NDJSON."""
    if isinstance(response, Stream):
        response.media_type = NDJSON
    return response


class Chat(Framed):
    """``/api/chat`` (:class:`mlxrt.api.pipeline.Dialect`)."""

    name = "ollama"
    default_max_tokens = CHAT_DEFAULT_MAX_TOKENS

    def decode(self, body: Mapping[str, Any], claimed: Mapping[str, type], *, strict: bool) -> Turn:
        d = decode_chat(body, claimed, strict=strict)
        return Turn(chat=d.chat, options=d.options, model=d.model, stream=d.stream, headers=d.headers, wire=d.wire)

    async def resolve(self, request: Request[Any, Any, Any], turn: Turn) -> Turn:
        _model, loaded = await chosen(request, turn.model, turn.wire.keep_alive)
        return attrs.evolve(turn, wire=attrs.evolve(turn.wire, load_ns=loaded))

    def new_id(self) -> str:
        return f"ollama-{uuid.uuid4().hex[:24]}"

    def body(self, answer: Answer) -> dict[str, Any]:
        return chat_body(model=answer.model, content=answer.content, reasoning=answer.reasoning, calls=answer.calls,
                         reason=answer.reason, finish=answer.finish, wire=_wire(answer.turn))

    def frames(self, *, id: str, model: str, report: CacheReport, turn: Turn) -> ChatLines | GenerateLines:
        return ChatLines(model=model, wire=turn.wire)

    render_error = staticmethod(error_body)
    error_frame = staticmethod(error_line)


class Generate(Chat):
    """``/api/generate`` under the model's chat template."""

    def decode(self, body: Mapping[str, Any], claimed: Mapping[str, type], *, strict: bool) -> Turn:
        d = decode_generate(body, claimed, strict=strict)
        return Turn(chat=d.chat, options=d.options, model=d.model, stream=d.stream, headers=d.headers, wire=d.wire)

    def body(self, answer: Answer) -> dict[str, Any]:
        return generate_body(model=answer.model, content=answer.content, reasoning=answer.reasoning,
                             reason=answer.reason, finish=answer.finish, wire=_wire(answer.turn))

    def frames(self, *, id: str, model: str, report: CacheReport, turn: Turn) -> GenerateLines:
        return GenerateLines(model=model, wire=turn.wire)


def _wire(turn: Turn | TextTurn | None) -> OllamaWire | None:
    return turn.wire if turn is not None else None


@attrs.frozen
class RawGenerate:
    """``/api/generate`` with ``raw: true`` (:class:`mlxrt.api.pipeline.TextDialect`): the prompt
    as it is, no template. One per request: it carries the load time its route measured."""

    load_ns: int = 0
    name: str = "ollama"
    default_max_tokens: int = CHAT_DEFAULT_MAX_TOKENS

    def decode(self, body: Mapping[str, Any], claimed: Mapping[str, type], *, strict: bool) -> TextTurn:
        d = decode_generate(body, claimed, strict=strict)
        wire = attrs.evolve(d.wire, load_ns=self.load_ns)
        return TextTurn(prompt=d.raw or "", options=d.options, model=d.model, stream=d.stream, headers=d.headers,
                        wire=wire)

    def new_id(self) -> str:
        return f"ollama-{uuid.uuid4().hex[:24]}"

    def body(self, answers: Sequence[TextAnswer], turn: TextTurn) -> dict[str, Any]:
        first = answers[0]
        return generate_body(model=first.model, content=first.text, reasoning="", reason=first.finish.finish_reason,
                             finish=first.finish, wire=turn.wire)

    async def stream(self, gens: Sequence[Generation], *, id: str, model: str, created: int, turn: TextTurn
                     ) -> AsyncGenerator[bytes, None]:
        lines = GenerateLines(model=model, wire=turn.wire)
        async with aclosing(gens[0]) as gen:
            async for run in gen.batches():
                text: list[str] = []
                for event in run:
                    if isinstance(event, PromptProgress):
                        continue
                    if isinstance(event, FinishEvent):
                        for line in lines.feed(text="".join(text) + event.text):
                            yield line
                        yield ndjson({"model": ollama_name(model), "created_at": created_at(), "response": "",
                                      **done_fields(turn.wire, event, event.finish_reason)})
                        return
                    text.append(event.text)
                for line in lines.feed(text="".join(text)):
                    yield line

    error_frame = staticmethod(error_line)


CHAT = Chat()
GENERATE = Generate()


async def _load_only(request: Request[Any, Any, Any], body: Mapping[str, Any], route: str) -> dict[str, Any]:
    """A body with nothing to answer: load the model (``done_reason`` ``load``), or with
    ``keep_alive: 0`` unload it now (``unload``; a model that is not resident is left so). The
    body is checked as a whole request's is (``options``, ``tools``, ``format``…): a bad one is a
    400 here too, not a 200 that ignored it."""
    (decode_chat if route == "chat" else decode_generate)(body, {}, strict=False)
    name = pool_name(body.get("model"))
    keep = keep_alive_seconds(body.get("keep_alive"))
    pool = pool_of(request)
    if keep == 0:
        await pool.unload(name or "")
        reason, shown = "unload", body.get("model") or ollama_name(pool.primary.model_id)
    else:
        served, _ = await chosen(request, name, keep)
        reason, shown = "load", ollama_name(served.info.model_id)
    answer = {"message": {"role": "assistant", "content": ""}} if route == "chat" else {"response": ""}
    return {"model": shown, "created_at": created_at(), **answer, "done": True, "done_reason": reason}


@post("/api/chat", status_code=200, opt=opt(CHAT_SCHEMA), summary="Chat (Ollama)", tags=["ollama"])
async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
    body = parse_json_object(await request.body())
    if not body.get("messages"):
        return Response(content=await _load_only(request, body, "chat"), status_code=200)
    return _ndjson(await serve_chat(request, CHAT))


@post("/api/generate", status_code=200, opt=opt(GENERATE_SCHEMA), summary="Generate (Ollama)", tags=["ollama"])
async def generate(request: Request[Any, Any, Any]) -> Response[Any]:
    body = parse_json_object(await request.body())
    if not body.get("prompt") and not body.get("images"):
        return Response(content=await _load_only(request, body, "generate"), status_code=200)
    if body.get("raw") is True:
        _model, loaded = await chosen(request, pool_name(body.get("model")), keep_alive_seconds(body.get("keep_alive")))
        return _ndjson(await serve_text(request, RawGenerate(load_ns=loaded)))
    return _ndjson(await serve_chat(request, GENERATE))


def _all_routes() -> list[Any]:
    from mlxrt.plugins.ollama.embed import embed, embeddings
    from mlxrt.plugins.ollama.models import delete, list_tags, running, show, version
    from mlxrt.plugins.ollama.pull import pull

    return [chat, generate, list_tags, show, running, version, delete, pull, embed, embeddings]


ROUTES = _all_routes()
