"""``POST /v1/completions``: raw text completion (no chat template, no reasoning or tools).

Only the wire: the body decodes into a :class:`~mlxrt.api.pipeline.TextTurn` (validation,
sampling, stops and logprobs are the chat route's, through
:func:`mlxrt.plugins.openai.decode.decode_completion`) and the answer encodes as
``text_completion`` bodies or chunks; :func:`mlxrt.api.pipeline.serve_text` does the rest
(the prompt is tokenized with the tokenizer's own special-token handling: a BOS where the model
wants one).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from typing import Any

from litestar import Request, Response, post

from mlxrt.api.pipeline import TextAnswer, TextTurn, serve_text
from mlxrt.api.timings import StreamTimings, progress_body, timings
from mlxrt.plugins.openai.decode import decode_completion
from mlxrt.plugins.openai.encode import (
    ROUTE_OPT,
    LogprobFrames,
    UsageTally,
    choice_frames,
    error_frame,
    text_completion_body,
    text_completion_chunk,
    turn_fingerprint,
    with_choices,
)
from mlxrt.plugins.openai.wire import COMPLETION_RULES
from mlxrt.records import FinishEvent, PromptProgress

__all__ = ["completions", "COMPLETIONS", "COMPLETIONS_DEFAULT_MAX_TOKENS"]

#: mlx_lm.server's and mlx-bun's default for text completions; ``--max-tokens`` overrides it.
COMPLETIONS_DEFAULT_MAX_TOKENS = 512


class Completions:
    """OpenAI text completions (:class:`mlxrt.api.pipeline.TextDialect`)."""

    name = "openai"
    default_max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    error_frame = staticmethod(error_frame)

    def decode(self, body: Mapping[str, Any], claimed: Mapping[str, type], *, strict: bool) -> TextTurn:
        decoded = decode_completion(body, claimed, strict=strict)
        return TextTurn(prompt=decoded.prompt, options=decoded.options.run, model=decoded.request.model,
                        stream=bool(decoded.request.stream), headers=decoded.options.headers, wire=decoded)

    def new_id(self) -> str:
        return f"cmpl-{uuid.uuid4()}"

    def body(self, answers: Sequence[TextAnswer], turn: TextTurn) -> dict[str, Any]:
        fingerprint = turn_fingerprint(turn)
        bodies = [text_completion_body(id=a.id, created=a.created, model=a.model, text=a.text,
                                       finish_reason=str(a.finish.finish_reason), finish=a.finish,
                                       logprobs=a.logprobs, fingerprint=fingerprint, index=i)
                  for i, a in enumerate(answers)]
        return bodies[0] if len(bodies) == 1 else with_choices(bodies, [a.finish for a in answers])

    def stream(self, gens: Sequence[Any], *, id: str, model: str, created: int,
               turn: TextTurn) -> AsyncGenerator[bytes, None]:
        fingerprint = turn_fingerprint(turn)
        tally = UsageTally(len(gens), turn.wire.options.include_usage)
        per_token = bool(turn.wire.request.timings_per_token)
        streams = [_stream(gen, id, model, created, index=i, tally=tally, fingerprint=fingerprint, per_token=per_token)
                   for i, gen in enumerate(gens)]
        return choice_frames(streams, id=id, created=created, model=model, object="text_completion", tally=tally,
                             fingerprint=fingerprint)


COMPLETIONS = Completions()


@post(["/v1/completions", "/completions"], status_code=200, opt={**ROUTE_OPT, "field_rules": COMPLETION_RULES},
      summary="Create a text completion", tags=["openai"])
async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
    return await serve_text(request, COMPLETIONS)


async def _stream(gen: Any, id: str, model: str, created: int, *, index: int,
                  tally: UsageTally, fingerprint: str, per_token: bool) -> AsyncGenerator[bytes, None]:
    """One choice's ``text_completion`` chunks: one per non-empty text delta, then its finish
    chunk (empty text, finish_reason, usage as :class:`UsageTally` says, llama-server's
    ``timings``); a ``prompt_progress`` chunk (empty text) per prefill report when the request
    asked (``return_progress``); the running ``timings`` on every text chunk with ``per_token``
    (``timings_per_token``). Owns ``gen``: closing this stream closes the request."""
    frames = LogprobFrames(functools.partial(text_completion_chunk, id=id, created=created, model=model,
                                             fingerprint=fingerprint, index=index))
    clock = StreamTimings(await gen.started())

    def frame(text: str) -> bytes:
        return frames.frame(text=text, extra={"timings": clock.now()} if per_token else None)

    async with aclosing(gen):
        # One frame per run of ready events: a stream that falls behind catches up in fewer frames.
        async for run in gen.batches():
            text: list[str] = []
            for event in run:
                clock.feed(event)
                if isinstance(event, PromptProgress):
                    yield frames.frame(text="", extra={"prompt_progress": progress_body(event)})
                    continue
                if isinstance(event, FinishEvent):
                    frames.finish(event)
                    if text or event.text:
                        yield frame("".join(text) + event.text)
                    yield frames.frame(text="", finish_reason=str(event.finish_reason),
                                       usage_body=tally.finished(index, event), extra={"timings": timings(event)})
                    return
                frames.feed(event)
                text.append(event.text)
            if any(text):
                yield frame("".join(text))
