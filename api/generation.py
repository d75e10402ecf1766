"""The pieces of the request pipeline (:mod:`mlxrt.api.pipeline`) a dialect may also use on
its own: response headers, output-format decoding, ``tool_choice`` enforcement, turn
observers, the overlong-body check, and stream framing (:class:`FrameWriter`,
:func:`assembled_stream`, error frames once a stream runs).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import Any, Protocol

from mlxrt.assembly import ResponseAssembler
from mlxrt.capabilities import STRUCTURED_OUTPUTS, declared
from mlxrt.errors import InvalidRequest, MlxrtError, OverBudget
from mlxrt.records import (
    CacheReport,
    FinishedTurn,
    FinishEvent,
    FinishReason,
    StructuredOutput,
    ToolCall,
)

__all__ = ["CACHE_HEADER", "response_headers", "forced_openings", "forced_tool_call", "guarded", "merged",
           "tool_input", "FrameWriter", "assembled_stream", "structured_output", "json_schema_output",
           "turn_observer", "refuse_overlong_text", "check_text_length", "MAX_CHARS_PER_TOKEN"]

#: What the prompt cache did for the request (:meth:`mlxrt.records.CacheReport.header`).
CACHE_HEADER = "x-mlxrt-cache"


def response_headers(headers: Mapping[str, str], report: CacheReport) -> dict[str, str]:
    """A completion's headers: the decoder's (``x-mlxrt-ignored`` ...) plus the cache report."""
    return {**headers, CACHE_HEADER: report.header()}


#: Characters one token covers at most, generously (tokens of long whitespace runs reach a
#: few dozen): a body with more prompt text than ``context_ceiling`` × this cannot fit, so it
#: is refused before templating and tokenizing it (a 50 MB body took a minute and gigabytes).
MAX_CHARS_PER_TOKEN = 32


async def refuse_overlong_text(request: Any, body: Any, host: Any) -> None:
    """Refuse (400, the context-length error) a generation body whose text alone is too long
    for the context of the model that would serve it (``host``), before anything templates or
    tokenizes it."""
    ceiling = host.engine.context_ceiling
    if ceiling is not None and len(await request.body()) > ceiling * MAX_CHARS_PER_TOKEN:  # else none can be
        check_text_length(body, ceiling)


def check_text_length(body: Any, ceiling: int) -> None:
    """Raise :class:`OverBudget` when the strings of ``body`` (inline ``data:`` URLs, images
    and files, left out) hold more than ``ceiling`` tokens can cover."""
    total, stack = 0, [body]
    while stack:  # iterative: bodies may nest as deep as the JSON parser allowed
        item = stack.pop()
        if isinstance(item, str):
            if not item.startswith("data:"):
                total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    if total > ceiling * MAX_CHARS_PER_TOKEN:
        raise OverBudget(
            f"request needs more than {ceiling} tokens of context (its text is {total} characters, at most "
            f"{MAX_CHARS_PER_TOKEN} per token) but the context holds {ceiling} — shorten the prompt",
            code="context_over_budget",
        )


def turn_observer(host: Any, *, dialect: str, request_id: str, messages: Sequence[Mapping[str, Any]],
                  caller: str = "", store: bool = True) -> Callable[[ResponseAssembler, FinishReason], None] | None:
    """The ``on_finish`` of a chat request's :class:`ResponseAssembler`: reports the answered
    turn to ``mlxrt_turn_finished`` observers (``None`` when no plugin observes turns), with
    who asked (``caller``) and whether the client lets it be kept (``store``).

    An observer's failure is logged, never raised (:meth:`mlxrt.host.PluginHost.notify`): the
    client's answer is already complete.
    """
    if not host.pm.hook.mlxrt_turn_finished.get_hookimpls():
        return None

    def report(assembler: ResponseAssembler, reason: FinishReason) -> None:
        if reason == FinishReason.CANCELLED:
            return
        turn = FinishedTurn(dialect=dialect, request_id=request_id, model=host.engine.info.model_id,
                            messages=tuple(messages), content="".join(assembler.content),
                            reasoning="".join(assembler.reasoning), tool_calls=assembler.tool_calls,
                            finish_reason=reason, caller=caller, store=store)
        host.notify("mlxrt_turn_finished", turn=turn, host=host)

    return report


def json_schema_output(schema: Any, *, param: str) -> StructuredOutput:
    """A JSON-schema constraint; the schema's compact JSON keys the grammar cache.

    Keys keep the client's order: property order is the order of the generated object."""
    import json

    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param}: the schema must be a JSON object", param=param)
    return StructuredOutput(kind="json_schema", spec=json.dumps(schema, separators=(",", ":")),
                            param=param)


