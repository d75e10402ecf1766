"""OpenAI routes: chat completions (stream and not); text completions live in
:mod:`mlxrt.plugins.openai.completions`, the model list in :mod:`mlxrt.plugins.openai.models`."""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

from litestar import Request, Response, post

from mlxrt.api.errors import openai_error_body
from mlxrt.api.pipeline import Answer, Turn, serve_chat
from mlxrt.api.timings import StreamTimings, progress_body, timings
from mlxrt.assembly import ResponseAssembler
from mlxrt.plugins.openai.completions import completions
from mlxrt.plugins.openai.decode import decode_chat
from mlxrt.plugins.openai.embeddings import embeddings
from mlxrt.plugins.openai.encode import (
    ROUTE_OPT,
    LogprobFrames,
    UsageTally,
    choice_frames,
    chunk,
    completion_body,
    error_frame,
    tool_calls_json,
    turn_fingerprint,
    with_choices,
)
from mlxrt.plugins.openai.llama import LLAMA_ROUTES, rendered_prompt
from mlxrt.plugins.openai.models import codex_catalog, get_model, list_models
from mlxrt.plugins.openai.wire import CHAT_RULES
from mlxrt.records import CacheReport, FinishEvent, PromptProgress

__all__ = ["ROUTES"]

#: mlx-bun keeps a large chat default so reasoning traces are not cut; admission caps it to
#: what fits the context. ``--max-tokens`` overrides it.
CHAT_DEFAULT_MAX_TOKENS = 65536


class Chat:
    """Chat completions (:class:`mlxrt.api.pipeline.Dialect`); its stream carries per-token
    log-probabilities, so it writes its own frames rather than a ``FrameWriter``."""

    name = "openai"
    default_max_tokens = CHAT_DEFAULT_MAX_TOKENS

    def decode(self, body: Mapping[str, Any], claimed: Mapping[str, type], *, strict: bool) -> Turn:
        decoded = decode_chat(body, claimed, strict=strict)
        return Turn(chat=decoded.chat, options=decoded.options.run, model=decoded.request.model,
                    stream=bool(decoded.request.stream), headers=decoded.options.headers, wire=decoded,
                    single_call=not decoded.options.run.parallel_tool_calls)

    def new_id(self) -> str:
        return f"chatcmpl-{uuid.uuid4()}"

    def body(self, answer: Answer) -> dict[str, Any]:
        fingerprint = turn_fingerprint(answer.turn)
        choices = answer.choices or (answer,)
        bodies = [completion_body(id=a.id, created=a.created, model=a.model, content=a.content, reasoning=a.reasoning,
                                  calls=a.calls, finish_reason=str(a.reason), finish=a.finish, logprobs=a.logprobs,
                                  fingerprint=fingerprint, index=i) for i, a in enumerate(choices)]
        body = bodies[0] if len(bodies) == 1 else with_choices(bodies, [a.finish for a in choices])
        if answer.turn.wire.request.verbose:
            # llama-server's debugging field; rendered again (it rendered fine moments ago), only when asked.
            served = answer.turn.served
            if served is not None:  # the pipeline set it
                body["__verbose"] = {"prompt": rendered_prompt(served, answer.turn.chat).text}
        return body

    def stream(self, gen: Any, assembler: ResponseAssembler, *, id: str, model: str, created: int,
               report: CacheReport, turn: Turn) -> AsyncGenerator[bytes, None]:
        return self.stream_choices([gen], [assembler], id=id, model=model, created=created, report=report,
                                   turn=turn)

    def stream_choices(self, gens: list[Any], assemblers: list[ResponseAssembler], *, id: str, model: str,
                       created: int, report: CacheReport, turn: Turn) -> AsyncGenerator[bytes, None]:
        return _stream(gens, id, assemblers, model, created, include_usage=turn.wire.options.include_usage,
                       fingerprint=turn_fingerprint(turn),
                       per_token=bool(turn.wire.request.timings_per_token))

    render_error = staticmethod(openai_error_body)
    error_frame = staticmethod(error_frame)


