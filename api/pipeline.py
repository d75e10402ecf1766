"""The one HTTP path every generation request takes: decode → plan → prepare → engine →
assemble → encode.

A dialect owns only its wire shapes: it decodes a body into a :class:`Turn` (the chat the
model sees and a :class:`~mlxrt.records.RequestOptions`) and encodes the answer as a body or
stream frames. The model work between is the served model's (:mod:`mlxrt.serving`: planning,
``--max-tokens``, the sampling chain, logit-bias checks, ``tool_choice`` enforcement,
``mlxrt_prompt_canonicalize`` and ``mlxrt_prepare_request``), so it behaves the same on every
API; this module adds the wire edge — the client's connection, headers, framing:

- :func:`planned_chat` / :func:`planned_text` render or tokenize, plan and prepare
  (:meth:`mlxrt.serving.ServedModel.plan_chat` / ``plan_text``) on a worker thread abandoned
  if the client leaves — never on the event loop, never on the engine thread;
- :func:`assembler_for` makes the answer's :class:`~mlxrt.assembly.ResponseAssembler` from the
  request's own options (its tools) and reports the finished turn to observers;
- :func:`serve_chat` runs a whole request for a :class:`Dialect` (a dialect with server-side
  state, such as Responses' stored conversations, binds it in its optional ``resolve`` step),
  several choices (``options.n``) included;
- :func:`serve_text` runs a whole raw-prompt completion for a :class:`TextDialect`.

Writing a dialect: docs/plugins/dialects.md.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs
from litestar import Request, Response

from mlxrt.api.app import claimed_fields
from mlxrt.api.auth import caller_of
from mlxrt.api.disconnect import (
    closing_choices,
    closing_on_error,
    drain_choices,
    drain_until_disconnect,
    off_loop,
    start_choices,
    start_generation,
)
from mlxrt.api.framing import FrameWriter, assembled_stream, guarded
from mlxrt.api.headers import finish_headers, response_headers
from mlxrt.api.models import model_for
from mlxrt.api.observers import turn_observer
from mlxrt.api.sse import sse_data, sse_event, sse_response
from mlxrt.api.text_limits import refuse_overlong_text
from mlxrt.api.wire import IGNORED_HEADER, parse_json_object
from mlxrt.assembly import ResponseAssembler
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
from mlxrt.serving import ServedModel, choice_requests
from mlxrt.templating import RenderedPrompt
from mlxrt.text.tool_calls import PARTIAL_CALL_HEADER

if TYPE_CHECKING:
    from mlxrt.engine.bridge import Generation
    from mlxrt.registry import PluginHost

__all__ = ["Turn", "Answer", "Dialect", "Framed", "planned_chat", "planned_text",
           "TextTurn", "TextAnswer", "TextDialect", "serve_text",
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
    :ivar host: The plugin host, set by the pipeline (an encoder reads server options).
    :ivar served: The model serving the turn, set by the pipeline once it is chosen, for an
        encoder that needs it (Responses counts reasoning tokens with its tokenizer).
    :ivar store: The client lets the server keep the turn (Responses' ``store: false`` does
        not): told to turn observers (:attr:`mlxrt.records.FinishedTurn.store`).
    """

    chat: ChatInput
    options: RequestOptions = RequestOptions()
    model: str | None = None
    stream: bool = False
    headers: Mapping[str, str] = attrs.field(factory=dict)
    single_call: bool = False
    wire: Any = None  # the dialect's own type, opaque here
    host: PluginHost | None = None
    served: ServedModel | None = None
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
    turn: Turn = attrs.field(kw_only=True)
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
               report: CacheReport, turn: Turn) -> AsyncGenerator[bytes, None]:
        """A streamed answer's frames: engine events (``gen``, which the stream owns and closes)
        through ``assembler`` into the wire's frames. Most dialects inherit it from
        :class:`Framed` and write only a :class:`~mlxrt.api.framing.FrameWriter`."""
        ...

    def render_error(self, status: int, type_: str, message: str, param: str | None,
                     code: str | None) -> dict[str, Any]:
        """An error's body (a refused request); mid-stream errors travel as :meth:`error_frame`."""
        ...

    @property
    def error_frame(self) -> Callable[[MlxrtError], bytes] | None:
        """An error that happens after the stream started, as one frame; ``None`` where the
        dialect's stream catches its own errors (its error frame depends on the stream's state,
        such as a sequence number). Read only: a method or a ``None`` attribute satisfies it."""
        ...