def structured_output(value: Any, *, param: str = "response_format",
                      flat: bool = False) -> StructuredOutput | None:
    """An OpenAI-shaped output format → the engine's constraint (``None``: free text).

    ``{"type": "json_object"}``; ``{"type": "json_schema", "json_schema": {"name", "schema",
    "strict"}}`` (``flat``: the Responses shape, ``name``/``schema`` beside ``type``); and the
    mlxrt extensions ``{"type": "regex", "regex": "..."}`` and ``{"type": "choice",
    "choices": ["a", "b"]}``. Whether the schema compiles is checked later, off the event loop
    (:func:`mlxrt.api.pipeline.planned_chat`).
    """
    import json

    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(kind="json_object", param=param)
    if kind == "json_schema":
        body = value if flat else value.get("json_schema")
        where = param if flat else f"{param}.json_schema"
        if not isinstance(body, dict):
            raise InvalidRequest(f"{where} must be an object with a schema", param=param)
        if body.get("name") is not None and not isinstance(body["name"], str):
            raise InvalidRequest(f"{where}.name must be a string", param=param)
        if body.get("strict") is not None and not isinstance(body["strict"], bool):
            raise InvalidRequest(f"{where}.strict must be a boolean", param=param)
        # No schema is any JSON value's schema; OpenAI requires one, we accept the default.
        return json_schema_output(body.get("schema", {}), param=f"{where}.schema")
    if kind == "regex":
        if not isinstance(value.get("regex"), str) or not value["regex"]:
            raise InvalidRequest(f"{param}.regex must be a non-empty string", param=param)
        return StructuredOutput(kind="regex", spec=value["regex"], param=f"{param}.regex")
    if kind == "choice":
        choices = value.get("choices")
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise InvalidRequest(f"{param}.choices must be a non-empty list of non-empty strings", param=param)
        return StructuredOutput(kind="choice", spec=json.dumps(choices), param=f"{param}.choices")
    raise InvalidRequest(f"{param}.type must be one of text, json_object, json_schema, regex, choice",
                         param=param)


def forced_openings(engine: Any, names: Sequence[str], prompt_ids: Sequence[int], *,
                    param: str) -> tuple[tuple[int, ...], ...]:
    """Token openings that force the answer to start with a call to one of ``names``: the
    family parser's ``opening(name)``, after the reasoning close marker when the prompt left
    a think block open (:func:`mlxrt.text.tool_calls.tool_choice_prefixes`, shared by every
    dialect). A parser without ``opening`` cannot enforce the choice: the client's 400.
    """
    from mlxrt.text.tool_calls import tool_choice_prefixes

    return tool_choice_prefixes(engine.profile, engine.tokenizer, names, prompt_ids, param=param)


def forced_tool_call(host: Any, names: Sequence[str], tools: Sequence[Mapping[str, Any]] | None,
                     prompt_ids: Sequence[int], *, param: str = "tool_choice",
                     structured: StructuredOutput | None = None
                     ) -> tuple[tuple[tuple[int, ...], ...], StructuredOutput | None]:
    """How a request whose ``tool_choice`` forces a call to one of ``names`` is enforced:
    ``(forced_prefixes, structured)`` for its :class:`~mlxrt.records.GenerationRequest`.

    By grammar when the family's parser describes its calls (``call_grammar``, see
    :mod:`mlxrt.text.tool_grammar`) and a plugin declares ``structured_outputs`` (:mod:`mlxrt.capabilities`): the whole call,
    markup and schema-valid arguments, is enforced. Otherwise the call's opening is forced
    (:func:`forced_openings`) and the model writes the arguments. A forced call cannot also
    follow another constraint (``response_format``): the client's 400. With no forced call, a
    model whose tools mlxrt renders itself (:mod:`mlxrt.text.generic_tools`) has its reply held
    to free text or one well-formed call (:func:`mlxrt.text.tool_grammar.auto_tool_constraint`).
    """
    from mlxrt.text.tool_calls import reasoning_lead
    from mlxrt.text.tool_grammar import auto_tool_constraint, tool_call_constraint

    engine = host.engine
    if not names:
        renders_tools = getattr(engine.profile, "tool_prompt", None) is not None
        if tools and renders_tools and structured is None and STRUCTURED_OUTPUTS in declared(host):
            # tool_choice "auto" on a model whose tools mlxrt renders: text, or a well-formed call
            structured = auto_tool_constraint(engine.profile, engine.tokenizer, tools)
        return (), structured
    if STRUCTURED_OUTPUTS in declared(host):
        lead = reasoning_lead(engine.profile, engine.tokenizer, prompt_ids)
        constraint = tool_call_constraint(engine.profile, engine.tokenizer, names, tools, lead, param=param)
        if constraint is not None:
            if structured is not None:
                raise InvalidRequest(f"{param} forcing a tool call cannot be combined with {structured.param}",
                                     param=param)
            return (), constraint
    return forced_openings(engine, names, prompt_ids, param=param), structured


