"""Qwen tool-call parsers: Qwen3's JSON calls and Qwen3.5/Coder's XML calls.

Both put each call between ``<tool_call>`` and ``</tool_call>``. Qwen3 writes
``{"name": ..., "arguments": {...}}``; Qwen3.5 writes ``<function=NAME><parameter=KEY>VALUE
</parameter></function>`` with raw-text values that are typed by the tool's JSON schema.
mlx-lm's ``json_tools`` is a bare ``json.loads`` and its ``qwen3_coder`` needs exactly one
closed ``<function=…>`` per call, so these are mlxrt's own.

A Qwen3.5 value is raw text, so it may hold the markup itself (code that writes
``</tool_call>``). The call is read by its structure, as vLLM's ``qwen3_coder`` parser reads
it: a value ends at the first ``</parameter>`` followed (after blank space) by the next
``<parameter=`` or by ``</function>``, and the call at ``</function>`` followed by
``</tool_call>``. Only a value holding ``</parameter>`` followed by one of those cannot be
expressed. A call whose markup does not follow that structure is read leniently, up to the
first ``</tool_call>``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mlxrt import ToolCall
from mlxrt.text.generic_tools import JsonToolCallParser
from mlxrt.text.tool_calls import call_texts, tool_parameters
from mlxrt.text.tool_grammar import CallGrammar, schema_properties, value_regex

__all__ = ["Qwen3JsonParser", "Qwen3XmlParser"]

_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|\Z)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.S)


_NL = r"\n?"  # a value sits on its own lines in the template's markup


class _Malformed(ValueError):
    """The call's markup does not follow Qwen3.5's structure."""


def _space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _unfinished(text: str, pos: int, *markers: str) -> bool:
    """``text`` ends at ``pos`` or inside one of ``markers`` written from there."""
    rest = text[pos:]
    return any(len(rest) < len(m) and m.startswith(rest) for m in markers)


def _read_xml_call(text: str) -> tuple[str, list[tuple[str, str]], int] | None:
    """``(name, [(key, raw value)], end)`` of the call at the start of ``text`` (which begins
    with ``<tool_call>``), ``end`` just past its ``</tool_call>``; ``None`` when the text ends
    inside the call.

    :raises _Malformed: when the markup does not follow the structure.
    """
    pos = _space(text, len("<tool_call>"))
    if _unfinished(text, pos, "<function="):
        return None
    if not text.startswith("<function=", pos):
        raise _Malformed("a tool call must open with <function=NAME>")
    close = text.find(">", pos)
    if close < 0:
        return None
    name = text[pos + len("<function="):close]
    params: list[tuple[str, str]] = []
    pos = close + 1
    while True:
        pos = _space(text, pos)
        if _unfinished(text, pos, "<parameter=", "</function>"):
            return None
        if text.startswith("</function>", pos):
            pos = _space(text, pos + len("</function>"))
            if _unfinished(text, pos, "</tool_call>"):
                return None
            if not text.startswith("</tool_call>", pos):
                raise _Malformed("</function> must be followed by </tool_call>")
            return name, params, pos + len("</tool_call>")
        if not text.startswith("<parameter=", pos):
            raise _Malformed("expected <parameter=KEY> or </function>")
        close = text.find(">", pos)
        if close < 0:
            return None
        key = text[pos + len("<parameter="):close]
        start = end = close + 1
        while True:  # the value ends at a </parameter> the structure goes on after
            end = text.find("</parameter>", end)
            if end < 0:
                return None
            after = _space(text, end + len("</parameter>"))
            if text.startswith(("<parameter=", "</function>"), after):
                break
            if _unfinished(text, after, "<parameter=", "</function>"):
                return None
            end += 1
        params.append((key, text[start:end]))
        pos = end + len("</parameter>")


def _lenient_blocks(text: str) -> list[str]:
    blocks = re.findall(r"<tool_call>(.*?)(?:</tool_call>|\Z)", text, re.S)
    if not blocks:
        raise ValueError("no <tool_call> block")
    return [b.strip() for b in blocks]


class Qwen3JsonParser(JsonToolCallParser):
    """Qwen3's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``: mlxrt's generic
    JSON call format (:class:`mlxrt.text.generic_tools.JsonToolCallParser`)."""


_STRING_TYPES = {"string", "str", "text", "varchar", "char", "enum"}
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")


def _xml_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """One ``<parameter>`` value as mlx-lm's ``qwen3_coder`` parser (and vLLM's) reads it.

    Exactly one newline is stripped at each end (the ones the template puts around a value);
    ``null`` is ``None``; a parameter without a schema ``type`` keeps its text (vLLM's rule;
    mlx-lm decodes a JSON object or array there when the parameter's schema is not empty); typed values are
    converted by their type (integers through ``float``, numbers to ``int`` when integral,
    booleans by ``== "true"``, objects/arrays as JSON, then Python literals). A union type
    (``["string", "null"]``) is read by its first non-null member, a string when it has one
    (mlx-lm stringifies the list; a deliberate difference, tests/golden/tool_parser_parity.json).
    """
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    if value.lower() == "null":
        return None
    if schema is None:
        return value
    if "type" not in schema:
        return value
    kind = schema["type"]
    if isinstance(kind, list):
        kinds = [str(k).lower() for k in kind if k != "null"]
        kind = "string" if "string" in kinds else (kinds[0] if kinds else "string")
    kind = str(kind).strip().lower()
    if kind in _STRING_TYPES:
        return value
    if kind.startswith(_INT_PREFIXES):
        number = float(value)
        if number != int(number):
            raise ValueError(f"parameter value {value!r} is not a valid integer")
        return int(number)
    if kind.startswith(("num", "float")):
        number = float(value)
        return int(number) if number == int(number) else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return json.loads(value, strict=False)
        except json.JSONDecodeError:
            pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


class Qwen3XmlParser:
    start = "<tool_call>"
    end = "</tool_call>"

    def opening(self, name: str) -> str:
        return f"<tool_call>\n<function={name}>\n"

    def call_grammar(self, name: str, parameters: Mapping[str, Any], g: CallGrammar) -> str:
        """One call: the opening, the schema's parameters in its order (required ones always,
        each value typed by its schema: enum members, numbers, booleans, else text without
        ``<``), the close."""
        params = []
        for key, prop, required in schema_properties(parameters):
            value = g.regex(_NL + value_regex(prop) + _NL)
            opening, close = g.literal(f"<parameter={key}>"), g.literal("</parameter>\n")
            params.append((f"{opening} {value} {close}", required))
        body = g.ordered(params)
        close = g.literal("</function>\n" + self.end)
        return f"{g.literal(self.opening(name))} {body} {close}"

    def call_end(self, text: str) -> int | None:
        """Where the call at the start of ``text`` ends (see the module docstring)."""
        try:
            read = _read_xml_call(text)
        except _Malformed:
            at = text.find(self.end, len(self.start))
            return None if at < 0 else at + len(self.end)
        return None if read is None else read[2]

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ToolCall]:
        return [call for markup in call_texts(self, text) for call in self._read(markup, tools)]

    def _read(self, text: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ToolCall]:
        try:
            read = _read_xml_call(text)
        except _Malformed:
            read = None
        if read is not None:
            found = [(read[0], read[1])]
        else:  # not Qwen3.5's structure: the lenient reading, up to the first markers
            found = []
            for block in _lenient_blocks(text):
                fn = _FUNCTION.search(block)
                if fn is None:
                    raise ValueError("a tool call must contain <function=NAME>")
                found.append((fn.group(1), _PARAMETER.findall(fn.group(2))))
        calls = []
        for name, params in found:
            props = tool_parameters(tools, name).get("properties") or {}
            args = {key: _xml_value(val, props[key] if isinstance(props.get(key), Mapping) else None)
                    for key, val in params}
            calls.append(ToolCall(name=name, arguments=json.dumps(args, ensure_ascii=False)))
        return calls
