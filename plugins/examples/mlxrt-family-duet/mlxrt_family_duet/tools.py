"""Duet's tool calls: ``<|call|>NAME {"arg": value, ...}<|/call|>``, one block per call.

The chat template writes past calls this way and tells the model to write new ones so; this
parser reads them back. ``opening`` and ``call_grammar`` let mlxrt enforce ``tool_choice``
(``"required"`` or a named function): with the ``structured`` plugin the whole call is held to
a grammar, so even a model that has never seen a tool writes one the parser reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mlxrt import ToolCall
from mlxrt.text.tool_calls import typed_arguments

__all__ = ["DuetToolParser"]

# A block; the last one may be unclosed (the generation stopped at max_tokens or a stop string).
_CALL = re.compile(r"<\|call\|>\s*([^\s{<]+)\s*(.*?)\s*(?:<\|/call\|>|\Z)", re.S)


class DuetToolParser:
    start = "<|call|>"
    end = "<|/call|>"

    def opening(self, name: str) -> str:
        """The exact text a call to ``name`` starts with (``tool_choice`` forces it)."""
        return f"{self.start}{name} "

    def call_grammar(self, name: str, parameters: Mapping[str, Any], g: Any) -> str:
        """One whole call: the opening, a JSON object valid under the tool's schema, the close."""
        return f"{g.literal(self.opening(name))} {g.json(parameters)} {g.literal(self.end)}"

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ToolCall]:
        calls = []
        for name, body in _CALL.findall(text):
            arguments = json.loads(body) if body else {}
            if not isinstance(arguments, dict):
                raise ValueError(f"the arguments of a Duet call must be a JSON object, not {body!r}")
            # values typed by the tool's schema ("3" -> 3 where it says integer), as JSON text
            calls.append(ToolCall(name=name, arguments=typed_arguments(name, arguments, tools)))
        if not calls:
            raise ValueError("no <|call|> block")
        return calls
