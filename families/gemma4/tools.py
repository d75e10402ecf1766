"""Gemma 4's tool calls: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>``.

Values are Gemma's own notation: strings between ``<|"|>`` tokens (anything but that token,
the call's own markup included), objects ``{key:value,…}`` with bare keys, arrays
``[value,…]``, and bare numbers, ``true``, ``false``, ``null``. mlxrt reads a call by that
structure (mlx-lm's ``gemma4`` parser reads the same notation by regex, between the first
start and end markers), so a string may hold ``<tool_call|>`` or braces; several calls come as
several :class:`ToolCall` s, their arguments typed by the tool's schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mlxrt import ToolCall
from mlxrt.text.json_numbers import number_regex
from mlxrt.text.tool_calls import call_texts, typed_arguments
from mlxrt.text.tool_grammar import CallGrammar, schema_properties, value_regex

__all__ = ["Gemma4Parser"]

QUOTE = '<|"|>'
_NAME = re.compile(r"[\w.-]+")
_BARE = re.compile(r"[^,}\]<{\[]*")


class _Unfinished(Exception):
    """The text ends inside the call."""


class _Reader:
    """Reads Gemma 4 values from ``text`` at ``pos`` (recursive descent)."""

    def __init__(self, text: str, pos: int) -> None:
        self.text, self.pos = text, pos

    def expect(self, literal: str) -> None:
        rest = self.text[self.pos:self.pos + len(literal)]
        if rest == literal:
            self.pos += len(literal)
            return
        if literal.startswith(rest) and self.pos + len(rest) == len(self.text):
            raise _Unfinished
        raise ValueError(f"expected {literal!r} at {self.text[self.pos:self.pos + 20]!r}")

    def peek(self, literal: str) -> bool:
        rest = self.text[self.pos:self.pos + len(literal)]
        if len(rest) < len(literal) and literal.startswith(rest):
            raise _Unfinished  # the text ends where ``literal`` may be starting
        return rest == literal

    def value(self) -> Any:
        if self.peek(QUOTE):
            end = self.text.find(QUOTE, self.pos + len(QUOTE))
            if end < 0:
                raise _Unfinished
            value, self.pos = self.text[self.pos + len(QUOTE):end], end + len(QUOTE)
            return value
        if self.peek("{"):
            return self.mapping()
        if self.peek("["):
            self.pos += 1
            items: list[Any] = []
            while not self.peek("]"):
                if items:
                    self.expect(",")
                items.append(self.value())
            self.pos += 1
            return items
        word = _BARE.match(self.text, self.pos)
        assert word is not None
        self.pos = word.end()
        if self.pos >= len(self.text):
            raise _Unfinished
        token = word.group().strip()
        if not token:
            raise ValueError(f"expected a value at {self.text[self.pos:self.pos + 20]!r}")
        try:
            return json.loads(token)
        except json.JSONDecodeError:
            return token  # a bare word: Gemma's unquoted string

    def mapping(self) -> dict[str, Any]:
        self.expect("{")
        out: dict[str, Any] = {}
        while not self.peek("}"):
            if out:
                self.expect(",")
            colon = self.text.find(":", self.pos)
            if colon < 0:
                raise _Unfinished
            key = self.text[self.pos:colon].strip()
            if not key or any(c in key for c in "{}[],<"):
                raise ValueError(f"expected a key at {self.text[self.pos:self.pos + 20]!r}")
            self.pos = colon + 1
            out[key] = self.value()
        self.pos += 1
        return out


def _read_calls(text: str, start: str, end: str) -> tuple[list[tuple[str, dict[str, Any]]], int] | None:
    """The calls ``(name, arguments)`` of the block at the start of ``text`` and where it ends
    (past its end marker); ``None`` when the text ends inside it.

    :raises ValueError: when the markup does not follow Gemma 4's notation.
    """
    reader = _Reader(text, len(start))
    calls: list[tuple[str, dict[str, Any]]] = []
    try:
        while True:
            if calls and reader.peek(end):
                return calls, reader.pos + len(end)
            reader.expect("call:")
            name = _NAME.match(text, reader.pos)
            if name is None:
                raise ValueError("a call needs a name after call:")
            reader.pos = name.end()
            calls.append((name.group(), reader.mapping()))
    except _Unfinished:
        return None


class Gemma4Parser:
    start = "<|tool_call>"
    end = "<tool_call|>"

    def opening(self, name: str) -> str:
        return f"<|tool_call>call:{name}{{"

    def call_grammar(self, name: str, parameters: Mapping[str, Any], g: CallGrammar) -> str | None:
        """One call: the opening, ``key:value`` pairs of the schema's parameters in its order
        (required ones always) separated by commas (strings between ``<|"|>`` tokens, other
        values typed by their schema, objects and arrays in Gemma's nested notation), the
        close."""
        body = _object_body(parameters, g)
        return f"{g.literal(self.opening(name))} {body} {g.literal('}' + self.end)}"

    def call_end(self, text: str) -> int | None:
        """Where the call block at the start of ``text`` ends; a block that is not Gemma's
        notation ends at the first end marker."""
        try:
            read = _read_calls(text, self.start, self.end)
        except ValueError:
            at = text.find(self.end, len(self.start))
            return None if at < 0 else at + len(self.end)
        return None if read is None else read[1]

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ToolCall]:
        calls = []
        for markup in call_texts(self, text):
            read = _read_calls(markup, self.start, self.end)
            if read is None:
                raise ValueError("no call:NAME{...} after <|tool_call>")
            calls += [ToolCall(name=name, arguments=typed_arguments(name, args, tools)) for name, args in read[0]]
        return calls


# -- grammars of Gemma's notation -------------------------------------------------------------

#: Text of a string in a forced call: no ``<`` (as for every XML-style family's text values).
_STRING_TEXT = r"[^<]*"


def _string(g: CallGrammar) -> str:
    return f"{g.literal(QUOTE)} {g.regex(_STRING_TEXT)} {g.literal(QUOTE)}"


def _any_value(g: CallGrammar) -> str:
    """Any Gemma value (a schema that says nothing about it): one recursive rule per grammar."""
    def build(name: str) -> str:
        bare = g.regex(number_regex(integer=False) + "|true|false|null")
        key = g.regex(r"[A-Za-z_][\w.-]*")
        members = f'{key} ":" {name} ("," {key} ":" {name})*'
        return f'{_string(g)} | {bare} | "{{" ({members})? "}}" | "[" ({name} ("," {name})*)? "]"'

    return g.named("gemma4-any", build)


def _value(schema: Mapping[str, Any], g: CallGrammar) -> str:
    """One value under ``schema`` in Gemma's notation."""
    kind = schema.get("type")
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        if all(isinstance(v, str) for v in enum):
            return f"{g.literal(QUOTE)} {g.regex(value_regex(schema))} {g.literal(QUOTE)}"
        return g.regex(value_regex(schema))
    if kind == "object" and isinstance(schema.get("properties"), Mapping):
        return f'"{{" {_object_body(schema, g)} "}}"'
    if kind == "array":
        items = schema.get("items")
        item = _value(items, g) if isinstance(items, Mapping) and items else _any_value(g)
        return f'"[" ({item} ("," {item})*)? "]"'
    if kind in ("integer", "number", "boolean"):
        return g.regex(value_regex(schema))
    if kind == "string":
        return _string(g)
    return _any_value(g)


def _object_body(schema: Mapping[str, Any], g: CallGrammar) -> str:
    pairs = [(f"{g.literal(key + ':')} {_value(prop, g)}", required)
             for key, prop, required in schema_properties(schema)]
    return g.ordered(pairs, sep=g.literal(","))