class Framed:
    """Base of a dialect whose stream is a grammar over assembled deltas: define
    :meth:`frames`; :meth:`stream` drives it with :func:`mlxrt.api.framing.assembled_stream`."""

    def frames(self, *, id: str, model: str, report: CacheReport, turn: Turn) -> FrameWriter:
        """The stream grammar for one streamed answer."""
        raise NotImplementedError

    def stream(self, gen: Any, assembler: ResponseAssembler, *, id: str, model: str, created: int,
               report: CacheReport, turn: Turn) -> AsyncGenerator[bytes, None]:
        writer = self.frames(id=id, model=model, report=report, turn=turn)
        return assembled_stream(gen, assembler, writer, single_call=turn.single_call)


def _guarded(frames: AsyncGenerator[bytes, None], dialect: Dialect) -> AsyncGenerator[bytes, None]:
    """``frames`` with a mid-stream error as the dialect's error frame; as they are where the
    dialect's stream catches its own errors (``error_frame`` None: Responses, which has no ``n``)."""
    return frames if dialect.error_frame is None else guarded(frames, dialect.error_frame)


def route_opt(dialect: Dialect) -> dict[str, Any]:
    """The ``opt`` of a dialect's route handlers: its errors render in its shape."""
    opt = {"dialect": dialect.name, "render_error": dialect.render_error}
    if (word := getattr(dialect, "error_message", None)) is not None:  # optional: the dialect's own words
        opt["error_message"] = word
    return opt


async def planned_chat(request: Request[Any, Any, Any], model: ServedModel, chat: ChatInput,
                       options: RequestOptions, *, dialect: str, request_id: str, default_max_tokens: int
                       ) -> tuple[RenderedPrompt, GenerationRequest]:
    """Render ``chat`` (with ``options.tools``), plan and prepare its engine request
    (:meth:`mlxrt.serving.ServedModel.plan_chat`), on a worker thread abandoned if the client
    leaves (templating and grammars may take a while)."""
    return await off_loop(request, lambda: model.plan_chat(
        chat, options, dialect=dialect, request_id=request_id, default_max_tokens=default_max_tokens,
        partition=caller_of(request)))


async def planned_text(request: Request[Any, Any, Any], model: ServedModel, prompt: str, options: RequestOptions,
                       *, dialect: str, request_id: str, default_max_tokens: int) -> GenerationRequest:
    """A raw text prompt (no chat template), tokenized, planned and prepared off the loop
    (:meth:`mlxrt.serving.ServedModel.plan_text`)."""
    return await off_loop(request, lambda: model.plan_text(
        prompt, options, dialect=dialect, request_id=request_id, default_max_tokens=default_max_tokens,
        partition=caller_of(request)))


def owned_adapters(request: Request[Any, Any, Any], model: ServedModel, options: RequestOptions) -> RequestOptions:
    """``options`` with its ``adapter`` names as the caller means them: its own mounts, else the
    server's; another API key's adapter is unknown (400), as if it were not mounted."""
    registry = model.adapters
    if registry is None or options.adapter is None:
        return options
    return attrs.evolve(options, adapter=registry.qualify(options.adapter, caller_of(request)))


def assembler_for(host: PluginHost, model: ServedModel, turn: Turn, rendered: RenderedPrompt,
                  generation: GenerationRequest, *, caller: str = "", observed: bool = True) -> ResponseAssembler:
    """Engine events → reasoning, content and tool calls, with the request's own tools; the
    finished turn is reported to ``mlxrt_turn_finished`` observers, as ``caller``'s
    (:func:`mlxrt.api.auth.caller_of`), unless not ``observed`` (of several choices, only the
    first is the conversation's turn)."""
    return ResponseAssembler(model.profile, tools=turn.options.tools,
                             starts_in_thinking=rendered.starts_in_thinking,
                             on_finish=turn_observer(host, model, dialect=generation.dialect,
                                                     request_id=generation.request_id,
                                                     messages=turn.chat.messages, caller=caller,
                                                     store=turn.store) if observed else None)


