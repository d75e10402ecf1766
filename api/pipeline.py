"""The one path every generation request takes: decode → plan → prepare → engine → assemble →
encode.

A dialect owns only its wire shapes: it decodes a body into a :class:`Turn` (the chat the
model sees and a :class:`~mlxrt.records.RequestOptions`) and encodes the answer as a body or
stream frames. Everything between is here, once, so ``--max-tokens``, the sampling chain,
logit-bias checks, ``tool_choice`` enforcement, ``mlxrt_prompt_canonicalize`` and
``mlxrt_prepare_request`` behave the same on every API:

- :func:`plan` builds the engine's :class:`~mlxrt.records.GenerationRequest` (the only builder);
- :func:`planned_chat` / :func:`planned_text` render or tokenize, plan and run
  ``mlxrt_prepare_request`` (grammar compilation and its 400s) on a worker thread — never on the
  event loop, never on the engine thread — before the request queues;
- :func:`assembler_for` makes the answer's :class:`~mlxrt.assembly.ResponseAssembler` from the
  request's own options (its tools) and reports the finished turn to observers;
- :func:`serve_chat` runs a whole request for a :class:`Dialect` (a dialect with server-side
  state, such as Responses' stored conversations, binds it in its optional ``resolve`` step); a
  dialect whose wire needs more (text completions' raw prompt) calls the steps itself;
- :func:`choice_requests` makes the engine requests of a request for several choices
  (``options.n``), which :func:`mlxrt.api.disconnect.start_choices` submits together.

Writing a dialect: docs/plugins/dialects.md.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
from litestar import Request, Response

from mlxrt.api.app import claimed_fields
from mlxrt.api.auth import caller_of
from mlxrt.api.disconnect import (
    closing_on_error,
    drain_choices,
    drain_until_disconnect,
    off_loop,
    start_choices,
    start_generation,
)
from mlxrt.api.generation import (
    FrameWriter,
    assembled_stream,
    forced_tool_call,
    guarded,
    refuse_overlong_text,
    response_headers,
    turn_observer,
)
from mlxrt.api.models import host_for
from mlxrt.api.sse import sse_data, sse_event, sse_response
from mlxrt.api.wire import IGNORED_HEADER, parse_json_object
from mlxrt.assembly import ResponseAssembler
from mlxrt.engine.admission import check_choices, choice_ceiling, plan_max_tokens
from mlxrt.engine.sampling import choice_seed, resolve_sampling
from mlxrt.errors import InvalidRequest, MlxrtError
from mlxrt.records import (
    CacheReport,
    ChatInput,
    FinishEvent,
    FinishReason,
    GenerationRequest,
    RequestOptions,
    TokenEvent,
    ToolCall,
)
from mlxrt.templating import (
    RenderedPrompt,
    canonicalize,
    encode_text,
    render_chat,
    rendered_request,
)
from mlxrt.text.tool_calls import PARTIAL_CALL_HEADER

__all__ = ["Turn", "Answer", "Dialect", "Framed", "plan", "prepare_request", "prepare", "planned_chat", "planned_text",
           "assembler_for", "owned_adapters", "serve_chat", "route_opt", "choice_requests",
           # Re-exported so a dialect needs this module, mlxrt.records and mlxrt.errors only:
           "ChatInput", "FrameWriter", "sse_data", "sse_event"]


@attrs.frozen
class Turn:
    """A decoded chat body: what the model sees and how to answer.

    :ivar chat: The conversation to render (its ``tools`` are replaced by ``options.tools``).
    :ivar options: How to answer (:class:`~mlxrt.records.RequestOptions`).
    :ivar model: The body's ``model`` (which pooled model serves it; ``None``: the default).
    :ivar stream: Answer as a stream of frames rather than one body.
    :ivar headers: Response headers the decoder adds (``x-mlxrt-ignored`` …).
    :ivar single_call: Keep only the first tool call (the client turned parallel calls off).
    :ivar wire: The dialect's own decoded body, for its encoder (the pipeline never reads it).
    :ivar host: The host serving the turn, set by the pipeline once the model is chosen, for an
        encoder that needs the model (Responses counts reasoning tokens with its tokenizer).
    :ivar store: The client lets the server keep the turn (Responses' ``store: false`` does
        not): told to turn observers (:attr:`mlxrt.records.FinishedTurn.store`).
    """

    chat: ChatInput
    options: RequestOptions = RequestOptions()
    model: str | None = None
    stream: bool = False
    headers: Mapping[str, str] = attrs.field(factory=dict)
    single_call: bool = False
    wire: Any = None
    host: Any = None
    store: bool = True


@attrs.frozen
class Answer:
    """A complete, non-streamed answer, ready for a dialect's body encoder.

    ``created``: when the request was planned (Unix seconds); ``logprobs``: the emitted tokens'
    events when the request asked for log-probabilities, else ``None``; ``turn``: the decoded
    request it answers; ``choices``: every choice in index order (this answer is the first)
    when the request asked for several (``options.n > 1``), else ``()``.
    """

    id: str
    model: str
    content: str
    reasoning: str
    calls: tuple[ToolCall, ...]
    reason: FinishReason
    finish: FinishEvent
    created: int = 0
    logprobs: tuple[TokenEvent, ...] | None = None
    turn: Turn | None = None
    choices: tuple[Answer, ...] = ()


@runtime_checkable
class Dialect(Protocol):
    """An HTTP API's wire shapes; :func:`serve_chat` does the rest.

    :ivar name: The dialect's name: ``GenerationRequest.dialect``, the namespace of its
        plugin-claimed request fields (``mlxrt_request_fields(dialect)``) and of
        ``mlxrt_prompt_canonicalize``.
    :ivar default_max_tokens: The answer's token limit when the body sets none
        (``--max-tokens`` overrides it; admission caps it to the context).

    Two members are optional. A dialect that answers several choices (``options.n > 1``, which
    only its decoder can ask for) has ``stream_choices(gens, assemblers, *, id, model, created,
    report, turn)``, :meth:`stream` over one engine request per choice, and reads
    ``Answer.choices`` in :meth:`body`. And because most dialects keep no state between
    requests, ``async def resolve(self, request: Request, turn: Turn) -> Turn``, run right after
    :meth:`decode` and before the model is chosen, binds the turn to what the server keeps
    for the client (Responses: the stored conversation ``previous_response_id`` continues,
    raising :class:`~mlxrt.errors.NotFound` for an unknown one, and where the answer is
    stored, under the caller's API key). :meth:`body` and :meth:`stream` are where such a
    dialect records the finished answer (a stream before its last frame, so that a client
    which reads it can already refer to it).
    """

    name: str
    default_max_tokens: int

    def decode(self, body: Mapping[str, Any], claimed: Mapping[str, type], *, strict: bool) -> Turn:
        """Validate ``body`` (a JSON object) into a :class:`Turn`; raise
        :class:`~mlxrt.errors.InvalidRequest` for a bad one. ``claimed``: plugin-claimed fields
        (return their values in ``options.extra``); ``strict``: unknown fields are a 400."""
        ...

    def new_id(self) -> str:
        """A fresh response id (``GenerationRequest.request_id``)."""
        ...

    def body(self, answer: Answer) -> Any:
        """The non-streamed response body (JSON-serializable)."""
        ...

    def stream(self, gen: Any, assembler: ResponseAssembler, *, id: str, model: str, created: int,
               report: CacheReport, turn: Turn) -> AsyncIterator[bytes]:
        """A streamed answer's frames: engine events (``gen``, which the stream owns and closes)
        through ``assembler`` into the wire's frames. Most dialects inherit it from
        :class:`Framed` and write only a :class:`~mlxrt.api.generation.FrameWriter`."""
        ...

    def render_error(self, status: int, type_: str, message: str, param: str | None,
                     code: str | None) -> dict[str, Any]:
        """An error's body (a refused request); mid-stream errors travel as :meth:`error_frame`."""
        ...

    def error_frame(self, exc: MlxrtError) -> bytes:
        """An error that happens after the stream started, as one frame (a stream whose error
        frame depends on its own state, such as a sequence number, catches its errors itself)."""
        ...


class Framed:
    """Base of a dialect whose stream is a grammar over assembled deltas: define
    :meth:`frames`; :meth:`stream` drives it with :func:`mlxrt.api.generation.assembled_stream`."""

    def frames(self, *, id: str, model: str, report: CacheReport, turn: Turn) -> FrameWriter:
        """The stream grammar for one streamed answer."""
        raise NotImplementedError

    def stream(self, gen: Any, assembler: ResponseAssembler, *, id: str, model: str, created: int,
               report: CacheReport, turn: Turn) -> AsyncIterator[bytes]:
        writer = self.frames(id=id, model=model, report=report, turn=turn)
        return assembled_stream(gen, assembler, writer, single_call=turn.single_call)


def route_opt(dialect: Dialect) -> dict[str, Any]:
    """The ``opt`` of a dialect's route handlers: its errors render in its shape."""
    return {"dialect": dialect.name, "render_error": dialect.render_error}


def plan(host: Any, options: RequestOptions, prompt_ids: Sequence[int], *, dialect: str, request_id: str,
         default_max_tokens: int, partition: str = "") -> GenerationRequest:
    """The engine request for decoded ``options`` and the tokenized prompt, canonicalized.

    ``--max-tokens`` (``host.options["max_tokens"]``) overrides ``default_max_tokens``;
    admission caps both to the context. An explicit ``options.max_tokens`` that cannot fit is
    refused, unless ``options.max_tokens_is_ceiling``: then it is capped like a default.
    Sampling follows :func:`mlxrt.engine.sampling.resolve_sampling`'s chain; a forcing
    ``tool_choice`` becomes a grammar or forced openings (:func:`mlxrt.api.generation.forced_tool_call`);
    an unknown ``adapter`` is a 400. ``partition`` is the caller (:func:`mlxrt.api.auth.caller_of`).
    """
    engine = host.engine
    vocab = engine.info.config_int("vocab_size")
    for token in options.logit_bias:
        if token < 0 or (vocab is not None and token >= vocab):
            raise InvalidRequest(f"logit_bias token id {token} is not in the vocabulary"
                                 + (f" (0 to {vocab - 1})" if vocab is not None else ""), param="logit_bias")
    option = host.options.get("max_tokens")
    default = option if option is not None else default_max_tokens
    requested = options.max_tokens
    if options.max_tokens_is_ceiling and requested is not None:
        default, requested = requested, None
    ceiling = engine.context_ceiling
    if options.n > 1:
        config = getattr(engine, "config", None)
        check_choices(options.n, getattr(config, "batch", 1), getattr(config, "max_queue", 0))
        ceiling = choice_ceiling(engine.info.context_window, getattr(engine, "safe_context", None), options.n)
    max_tokens = plan_max_tokens(len(prompt_ids), requested, default, ceiling, choices=options.n)
    sampling = resolve_sampling(options.sampling, host.options, engine.info.generation_config, seed=options.seed,
                                logit_bias=options.logit_bias)
    forced, structured = forced_tool_call(host, options.forced_tools, options.tools, prompt_ids,
                                          structured=options.structured)
    gen = GenerationRequest(
        request_id=request_id, prompt_ids=tuple(prompt_ids), max_tokens=max_tokens, sampling=sampling,
        stop=tuple(options.stop), dialect=dialect, extra=dict(options.extra), logprobs=options.logprobs,
        forced_prefixes=forced, structured=structured, num_draft_tokens=options.num_draft_tokens,
        adapters=registry.resolve(options.adapter) if (registry := getattr(engine, "adapters", None)) else (),
        partition=partition,
    )
    return canonicalize(host, gen, dialect)


def choice_requests(generation: GenerationRequest, n: int) -> tuple[GenerationRequest, ...]:
    """The engine requests of ``n`` choices of one planned request: the first is
    ``generation`` itself, each other has its own id (``<id>-<index>``) and a seed derived from
    the request's (:func:`mlxrt.engine.sampling.choice_seed`)."""
    return (generation, *(attrs.evolve(
        generation, request_id=f"{generation.request_id}-{i}",
        sampling=attrs.evolve(generation.sampling, seed=choice_seed(generation.sampling.seed, i)))
        for i in range(1, n)))


def prepare_request(host: Any, request: GenerationRequest) -> None:
    """Run ``mlxrt_prepare_request`` here (a caller already on a worker thread)."""
    host.collect("mlxrt_prepare_request", request=request, info=host.engine.info, host=host)


async def prepare(host: Any, request: GenerationRequest) -> None:
    """Run ``mlxrt_prepare_request`` for ``request`` on a worker thread (neither the event loop
    nor the engine thread): slow per-request work, such as compiling a grammar, and its 400s,
    happen before the request queues."""
    import anyio

    if host.pm.hook.mlxrt_prepare_request.get_hookimpls():  # else skip the thread hop
        await anyio.to_thread.run_sync(prepare_request, host, request)


def _plan_chat(host: Any, chat: ChatInput, options: RequestOptions, dialect: str, request_id: str,
               default_max_tokens: int, partition: str) -> tuple[RenderedPrompt, GenerationRequest]:
    engine = host.engine
    rendered = render_chat(host, engine.tokenizer, engine.profile, attrs.evolve(chat, tools=options.tools))
    gen = plan(host, options, rendered.ids, dialect=dialect, request_id=request_id,
               default_max_tokens=default_max_tokens, partition=partition)
    gen = rendered_request(gen, rendered)
    prepare_request(host, gen)
    return rendered, gen


async def planned_chat(request: Request, host: Any, chat: ChatInput, options: RequestOptions, *, dialect: str,
                       request_id: str, default_max_tokens: int) -> tuple[RenderedPrompt, GenerationRequest]:
    """Render ``chat`` (with ``options.tools``), plan and prepare its engine request, on a
    worker thread abandoned if the client leaves (templating and grammars may take a while)."""
    return await off_loop(request, _plan_chat, host, chat, options, dialect, request_id, default_max_tokens,
                          caller_of(request))


def _plan_text(host: Any, prompt: str, options: RequestOptions, dialect: str, request_id: str,
               default_max_tokens: int, partition: str) -> GenerationRequest:
    ids = encode_text(host.engine.tokenizer, prompt)
    gen = plan(host, options, ids, dialect=dialect, request_id=request_id, default_max_tokens=default_max_tokens,
               partition=partition)
    prepare_request(host, gen)
    return gen


async def planned_text(request: Request, host: Any, prompt: str, options: RequestOptions, *, dialect: str,
                       request_id: str, default_max_tokens: int) -> GenerationRequest:
    """A raw text prompt (no chat template), tokenized, planned and prepared off the loop."""
    return await off_loop(request, _plan_text, host, prompt, options, dialect, request_id, default_max_tokens,
                          caller_of(request))


def owned_adapters(request: Request, host: Any, options: RequestOptions) -> RequestOptions:
    """``options`` with its ``adapter`` names as the caller means them: its own mounts, else the
    server's; another API key's adapter is unknown (400), as if it were not mounted."""
    registry = getattr(host.engine, "adapters", None)
    if registry is None or options.adapter is None:
        return options
    return attrs.evolve(options, adapter=registry.qualify(options.adapter, caller_of(request)))


def assembler_for(host: Any, turn: Turn, rendered: RenderedPrompt, generation: GenerationRequest, *,
                  caller: str = "", observed: bool = True) -> ResponseAssembler:
    """Engine events → reasoning, content and tool calls, with the request's own tools; the
    finished turn is reported to ``mlxrt_turn_finished`` observers, as ``caller``'s
    (:func:`mlxrt.api.auth.caller_of`), unless not ``observed`` (of several choices, only the
    first is the conversation's turn)."""
    return ResponseAssembler(host.engine.profile, tools=turn.options.tools,
                             starts_in_thinking=rendered.starts_in_thinking,
                             on_finish=turn_observer(host, dialect=generation.dialect,
                                                     request_id=generation.request_id,
                                                     messages=turn.chat.messages, caller=caller,
                                                     store=turn.store) if observed else None)


async def serve_chat(request: Request, dialect: Dialect) -> Response:
    """A whole chat request for ``dialect``: decode (and resolve, when the dialect keeps state),
    pick the model, refuse an overlong body, plan and prepare, run, and answer with the
    dialect's body or stream."""
    host = request.app.state.host
    body = parse_json_object(await request.body())
    turn = dialect.decode(body, claimed_fields(host, dialect.name), strict=bool(host.options.get("strict")))
    if (resolve := getattr(dialect, "resolve", None)) is not None:  # optional: most dialects keep no state
        turn = await resolve(request, turn)
    host = await host_for(request, turn.model)
    turn = attrs.evolve(turn, host=host, options=owned_adapters(request, host, turn.options))
    await refuse_overlong_text(request, body, host)
    rendered, generation = await planned_chat(request, host, turn.chat, turn.options, dialect=dialect.name,
                                              request_id=dialect.new_id(),
                                              default_max_tokens=dialect.default_max_tokens)
    engine = host.engine
    model = engine.info.model_id
    created = int(time.time())
    if turn.options.n > 1:
        return await _serve_choices(request, dialect, turn, rendered, generation, created)
    assembler = assembler_for(host, turn, rendered, generation, caller=caller_of(request))
    # Admission errors (queue full, a failing sampler hook) surface here, as the status.
    gen, report = await start_generation(request, engine, generation)
    async with closing_on_error(gen):  # until a stream owns it
        headers = _chat_headers(turn, engine, report)
        if turn.stream:
            frames = dialect.stream(gen, assembler, id=generation.request_id, model=model, created=created,
                                    report=report, turn=turn)
            return sse_response(guarded(frames, dialect.error_frame), headers=headers)
    finish, logprobs = await drain_until_disconnect(request, gen, assembler.feed)
    answer = _answer(assembler, finish, logprobs, turn=turn, generation=generation, model=model, created=created,
                     headers=headers)
    return Response(content=dialect.body(answer), status_code=200, headers=headers)


def _chat_headers(turn: Turn, engine: Any, report: Any) -> dict[str, str]:
    """A chat answer's headers (one choice or several): the dialect's and the admission
    report's, and ``tools`` in ``x-mlxrt-ignored`` when the template rendered the tools but
    nothing can read calls back."""
    headers = response_headers(turn.headers, report)
    if turn.options.tools and engine.profile.tool_parser is None:
        headers[IGNORED_HEADER] = ", ".join(filter(None, [headers.get(IGNORED_HEADER), "tools"]))
    return headers


def _answer(assembler: ResponseAssembler, finish: FinishEvent, logprobs: list[TokenEvent], *, turn: Turn,
            generation: GenerationRequest, model: str, created: int, headers: dict[str, str]) -> Answer:
    """A drained generation's :class:`Answer` (the assembler flushed, the calls it keeps); a
    dropped partial call is said in ``headers``."""
    _delta, reason = assembler.finish(finish)
    if assembler.dropped_partial_call:  # a stream's headers are gone by then: the log says it
        headers[PARTIAL_CALL_HEADER] = "dropped"
    calls = assembler.tool_calls[:1] if turn.single_call else assembler.tool_calls
    return Answer(id=generation.request_id, model=model, content="".join(assembler.content),
                  reasoning="".join(assembler.reasoning), calls=calls, reason=reason, finish=finish,
                  created=created, logprobs=tuple(logprobs) if generation.logprobs is not None else None,
                  turn=turn)


async def _serve_choices(request: Request, dialect: Any, turn: Turn, rendered: RenderedPrompt,
                         generation: GenerationRequest, created: int) -> Response:
    """:func:`serve_chat` for several choices: one engine request each, submitted together."""
    host = turn.host
    stream_choices = getattr(dialect, "stream_choices", None)
    if stream_choices is None:
        raise InvalidRequest(f"n > 1 is not supported by the {dialect.name} dialect", param="n")
    if generation.vision is not None:
        raise InvalidRequest("n > 1 is not supported with image inputs", param="n")
    generations = choice_requests(generation, turn.options.n)
    assemblers = [assembler_for(host, turn, rendered, g, caller=caller_of(request), observed=i == 0)
                  for i, g in enumerate(generations)]
    model = host.engine.info.model_id
    gens, report = await start_choices(request, host.engine, generations)
    headers = _chat_headers(turn, host.engine, report)
    if turn.stream:
        frames = stream_choices(gens, assemblers, id=generation.request_id, model=model, created=created,
                                report=report, turn=turn)
        return sse_response(guarded(frames, dialect.error_frame), headers=headers)

    results = await drain_choices(request, gens, [assembler.feed for assembler in assemblers])
    answers = tuple(_answer(assembler, finish, logprobs, turn=turn, generation=generation, model=model,
                            created=created, headers=headers) for assembler, (finish, logprobs) in zip(assemblers, results, strict=True))
    answer = attrs.evolve(answers[0], choices=answers)
    return Response(content=dialect.body(answer), status_code=200, headers=headers)
