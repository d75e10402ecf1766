"""``POST /v1/completions``: raw text completion (no chat template, no reasoning or tools).

The prompt is tokenized with the tokenizer's own special-token handling (a BOS where the
model wants one); validation, sampling, stops and logprobs are the chat route's, through
:func:`mlxrt.plugins.openai.decode.decode_options` and the pipeline's
:func:`~mlxrt.api.pipeline.planned_text`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from litestar import Request, Response, post

from mlxrt.api.app import claimed_fields
from mlxrt.api.disconnect import drain_choices, start_choices
from mlxrt.api.generation import refuse_overlong_text
from mlxrt.api.models import host_for
from mlxrt.api.pipeline import choice_requests, owned_adapters, planned_text
from mlxrt.api.sse import sse_data, sse_response
from mlxrt.api.wire import parse_json_object
from mlxrt.assembly import LogprobTrail
from mlxrt.plugins.openai.decode import decode_completion
from mlxrt.plugins.openai.encode import (
    ROUTE_OPT,
    UsageTally,
    choice_frames,
    guarded,
    response_headers,
    system_fingerprint,
    text_completion_body,
    text_completion_chunk,
    with_choices,
)
from mlxrt.records import FinishEvent, GenerationRequest, TokenEvent

__all__ = ["completions", "COMPLETIONS_DEFAULT_MAX_TOKENS"]

#: mlx_lm.server's and mlx-bun's default for text completions; ``--max-tokens`` overrides it.
COMPLETIONS_DEFAULT_MAX_TOKENS = 512


@post(["/v1/completions", "/completions"], status_code=200, opt=ROUTE_OPT,
      summary="Create a text completion", tags=["openai"])
async def completions(request: Request) -> Response:
    host = request.app.state.host
    body = parse_json_object(await request.body())
    decoded = decode_completion(body, claimed_fields(host, "openai"), strict=bool(host.options.get("strict")))
    host = await host_for(request, decoded.request.model)
    await refuse_overlong_text(request, body, host)
    engine = host.engine
    options = owned_adapters(request, host, decoded.options.run)
    generation = await planned_text(request, host, decoded.prompt, options, dialect="openai",
                                    request_id=f"cmpl-{uuid.uuid4()}",
                                    default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS)
    model = engine.info.model_id
    created = int(time.time())
    fingerprint = system_fingerprint(host)
    generations = choice_requests(generation, decoded.options.run.n)
    gens, report = await start_choices(request, engine, generations)
    headers = response_headers(decoded.options.headers, report)
    if decoded.request.stream:  # the stream owns the engine requests from here
        tally = UsageTally(len(gens), decoded.options.include_usage)
        streams = [_stream(gen, generation, model, created, index=i, tally=tally, fingerprint=fingerprint)
                   for i, gen in enumerate(gens)]
        return sse_response(guarded(choice_frames(streams, id=generation.request_id, created=created, model=model,
                                                  object="text_completion", tally=tally, fingerprint=fingerprint)),
                            headers=headers)
    texts: list[list[str]] = [[] for _ in gens]
    results = await drain_choices(request, gens, [parts.append for parts in texts])
    bodies = [text_completion_body(
        id=generation.request_id, created=created, model=model, text="".join(parts) + finish.text,
        finish_reason=str(finish.finish_reason), finish=finish,
        logprobs=logprobs if generation.logprobs is not None else None, fingerprint=fingerprint, index=i,
    ) for i, (parts, (finish, logprobs)) in enumerate(zip(texts, results, strict=True))]
    body = bodies[0] if len(bodies) == 1 else with_choices(bodies, [finish for finish, _ in results])
    return Response(content=body, status_code=200, headers=headers)


async def _stream(gen: Any, generation: GenerationRequest, model: str, created: int, *, index: int,
                  tally: UsageTally, fingerprint: str) -> AsyncIterator[bytes]:
    """One choice's ``text_completion`` chunks: one per non-empty text delta, then its finish
    chunk (empty text, finish_reason, usage as :class:`UsageTally` says). Owns ``gen``:
    closing this stream closes the request."""
    trail = LogprobTrail()
    carried: list[TokenEvent] = []  # entries of tokens whose text has not been sent yet

    def frame(text: str, **kw: Any) -> bytes:
        entries = carried[:]
        carried.clear()
        return sse_data(text_completion_chunk(id=generation.request_id, created=created, model=model,
                                              text=text, logprobs=entries, fingerprint=fingerprint, index=index,
                                              **kw))

    async with aclosing(gen):
        # One frame per run of ready events: a stream that falls behind catches up in fewer frames.
        async for run in gen.batches():
            text: list[str] = []
            for event in run:
                if isinstance(event, FinishEvent):
                    carried.extend(trail.finish(event))
                    if text or event.text:
                        yield frame("".join(text) + event.text)
                    yield frame("", finish_reason=str(event.finish_reason),
                                usage_body=tally.finished(index, event))
                    return
                carried.extend(trail.feed(event))
                text.append(event.text)
            if any(text):
                yield frame("".join(text))