async def serve_chat(request: Request[Any, Any, Any], dialect: Dialect) -> Response[Any]:
    """A whole chat request for ``dialect``: decode (and resolve, when the dialect keeps state),
    pick the model, refuse an overlong body, plan and prepare, run, and answer with the
    dialect's body or stream."""
    host = request.app.state.host
    body = parse_json_object(await request.body())
    turn = dialect.decode(body, claimed_fields(host, dialect.name), strict=bool(host.options.get("strict")))
    if (resolve := getattr(dialect, "resolve", None)) is not None:  # optional: most dialects keep no state
        turn = await resolve(request, turn)
    served = await model_for(request, turn.model)
    turn = attrs.evolve(turn, host=host, served=served, options=owned_adapters(request, served, turn.options))
    await refuse_overlong_text(request, body, served)
    rendered, generation = await planned_chat(request, served, turn.chat, turn.options, dialect=dialect.name,
                                              request_id=dialect.new_id(),
                                              default_max_tokens=dialect.default_max_tokens)
    model = served.info.model_id
    created = int(time.time())
    if turn.options.n > 1:
        return await _serve_choices(request, dialect, turn, rendered, generation, created)
    assembler = assembler_for(host, served, turn, rendered, generation, caller=caller_of(request))
    # Admission errors (queue full, a failing sampler hook) surface here, as the status.
    gen, report = await start_generation(request, served, generation)
    async with closing_on_error(gen):  # until a stream owns it
        headers = _chat_headers(turn, served, report, generation)
        if turn.stream:
            frames = dialect.stream(gen, assembler, id=generation.request_id, model=model, created=created,
                                    report=report, turn=turn)
            return sse_response(_guarded(frames, dialect), headers=headers)
    finish, logprobs = await drain_until_disconnect(request, gen, assembler.feed)
    answer = _answer(assembler, finish, logprobs, turn=turn, generation=generation, model=model, created=created,
                     headers=headers)
    return Response(content=dialect.body(answer), status_code=200, headers=headers)


def _chat_headers(turn: Turn, served: ServedModel, report: CacheReport, generation: GenerationRequest
                  ) -> dict[str, str]:
    """A chat answer's headers (one choice or several): the dialect's, the admission report's
    (a reduced ``max_tokens`` too), and ``tools`` in ``x-mlxrt-ignored`` when the template
    rendered the tools but nothing can read calls back."""
    headers = response_headers(turn.headers, report, asked=turn.options.max_tokens, granted=generation.max_tokens)
    if turn.options.tools and served.profile.tool_parser is None:
        headers[IGNORED_HEADER] = ", ".join(filter(None, [headers.get(IGNORED_HEADER), "tools"]))
    return headers


def _answer(assembler: ResponseAssembler, finish: FinishEvent, logprobs: list[TokenEvent], *, turn: Turn,
            generation: GenerationRequest, model: str, created: int, headers: dict[str, str]) -> Answer:
    """A drained generation's :class:`Answer` (the assembler flushed, the calls it keeps); a
    dropped partial call is said in ``headers``."""
    _delta, reason = assembler.finish(finish)
    if assembler.dropped_partial_call:  # a stream's headers are gone by then: the log says it
        headers[PARTIAL_CALL_HEADER] = "dropped"
    finish_headers(headers, (finish,))
    calls = assembler.tool_calls[:1] if turn.single_call else assembler.tool_calls
    return Answer(id=generation.request_id, model=model, content="".join(assembler.content),
                  reasoning="".join(assembler.reasoning), calls=calls, reason=reason, finish=finish,
                  created=created, logprobs=tuple(logprobs) if generation.logprobs is not None else None,
                  turn=turn)


async def _serve_choices(request: Request[Any, Any, Any], dialect: Any, turn: Turn, rendered: RenderedPrompt,
                         generation: GenerationRequest, created: int) -> Response[Any]:
    """:func:`serve_chat` for several choices: one engine request each, submitted together."""
    host, served = turn.host, turn.served
    assert host is not None and served is not None  # serve_chat set them
    stream_choices = getattr(dialect, "stream_choices", None)
    if stream_choices is None:
        raise InvalidRequest(f"n > 1 is not supported by the {dialect.name} dialect", param="n")
    if generation.vision is not None:
        raise InvalidRequest("n > 1 is not supported with image inputs", param="n")
    generations = choice_requests(generation, turn.options.n)
    assemblers = [assembler_for(host, served, turn, rendered, g, caller=caller_of(request), observed=i == 0)
                  for i, g in enumerate(generations)]
    model = served.info.model_id
    gens, report = await start_choices(request, served, generations)
    headers = _chat_headers(turn, served, report, generation)
    if turn.stream:
        frames = stream_choices(gens, assemblers, id=generation.request_id, model=model, created=created,
                                report=report, turn=turn)
        return sse_response(_guarded(closing_choices(frames, gens), dialect), headers=headers)

    results = await drain_choices(request, gens, [assembler.feed for assembler in assemblers])
    answers = tuple(_answer(assembler, finish, logprobs, turn=turn, generation=generation, model=model,
                            created=created, headers=headers) for assembler, (finish, logprobs) in zip(assemblers, results, strict=True))
    answer = attrs.evolve(answers[0], choices=answers)
    return Response(content=dialect.body(answer), status_code=200, headers=headers)


