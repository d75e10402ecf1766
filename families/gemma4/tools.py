"""Gemma 4's tool calls: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>``.

mlx-lm's ``gemma4`` parser does the hard part (balanced braces, ``<|"|>`` strings, bare
keys); this wrapper finds every call in the captured text, gives several calls as several
:class:`ToolCall` s and types the arguments by the tool's schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mlxrt import ToolCall
from mlxrt.text.tool_calls import typed_arguments
from mlxrt.text.tool_grammar import CallGrammar, schema_properties, value_regex

__all__ = ["Gemma4Parser"]


def _quote(g: CallGrammar) -> str:
    return g.literal('<|"|>')


class Gemma4Parser:
    start = "<|tool_call>"
    end = "<tool_call|>"

    def opening(self, name: str) -> str:
        return f"<|tool_call>call:{name}{{"

    def call_grammar(self, name: str, parameters: Mapping[str, Any], g: CallGrammar) -> str | None:
        """One call: the opening, ``key:value`` pairs of the schema's parameters in its order
        (required ones always) separated by commas (strings between ``<|"|>`` tokens, other values typed by their schema), the
        close. ``None`` (the opening alone is forced) when a parameter takes an object or an
        array, which Gemma writes in its own nested syntax."""
        pairs = []
        for key, prop, required in schema_properties(parameters):
            if prop.get("type") in ("object", "array"):
                return None
            enum = prop.get("enum")
            # strings (and untyped values) go between <|"|> tokens; an enum of other values bare
            quoted = prop.get("type") in ("string", None) and not (
                isinstance(enum, list) and enum and not all(isinstance(v, str) for v in enum))
            value = g.regex(value_regex(prop))
            if quoted:
                value = f"{_quote(g)} {value} {_quote(g)}"
            pairs.append((f"{g.literal(key + ':')} {value}", required))
        body = g.ordered(pairs, sep=g.literal(","))
        return f"{g.literal(self.opening(name))} {body} {g.literal('}' + self.end)}"

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ToolCall]:
        from mlx_lm.tool_parsers import gemma4

        calls = []
        for block in text.split(self.start)[1:]:
            body = block.split(self.end, 1)[0].strip()
            found = gemma4.parse_tool_call(body, tools)
            for call in found if isinstance(found, list) else [found]:
                args = call.get("arguments")
                if not isinstance(args, dict):
                    raise ValueError("tool call arguments must be an object")
                calls.append(ToolCall(name=call["name"], arguments=typed_arguments(call["name"], args, tools)))
        if not calls:
            raise ValueError("no call:NAME{...} after <|tool_call>")
        return calls
