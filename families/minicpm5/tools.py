"""MiniCPM5's tool calls: consecutive ``<function name="N"><param name="K">V</param></function>``
blocks with no outer wrapper; values holding ``<``, ``&`` or a newline come CDATA-wrapped.

mlx-lm's ``minicpm5`` parser unwraps CDATA, types the values from the schema and reads
consecutive blocks as parallel calls; this wrapper gives its result as :class:`ToolCall` s
(and retypes by the schema, as every mlxrt parser does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mlxrt import ToolCall
from mlxrt.text.tool_calls import typed_arguments
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

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ToolCall]:
        from mlx_lm.tool_parsers import minicpm5

        found = minicpm5.parse_tool_call(text, tools)
        calls = []
        for call in found if isinstance(found, list) else [found]:
            name, args = call.get("name"), call.get("arguments")
            if not name or not isinstance(args, dict):
                raise ValueError("a MiniCPM5 call needs a name and <param> arguments")
            calls.append(ToolCall(name=name, arguments=typed_arguments(name, args, tools)))
        return calls