@attrs.frozen
class TextTurn:
    """A decoded text-completion body (no chat template, no reasoning or tools).

    :ivar prompt: The raw prompt, tokenized with the tokenizer's own special-token handling.
    :ivar options: How to answer (``n`` choices, sampling, stops, logprobs …).
    :ivar model: The body's ``model`` (``None``: the default).
    :ivar stream: Answer as a stream of frames rather than one body.
    :ivar headers: Response headers the decoder adds (``x-mlxrt-ignored`` …).
    :ivar wire: The dialect's own decoded body, for its encoder.
    :ivar host: The plugin host, set by the pipeline.
    :ivar served: The model serving the turn, set by the pipeline once it is chosen.
    """

    prompt: str
    options: RequestOptions = RequestOptions()
    model: str | None = None
    stream: bool = False
    headers: Mapping[str, str] = attrs.field(factory=dict)
    wire: Any = None  # the dialect's own type, opaque here
    host: PluginHost | None = None
    served: ServedModel | None = None


@attrs.frozen
class TextAnswer:
    """One finished choice of a text completion: its whole ``text`` (the finish event's held-back
    text included), and its tokens' events when the request asked for log-probabilities."""

    id: str
    model: str
    text: str
    finish: FinishEvent
    created: int
    logprobs: Sequence[TokenEvent] | None = None


@runtime_checkable
class TextDialect(Protocol):
    """A raw-prompt completion API's wire shapes; :func:`serve_text` does the rest. ``name`` and
    ``default_max_tokens`` are read only (a frozen record's fields satisfy them)."""

    @property
    def name(self) -> str: ...

    @property
    def default_max_tokens(self) -> int: ...

    def decode(self, body: Mapping[str, Any], claimed: Mapping[str, type], *, strict: bool) -> TextTurn:
        """Validate ``body`` into a :class:`TextTurn` (:class:`~mlxrt.errors.InvalidRequest` if bad)."""
        ...

    def new_id(self) -> str:
        """A fresh response id."""
        ...

    def body(self, answers: Sequence[TextAnswer], turn: TextTurn) -> Any:
        """The non-streamed body of every choice (``answers`` in index order)."""
        ...

    def stream(self, gens: Sequence[Generation], *, id: str, model: str, created: int, turn: TextTurn
               ) -> AsyncGenerator[bytes, None]:
        """The frames of every choice's engine request (the stream owns and closes ``gens``)."""
        ...

    def error_frame(self, exc: MlxrtError) -> bytes:
        """An error after the stream started, as one frame."""
        ...


async def serve_text(request: Request[Any, Any, Any], dialect: TextDialect) -> Response[Any]:
    """A whole text-completion request for ``dialect``: decode, pick the model, refuse an
    overlong body, tokenize, plan and prepare off the loop, run its choices, and answer with
    the dialect's body or stream. Completions are not chat turns: no observer is told."""
    host = request.app.state.host
    body = parse_json_object(await request.body())
    turn = dialect.decode(body, claimed_fields(host, dialect.name), strict=bool(host.options.get("strict")))
    served = await model_for(request, turn.model)
    turn = attrs.evolve(turn, host=host, served=served)
    await refuse_overlong_text(request, body, served)
    options = owned_adapters(request, served, turn.options)
    generation = await planned_text(request, served, turn.prompt, options, dialect=dialect.name,
                                    request_id=dialect.new_id(), default_max_tokens=dialect.default_max_tokens)
    model = served.info.model_id
    created = int(time.time())
    gens, report = await start_choices(request, served, choice_requests(generation, options.n))
    headers = response_headers(turn.headers, report, asked=options.max_tokens, granted=generation.max_tokens)
    if turn.stream:  # the stream owns the engine requests from here
        frames = dialect.stream(gens, id=generation.request_id, model=model, created=created, turn=turn)
        return sse_response(guarded(closing_choices(frames, gens), dialect.error_frame), headers=headers)
    texts: list[list[str]] = [[] for _ in gens]
    results = await drain_choices(request, gens, [parts.append for parts in texts])
    finish_headers(headers, (finish for finish, _ in results))
    answers = [TextAnswer(id=generation.request_id, model=model, text="".join(parts) + finish.text, finish=finish,
                          created=created, logprobs=logprobs if generation.logprobs is not None else None)
               for parts, (finish, logprobs) in zip(texts, results, strict=True)]
    return Response(content=dialect.body(answers, turn), status_code=200, headers=headers)
