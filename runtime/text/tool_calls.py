"""Tool-call routing, argument typing and ``tool_choice`` enforcement.

Routing (``buffered-text`` and ``gemma-sentinel`` modes): content streams as usual until the
family parser's start marker appears; from there the text is buffered and parsed when
generation ends. A call that cannot be parsed is returned as content with a warning: never
dropped silently, never a server error. A call the generation was cut inside (``max_tokens`` or
a stop string ended the turn before the call's end marker) is no call: it is dropped, with a
warning in the log and ``RoutedTools.dropped`` set for the response's
``x-mlxrt-partial-tool-call`` header; calls closed before the cut are kept (mlx-lm's rule). In ``gemma-sentinel`` mode the markers are the
tokenizer's own single sentinel tokens (the family checked they exist), which the engine's
detokenizer always writes out as their text.

``tool_choice`` ``"required"`` or a named function is enforced by a logits processor that
forces the answer's first tokens to a tool-call opening (:func:`tool_choice_processors`).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxrt.records import ToolCall, ToolParser, ToolStreamMode

__all__ = ["ToolRouter", "RoutedTools", "PARTIAL_CALL_HEADER", "typed_arguments", "ForcedPrefix", "tool_choice_processors",
           "tool_choice_prefixes", "reasoning_lead", "tool_parameters"]

log = logging.getLogger("mlxrt.tools")


#: Response header set when a call cut by ``max_tokens`` or a stop string was dropped.
PARTIAL_CALL_HEADER = "x-mlxrt-partial-tool-call"


@attrs.frozen
class RoutedTools:
    """What routing made of an answer: the rest of its content, its calls, and what went wrong.

    :ivar warning: Why markup was not read as calls (a malformed call, returned as content),
        or that a partial call was dropped.
    :ivar dropped: A call the generation was cut inside was dropped (no call, no markup).
    """

    content: str
    calls: tuple[ToolCall, ...]
    warning: str | None = None
    dropped: bool = False


class ToolRouter:
    """Feed content deltas; text that belongs to tool calls is held and parsed at the end."""

    def __init__(self, parser: ToolParser | None, tools: Sequence[Mapping[str, Any]] | None,
                 mode: ToolStreamMode) -> None:
        self.parser = parser
        self.tools = tools
        self.active = bool(parser is not None and tools and mode is not ToolStreamMode.PLAIN)
        self._held = ""
        self._capture: str | None = None

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
            return buf[:at]
        keep = next((n for n in range(min(len(self.parser.start) - 1, len(buf)), 0, -1)
                     if buf.endswith(self.parser.start[:n])), 0)
        self._held = buf[len(buf) - keep:]
        return buf[: len(buf) - keep]

    def finish(self, *, cut: bool = False) -> RoutedTools:
        """The answer's calls. ``cut``: the generation was stopped by ``max_tokens`` or a stop
        string, so a call not closed by the parser's end marker is unfinished: dropped."""
        held, self._held = self._held, ""
        if self._capture is None:
            if cut and len(held) > 1:  # the cut fell inside a call's start marker
                return self._dropped(RoutedTools(content="", calls=()), held)
            return RoutedTools(content=held, calls=())
        text, self._capture = self._capture, None
        assert self.parser is not None
        # Text after the last closed call is the model's again (a closing remark): content.
        end = text.rfind(self.parser.end)
        tail = text[end + len(self.parser.end):] if end >= 0 else text
        if cut and (end < 0 or self.parser.start in tail):
            fragment = tail[tail.find(self.parser.start):] if self.parser.start in tail else tail
            text = text[: len(text) - len(fragment)]
            if end < 0:
                return self._dropped(RoutedTools(content=held, calls=()), fragment)
            routed = self._parsed(held, text, text[end + len(self.parser.end):])
            return self._dropped(routed, fragment)
        if end < 0 or self.parser.start in tail or not tail.strip():
            tail = ""
        return self._parsed(held, text, tail)

    def _dropped(self, routed: RoutedTools, fragment: str) -> RoutedTools:
        warning = f"dropped a tool call cut off by the end of generation: {fragment[:200]!r}"
        log.warning(warning)
        return attrs.evolve(routed, warning=routed.warning or warning, dropped=True)

    def _parsed(self, held: str, text: str, tail: str) -> RoutedTools:
        """Parse the calls of ``text`` (the captured text, ``tail`` its closing remark)."""
        assert self.parser is not None
        body = text[: len(text) - len(tail)]
        try:
            calls = self.parser.parse(body, self.tools)
        except Exception as exc:  # a family parser's failure is the model's malformed output
            warning = f"could not parse tool call: {type(exc).__name__}: {exc}"
            log.warning(warning)
            return RoutedTools(content=held + text, calls=(), warning=warning)
        if not calls:
            return RoutedTools(content=held + text, calls=(), warning="tool call markup without a call")
        return RoutedTools(
            content=held + tail.strip(),
            calls=tuple(c if c.id else attrs.evolve(c, id=f"call_{uuid.uuid4().hex[:24]}") for c in calls),
        )


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

    fmt = profile.thinking_format
    if fmt is not None and prompt_ids and prompt_opens_thinking(tokenizer.decode(list(prompt_ids[-16:])), fmt):
        return fmt.close + "\n\n"
    return ""