def tool_input(call: ToolCall) -> dict[str, Any]:
    """A parsed call's arguments as an object (``{"_raw": text}`` when they are not one)."""
    import json

    try:
        value = json.loads(call.arguments or "{}")
    except json.JSONDecodeError:
        return {"_raw": call.arguments}
    return value if isinstance(value, dict) else {"_raw": call.arguments}


async def guarded(frames: AsyncIterator[bytes], error_frame: Callable[[MlxrtError], bytes]) -> AsyncIterator[bytes]:
    """Pass SSE frames through; an error mid-stream becomes the dialect's error frame.

    The headers are gone by then, so the error travels in the stream, which then closes
    without its normal end.
    """
    async with aclosing(frames):  # a client that leaves closes the inner stream (and cancels) now
        try:
            async for frame in frames:
                yield frame
        except MlxrtError as exc:
            yield error_frame(exc)


async def merged(streams: Sequence[AsyncIterator[bytes]]) -> AsyncIterator[bytes]:
    """The frames of several streams (the choices of one request) as each produces them, every
    stream's in its own order. The first error ends the merge and closes the other streams, as
    does closing the merge (the client left): each closes its engine request."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:
            async for frame in only:
                yield frame
        return
    import asyncio

    queue: asyncio.Queue[tuple[bytes | None, BaseException | None]] = asyncio.Queue()

    async def pump(stream: AsyncIterator[bytes]) -> None:
        try:
            async with aclosing(stream):
                async for frame in stream:
                    queue.put_nowait((frame, None))
        except Exception as exc:  # handed to the reader, which raises it
            queue.put_nowait((None, exc))
            return
        queue.put_nowait((None, None))

    tasks = [asyncio.ensure_future(pump(stream)) for stream in streams]
    try:
        done = 0
        while done < len(tasks):
            frame, error = await queue.get()
            if error is not None:
                raise error
            if frame is None:
                done += 1
            else:
                yield frame
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class FrameWriter(Protocol):
    """A dialect's stream grammar over assembled deltas (:func:`assembled_stream` drives it)."""

    def start(self) -> list[bytes]: ...

    def feed(self, *, reasoning: str = "", text: str = "") -> list[bytes]: ...

    def finish(self, calls: tuple[ToolCall, ...], reason: FinishReason, finish: FinishEvent) -> list[bytes]: ...


async def assembled_stream(gen: Any, assembler: ResponseAssembler, writer: FrameWriter, *,
                           single_call: bool = False) -> AsyncIterator[bytes]:
    """Engine events → reasoning/text deltas (``assembler``) → the dialect's frames (``writer``).

    Tool calls are known at the end; ``single_call`` keeps only the first (a client that
    turned parallel calls off). Owns ``gen``: closing this stream (the client left) closes the
    engine request.
    """
    async with aclosing(gen):
        for frame in writer.start():
            yield frame
        async for event in gen:
            if isinstance(event, FinishEvent):
                last, reason = assembler.finish(event)
                for frame in writer.feed(reasoning=last.reasoning, text=last.content):
                    yield frame
                calls = assembler.tool_calls[:1] if single_call else assembler.tool_calls
                for frame in writer.finish(calls, reason, event):
                    yield frame
                return
            delta = assembler.feed(event.text)
            for frame in writer.feed(reasoning=delta.reasoning, text=delta.content):
                yield frame