CHAT = Chat()


@post(["/v1/chat/completions", "/chat/completions"], status_code=200, opt={**ROUTE_OPT, "field_rules": CHAT_RULES},
      summary="Create a chat completion", tags=["openai"])
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    return await serve_chat(request, CHAT)


def _stream(gens: list[Any], id: str, assemblers: list[ResponseAssembler], model: str, created: int, *,
            include_usage: bool, fingerprint: str, per_token: bool) -> AsyncGenerator[bytes, None]:
    """Chat chunks of every choice (``n``: each its own engine request, its chunks indexed),
    then the closing frames. Owns ``gens``: closing this stream (the client left) closes them."""
    tally = UsageTally(len(gens), include_usage)
    streams = [_choice_stream(gen, id, assembler, model, created, index=i, tally=tally, fingerprint=fingerprint,
                              per_token=per_token)
               for i, (gen, assembler) in enumerate(zip(gens, assemblers, strict=True))]
    return choice_frames(streams, id=id, created=created, model=model, object="chat.completion.chunk", tally=tally,
                         fingerprint=fingerprint)


async def _choice_stream(gen: Any, id: str, assembler: ResponseAssembler, model: str, created: int, *,
                         index: int, tally: UsageTally, fingerprint: str, per_token: bool) -> AsyncGenerator[bytes, None]:
    """One choice's chunks, up to its finish chunk, each with the logprobs of the tokens it
    releases (:class:`~mlxrt.plugins.openai.encode.LogprobFrames`); a ``prompt_progress`` chunk
    (empty delta) per prefill report when the request asked (``return_progress``); llama-server's
    ``timings`` on the finish chunk, and on every chunk after the first with ``per_token``.

    Owns ``gen``: closing this stream (the client left) closes the engine request."""
    frames = LogprobFrames(functools.partial(chunk, id=id, created=created, model=model, fingerprint=fingerprint,
                                             index=index))
    clock = StreamTimings(await gen.started())

    def frame(delta: dict[str, Any], **kw: Any) -> bytes:
        if per_token and "extra" not in kw:
            kw["extra"] = {"timings": clock.now()}
        return frames.frame(delta=delta, **kw)

    def delta_body(content: str, reasoning: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if reasoning:
            out["reasoning"] = out["reasoning_content"] = reasoning
        if content:
            out["content"] = content
        return out

    async with aclosing(gen):
        yield frames.frame(delta={"role": "assistant", "content": ""})
        # One frame per run of ready events: a stream that falls behind catches up in fewer frames.
        async for run in gen.batches():
            content: list[str] = []
            reasoning: list[str] = []
            for event in run:
                clock.feed(event)
                if isinstance(event, PromptProgress):
                    yield frame({}, extra={"prompt_progress": progress_body(event)})
                    continue
                if isinstance(event, FinishEvent):
                    if content or reasoning:
                        yield frame(delta_body("".join(content), "".join(reasoning)))
                    frames.finish(event)
                    last, reason = assembler.finish(event)
                    if last:
                        yield frame(delta_body(last.content, last.reasoning))
                    if assembler.tool_calls:
                        yield frame({"tool_calls": tool_calls_json(assembler.tool_calls, indexed=True)})
                    yield frame({}, finish_reason=str(reason), usage_body=tally.finished(index, event),
                                extra={"timings": timings(event)})
                    return
                frames.feed(event)
                delta = assembler.feed(event.text)
                if delta:
                    content.append(delta.content)
                    reasoning.append(delta.reasoning)
            if any(content) or any(reasoning):
                yield frame(delta_body("".join(content), "".join(reasoning)))


ROUTES = [chat_completions, completions, embeddings, list_models, get_model, codex_catalog, *LLAMA_ROUTES]
