"""Qwen tool-call parsers: Qwen3's JSON calls and Qwen3.5/Coder's XML calls.

Both put each call between ``<tool_call>`` and ``</tool_call>``. Qwen3 writes
``{"name": ..., "arguments": {...}}``; Qwen3.5 writes ``<function=NAME><parameter=KEY>VALUE
</parameter></function>`` with raw-text values that are typed by the tool's JSON schema.
mlx-lm's ``json_tools`` is a bare ``json.loads`` and its ``qwen3_coder`` needs exactly one
closed ``<function=…>`` per call, so these are mlxrt's own (tolerant of an unclosed last
call and of several calls in one turn).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mlxrt import ToolCall
from mlxrt.text.generic_tools import JsonToolCallParser
from mlxrt.text.tool_calls import tool_parameters
from mlxrt.text.tool_grammar import CallGrammar, schema_properties, value_regex

__all__ = ["Qwen3JsonParser", "Qwen3XmlParser"]

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|\Z)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.S)


_NL = r"\n?"  # a value sits on its own lines in the template's markup


def _blocks(text: str) -> list[str]:
    blocks = [b.strip() for b in _BLOCK.findall(text)]
    if not blocks:
        raise ValueError("no <tool_call> block")
    return blocks


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

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ToolCall]:
        calls = []
        for block in _blocks(text):
            fn = _FUNCTION.search(block)
            if fn is None:
                raise ValueError("a tool call must contain <function=NAME>")
            name, body = fn.group(1), fn.group(2)
            props = tool_parameters(tools, name).get("properties") or {}
            args = {key: _xml_value(val, props[key] if isinstance(props.get(key), Mapping) else None)
                    for key, val in _PARAMETER.findall(body)}
            calls.append(ToolCall(name=name, arguments=json.dumps(args, ensure_ascii=False)))
        return calls
