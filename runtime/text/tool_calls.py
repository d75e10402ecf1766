"""Tool-call routing, argument typing and ``tool_choice`` enforcement.

Routing (``buffered-text`` and ``gemma-sentinel`` modes) makes the answer's calls a function
of its whole text and of how the generation ended, the same for every dialect, streamed or
not: content streams as usual until the family parser's start marker appears (a text that may
still become the marker is held back); from there the text is held and split when generation
ends (:func:`split_calls`) into text and calls. Where a call ends is the parser's to say
(``call_end``, :class:`mlxrt.records.ToolCallExtent`): a value may hold the family's own
markup wherever its format can express it (a JSON string holding ``</tool_call>``, a MiniCPM5
CDATA value holding ``</function>``); without ``call_end`` the first end marker closes a call.

- A finished call is parsed and reported, its arguments typed by the tool's schema; one that
  cannot be parsed, or that names a tool the request did not offer, is returned as content
  with a warning: never dropped silently, never a server error.
- An unfinished call (the turn ended, at ``max_tokens``, a stop string or the model's own end
  of turn, before the call's end; or inside the opening of one) is no call and shows no
  markup: it is dropped, with a warning in the log and ``RoutedTools.dropped`` set for the
  response's ``x-mlxrt-partial-tool-call`` header. At a cut, a last call that does not parse
  is taken for an unfinished one. Calls finished before it are kept (mlx-lm's rule).
- Text between and after calls is the model's: content (mlx-lm keeps it), each piece with the
  whitespace around the calls trimmed; blank separators are dropped.

In ``gemma-sentinel`` mode the markers are the tokenizer's own single sentinel tokens (the
family checked they exist), which the engine's detokenizer always writes out as their text.

``tool_choice`` ``"required"`` or a named function is enforced by a logits processor that
forces the answer's first tokens to a tool-call opening (:func:`tool_choice_processors`), or
by a grammar of the whole call (:mod:`mlxrt.text.tool_grammar`).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from mlxrt.records import ThinkingFormat, ToolCall, ToolParser, ToolStreamMode

__all__ = ["ToolRouter", "RoutedTools", "Piece", "split_calls", "call_texts", "call_bodies", "call_end", "offered_names", "PARTIAL_CALL_HEADER",
           "typed_arguments", "ForcedPrefix", "tool_choice_processors", "tool_choice_prefixes", "reasoning_lead",
           "tool_parameters"]

log = logging.getLogger("mlxrt.tools")


#: Response header set when an unfinished call (cut by ``max_tokens`` or a stop string, or
#: left open by the model's end of turn) was dropped.
PARTIAL_CALL_HEADER = "x-mlxrt-partial-tool-call"

#: Shortest held text taken for the start of a call's opening at the end of a turn: a lone
#: ``<`` is as likely the model's text.
_MIN_OPENING = 2


@attrs.frozen
class RoutedTools:
    """What routing made of an answer: the rest of its content, its calls, and what went wrong.

    :ivar warning: Why markup was not read as calls (a malformed call or one to a tool that
        was not offered, returned as content), or that an unfinished call was dropped.
    :ivar dropped: An unfinished call was dropped (no call, no markup).
    """

    content: str
    calls: tuple[ToolCall, ...]
    warning: str | None = None
    dropped: bool = False


@attrs.frozen
class Piece:
    """One stretch of captured text: ``text`` (the model's own), a finished ``call``'s markup,
    or an ``unfinished`` call (from its start marker to the end of the text)."""

    kind: Literal["text", "call", "unfinished"]
    text: str


def call_end(parser: ToolParser, text: str) -> int | None:
    """Where the call at the start of ``text`` ends (just past its end marker), or ``None``
    when ``text`` holds no finished call: the parser's ``call_end`` when it has one, else the
    first end marker."""
    own = getattr(parser, "call_end", None)
    if callable(own):
        end = own(text)
        return None if end is None else int(end)
    at = text.find(parser.end, len(parser.start))
    return None if at < 0 else at + len(parser.end)


def call_texts(parser: ToolParser, text: str) -> list[str]:
    """The markup of each finished call in ``text`` (text outside the calls is ignored), for a
    parser's ``parse``.

    :raises ValueError: when ``text`` holds no call, or an unfinished one.
    """
    calls = []
    for piece in split_calls(parser, text):
        if piece.kind == "unfinished":
            raise ValueError(f"unfinished tool call: {piece.text[:80]!r}")
        if piece.kind == "call":
            calls.append(piece.text)
    if not calls:
        raise ValueError(f"no {parser.start} block")
    return calls


def call_bodies(parser: ToolParser, text: str) -> list[str]:
    """The text between the start and end markers of each finished call in ``text``, stripped
    (:func:`call_texts`)."""
    return [c[len(parser.start): len(c) - len(parser.end)].strip() for c in call_texts(parser, text)]


def split_calls(parser: ToolParser, text: str) -> list[Piece]:
    """``text`` as text, finished calls and at most one unfinished call (last)."""
    pieces: list[Piece] = []
    pos = 0
    while (at := text.find(parser.start, pos)) >= 0:
        if at > pos:
            pieces.append(Piece("text", text[pos:at]))
        end = call_end(parser, text[at:])
        if end is None:
            pieces.append(Piece("unfinished", text[at:]))
            return pieces
        pieces.append(Piece("call", text[at:at + end]))
        pos = at + end
    if pos < len(text):
        pieces.append(Piece("text", text[pos:]))
    return pieces


def offered_names(tools: Sequence[Mapping[str, Any]] | None) -> set[str]:
    """The names of the tools a request offered (OpenAI's form or bare)."""
    names = set()
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return names


def _opening_prefix(text: str, start: str) -> int:
    """How many characters at the end of ``text`` may begin ``start`` (0 when none)."""
    return next((n for n in range(min(len(start) - 1, len(text)), 0, -1) if text.endswith(start[:n])), 0)


class ToolRouter:
    """Feed content deltas; text that belongs to tool calls is held and parsed at the end."""

    def __init__(self, parser: ToolParser | None, tools: Sequence[Mapping[str, Any]] | None,
                 mode: ToolStreamMode) -> None:
        self.parser = parser
        self.tools = tools
        self.active = bool(parser is not None and tools and mode is not ToolStreamMode.PLAIN)
        self._held = ""
        self._capture: str | None = None
        self._last = ""  # the last character feed returned (how text after a call joins it)

    def feed(self, text: str) -> str:
        if not self.active:
            return text
        if self._capture is not None:
            self._capture += text
            return ""
        assert self.parser is not None
        buf = self._held + text
        at = buf.find(self.parser.start)
        if at >= 0:
            self._held, self._capture = "", buf[at:]
            return self._emit(buf[:at])
        keep = _opening_prefix(buf, self.parser.start)
        self._held = buf[len(buf) - keep:]
        return self._emit(buf[: len(buf) - keep])

    def _emit(self, text: str) -> str:
        self._last = text[-1:] or self._last
        return text

    def finish(self, *, cut: bool = False) -> RoutedTools:
        """The answer's calls and the content not yet returned by :meth:`feed`. ``cut``: the
        generation was stopped by ``max_tokens`` or a stop string (a last call that does not
        parse is then an unfinished one)."""
        held, self._held = self._held, ""
        captured, self._capture = self._capture, None
        if not self.active:
            return RoutedTools(content=held, calls=())
        assert self.parser is not None
        pieces = split_calls(self.parser, captured) if captured is not None else []
        if held:
            pieces.insert(0, Piece("text", held))
        # the turn ended inside a call's opening ("<function" of MiniCPM5's several tokens)
        if pieces and pieces[-1].kind == "text":
            keep = _opening_prefix(pieces[-1].text, self.parser.start)
            if keep >= _MIN_OPENING:
                last = pieces.pop().text
                pieces += [Piece("text", last[:-keep]), Piece("unfinished", last[-keep:])]
        return self._routed(pieces, first=captured is None, cut=cut)

    def _routed(self, pieces: list[Piece], *, first: bool, cut: bool) -> RoutedTools:
        """Calls and content of ``pieces``. ``first``: no call markup was seen while feeding,
        so the first text piece is the held end of the content stream (kept as it is)."""
        assert self.parser is not None
        offered = offered_names(self.tools)
        texts: list[tuple[str, bool]] = []  # (text, kept as it is)
        calls: list[ToolCall] = []
        warning: str | None = None
        dropped = False
        for i, piece in enumerate(pieces):
            if piece.kind == "text":
                raw = first and i == 0  # the held end of the content stream, kept as it is
                texts.append((piece.text if raw else piece.text.strip(), raw))
                continue
            if piece.kind == "unfinished":
                dropped = True
                warning = warning or f"dropped an unfinished tool call: {piece.text[:200]!r}"
                log.warning("dropped an unfinished tool call: %r", piece.text[:200])
                continue
            try:
                found = self.parser.parse(piece.text, self.tools)
                if not found:
                    raise ValueError("tool call markup without a call")
            except Exception as exc:  # a family parser's failure is the model's malformed output
                if cut and i == len(pieces) - 1:  # cut inside a value that held the end marker
                    dropped = True
                    warning = warning or f"dropped an unfinished tool call: {piece.text[:200]!r}"
                    continue
                why = f"could not parse tool call: {type(exc).__name__}: {exc}"
                log.warning(why)
                warning = warning or why
                texts.append((piece.text, True))
                continue
            unknown = [c.name for c in found if c.name not in offered]
            if unknown:
                why = f"a tool call names a tool the request did not offer: {unknown[0]!r}"
                log.warning(why)
                warning = warning or why
                texts.append((piece.text, True))
                continue
            calls += [c if c.id else attrs.evolve(c, id=f"call_{uuid.uuid4().hex[:24]}") for c in found]
        content = ""
        for text, raw in texts:
            before = content[-1:] or self._last
            if text and not raw and before and not before.isspace():
                content += "\n\n"  # a paragraph apart from the text before the call
            content += text
        return RoutedTools(content=content, calls=tuple(calls), warning=warning, dropped=dropped)


# -- arguments typed by the tool's JSON schema ----------------------------------------------


def tool_parameters(tools: Sequence[Mapping[str, Any]] | None, name: str) -> Mapping[str, Any]:
    """The JSON schema of tool ``name``'s arguments (``{}`` when there is no such tool or no
    schema); tools in OpenAI's ``{"type": "function", "function": {...}}`` form or bare."""
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        if isinstance(fn, Mapping) and fn.get("name") == name:
            params = fn.get("parameters") or {}
            return params if isinstance(params, Mapping) else {}
    return {}


def _schema_properties(tools: Sequence[Mapping[str, Any]] | None, name: str) -> Mapping[str, Any]:
    return tool_parameters(tools, name).get("properties") or {}


def _typed(value: Any, schema: Mapping[str, Any]) -> Any:
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if isinstance(value, str) and "string" not in kinds:
        if "boolean" in kinds and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if kinds & {"integer", "number", "boolean", "object", "array", "null"}:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ValueError(f"argument {value!r} is not a valid {'/'.join(sorted(map(str, kinds)))}") from None
    elif "string" in kinds and not isinstance(value, str) and kinds <= {"string"}:
        value = value if value is None else json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping) and isinstance(schema.get("properties"), Mapping):
        props = schema["properties"]
        value = {k: _typed(v, props.get(k) or {}) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        value = [_typed(v, schema["items"]) for v in value]
    return value


def typed_arguments(name: str, arguments: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] | None) -> str:
    """``arguments`` as JSON, each value typed by the tool's schema: strings where the schema
    says string, numbers/booleans/objects parsed where a parser gave text (nested too)."""
    props = _schema_properties(tools, name)
    typed = {k: _typed(v, props.get(k) or {}) for k, v in arguments.items()}
    return json.dumps(typed, ensure_ascii=False)


# -- tool_choice enforcement ----------------------------------------------------------------


class ForcedPrefix:
    """mlx-lm logits processor: the first generated tokens follow one of ``prefixes``.

    At each step the tokens generated so far select the prefixes still possible; every token
    that continues none of them is masked. Once a prefix is complete the model is free. The
    processor counts its own calls (one per generated token), so it works whether the lane
    hands it the whole history or only part of it.
    """

    def __init__(self, prefixes: Sequence[Sequence[int]]) -> None:
        self.prefixes = [tuple(p) for p in prefixes if p]
        self._step = 0

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        step, self._step = self._step, self._step + 1
        if not self.prefixes or step >= max(len(p) for p in self.prefixes):
            return logits
        flat = tokens.reshape(-1) if step else None
        done = tuple(int(t) for t in flat[flat.size - step:].tolist()) if flat is not None else ()
        live = [p for p in self.prefixes if p[:step] == done]
        if any(len(p) <= step for p in live) or not live:
            return logits  # a prefix is complete (or the history is not ours): free from here
        allowed = sorted({p[step] for p in live})
        mask = mx.full(logits.shape, -mx.inf, dtype=logits.dtype)
        index = mx.array(allowed)
        mask[..., index] = 0
        return logits + mask


def tool_choice_processors(request: Any) -> list[Any]:
    """The processors that enforce ``request.forced_prefixes`` (``[]`` when unconstrained).

    Family plugins return this from ``mlxrt_logits_processors`` for their own models."""
    prefixes = getattr(request, "forced_prefixes", ())
    return [ForcedPrefix(prefixes)] if prefixes else []


def tool_choice_prefixes(profile: Any, tokenizer: Any, names: Sequence[str], prompt_ids: Sequence[int] = (), *,
                         param: str = "tool_choice") -> tuple[tuple[int, ...], ...]:
    """Token sequences the answer must begin with so that it calls one of ``names``
    (``GenerationRequest.forced_prefixes``): the family parser's ``opening`` for each, after
    the close marker when the prompt (``prompt_ids``) left a reasoning block open.

    :raises InvalidRequest: (400 ``unsupported_parameter``) when the family's parser cannot
        say how a call opens: the choice would otherwise be silently ignored.
    """
    from mlxrt.errors import InvalidRequest

    if not names:
        return ()
    opening = getattr(profile.tool_parser, "opening", None)
    if not callable(opening):
        raise InvalidRequest(f"{param} 'required' or a named function cannot be enforced for this model "
                             f"({profile.family} has no tool-call opening); use \"auto\"", param=param,
                             code="unsupported_parameter")
    lead = reasoning_lead(profile, tokenizer, prompt_ids)
    return tuple(tuple(tokenizer.encode(lead + opening(name), add_special_tokens=False)) for name in names)


def reasoning_lead(profile: Any, tokenizer: Any, prompt_ids: Sequence[int]) -> str:
    """What a forced answer must start with before its tool call: the reasoning close (and
    the blank line templates put after it) when the prompt left a think block open, else ``""``."""
    from mlxrt.text.reasoning import prompt_opens_thinking

    fmt: ThinkingFormat | None = profile.thinking_format
    if fmt is not None and prompt_ids and prompt_opens_thinking(tokenizer.decode(list(prompt_ids[-16:])), fmt):
        return fmt.close + "\n\n"
    return ""
