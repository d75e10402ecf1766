"""MiniCPM5's tool calls: consecutive ``<function name="N"><param name="K">V</param></function>``
blocks with no outer wrapper; values holding ``<``, ``&`` or a newline come CDATA-wrapped.

mlx-lm's ``minicpm5`` parser reads the same markup by regex, a value up to the first
``</param>`` and a call up to the first ``</function>``, so a CDATA value holding
``</param></function>`` breaks the call apart. mlxrt reads a call by its structure: a CDATA
value runs to its ``]]>`` (it may hold any markup but ``]]>``, which the template does not
escape), a plain value to ``</param>`` (stripped of the blank space around it, as mlx-lm does);
``null`` is ``None``; values are then typed by the tool's schema.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from mlxrt import ToolCall
from mlxrt.text.tool_calls import call_texts, typed_arguments
from mlxrt.text.tool_grammar import CallGrammar, schema_properties, value_regex

__all__ = ["MiniCPM5Parser"]

#: A text value: no ``<`` (the template CDATA-wraps one that has it), or a CDATA block.
_TEXT = r"(?:[^<]*|<!\[CDATA\[(?:[^\]]|\][^\]])*\]\]>)"


class MiniCPM5Parser:
    start = "<function name="
    end = "</function>"

    def opening(self, name: str) -> str:
        return f'<function name="{name}">'

    def call_grammar(self, name: str, parameters: Mapping[str, Any], g: CallGrammar) -> str:
        """One call: the opening, the schema's parameters in its order (required ones always;
        values typed by their schema; text without ``<``, or a CDATA block), the close."""
        params = []
        for key, prop, required in schema_properties(parameters):
            opening = g.literal('<param name="' + key + '">')
            params.append((f"{opening} {g.regex(value_regex(prop, text=_TEXT))} {g.literal('</param>')}", required))
        body = g.ordered(params)
        return f"{g.literal(self.opening(name))} {body} {g.literal(self.end)}"

    def call_end(self, text: str) -> int | None:
        """Where the call at the start of ``text`` ends (past its ``</function>``, which may
        not lie inside a CDATA value); markup that is not MiniCPM5's ends at the first
        ``</function>``."""
        try:
            read = _read_call(text)
        except ValueError:
            at = text.find(self.end, len(self.start))
            return None if at < 0 else at + len(self.end)
        return None if read is None else read[2]

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ToolCall]:
        calls = []
        for markup in call_texts(self, text):
            read = _read_call(markup)
            if read is None:
                raise ValueError("a MiniCPM5 call needs a name and <param> arguments")
            name, params, _end = read
            if not name:
                raise ValueError("a MiniCPM5 call needs a name")
            calls.append(ToolCall(name=name, arguments=typed_arguments(name, params, tools)))
        return calls


_NAME = re.compile(r"\s*(\"[^\"]*\"|'[^']*'|[^\s\"'<>]+)\s*>")
_PARAM = re.compile(r"<param\s+name\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s\"'<>]+)\s*>")
_CDATA = "<![CDATA["


def _unquoted(name: str) -> str:
    return name[1:-1] if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'" else name


def _read_call(text: str) -> tuple[str, dict[str, Any], int] | None:
    """``(name, {key: value}, end)`` of the call at the start of ``text`` (``<function
    name=…``), ``end`` past its ``</function>``; ``None`` when the text ends inside it.

    :raises ValueError: when the markup is not MiniCPM5's.
    """
    def ends_in(pos: int, *markers: str) -> bool:
        rest = text[pos:]
        return any(len(rest) < len(m) and m.startswith(rest) for m in markers)

    name = _NAME.match(text, len("<function name="))
    if name is None:
        if ">" not in text:
            return None
        raise ValueError("a MiniCPM5 call opens with <function name=NAME>")
    params: dict[str, Any] = {}
    pos = name.end()
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if ends_in(pos, "</function>", "<param name="):
            return None
        if text.startswith("</function>", pos):
            return _unquoted(name.group(1)), params, pos + len("</function>")
        param = _PARAM.match(text, pos)
        if param is None:
            if text.startswith("<param", pos) and ">" not in text[pos:]:
                return None
            raise ValueError("expected <param name=KEY> or </function>")
        start = param.end()
        lead = start
        while lead < len(text) and text[lead].isspace():
            lead += 1
        if ends_in(lead, _CDATA):
            return None
        if text.startswith(_CDATA, lead):
            close = text.find("]]>", lead + len(_CDATA))
            if close < 0:
                return None
            value: Any = text[lead + len(_CDATA):close]
            end = close + len("]]>")
            while end < len(text) and text[end].isspace():
                end += 1
            if ends_in(end, "</param>"):
                return None
            if not text.startswith("</param>", end):
                raise ValueError("a CDATA value must be followed by </param>")
        else:
            end = text.find("</param>", start)
            if end < 0:
                return None
            value = text[start:end].strip()
            value = None if value.lower() == "null" else value
        params[_unquoted(param.group(1))] = value
        pos = end + len("</param>")
