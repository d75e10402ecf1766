"""Grammars that force a tool call in the family's own markup.

``tool_choice`` ``"required"`` (OpenAI, Responses), ``"any"`` (Anthropic) or a named function
must yield a call the family's parser can parse, with arguments that fit the tool's schema.
A family's :class:`~mlxrt.records.ToolParser` may implement ``call_grammar(name, parameters, g)``:
it returns one call of ``name`` as a grammar expression built with the :class:`CallGrammar`
``g`` it is given (literal markup, a JSON value under a schema, a regex), or ``None`` when it
cannot describe that call. :func:`tool_call_constraint` joins the calls of every allowed tool
into one grammar, which the ``structured`` plugin enforces like any other constraint (per row,
in either lane). A parser without ``call_grammar`` keeps the weaker enforcement: the call's
opening is forced (:func:`mlxrt.text.tool_calls.tool_choice_prefixes`) and the model writes the rest.

The grammar language is llguidance's Lark dialect (``%json`` for schemas, ``<[id]>`` for one
token). Markup text that is one of the tokenizer's added tokens (``<tool_call>``,
``<|tool_call>``, ``</think>``…) becomes that token, so the model writes it the way its chat
template does and a streaming router that watches for the token sees it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mlxrt.records import StructuredOutput
from mlxrt.text.json_numbers import bounded_numbers, number_regex

__all__ = ["CallGrammar", "tool_call_constraint", "auto_tool_constraint", "value_regex", "schema_properties"]


def schema_properties(parameters: Mapping[str, Any] | None) -> list[tuple[str, Mapping[str, Any], bool]]:
    """A tool's parameters as ``(name, schema, required)``, in the schema's order."""
    if not isinstance(parameters, Mapping):
        return []
    props = parameters.get("properties")
    required = parameters.get("required")
    required = set(required) if isinstance(required, list) else set()
    if not isinstance(props, Mapping):
        return []
    return [(str(k), v if isinstance(v, Mapping) else {}, k in required) for k, v in props.items()]


class CallGrammar:
    """Builds one grammar: each method returns an expression to combine with spaces (sequence),
    ``|`` (alternatives) and ``( )*`` (repetition), as in Lark."""

    def __init__(self, tokenizer: Any) -> None:
        # Both tokenizers mlxrt loads answer this (mlx-lm's wrapper forwards it to transformers').
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._ids = {str(getattr(tok, "content", tok)): int(i) for i, tok in added.items()}
        texts = sorted((t for t in self._ids if t), key=len, reverse=True)
        self._split = re.compile("|".join(map(re.escape, texts))) if texts else None
        self._rules: list[str] = []
        self._named: dict[str, str] = {}

    def literal(self, text: str) -> str:
        """Exactly ``text``; the tokenizer's added tokens in it as those tokens."""
        parts: list[str] = []
        pos = 0
        for m in self._split.finditer(text) if self._split is not None else ():
            if m.start() > pos:
                parts.append(json.dumps(text[pos:m.start()]))
            parts.append(f"<[{self._ids[m.group()]}]>")
            pos = m.end()
        if pos < len(text):
            parts.append(json.dumps(text[pos:]))
        return " ".join(parts) if parts else '""'

    def json(self, schema: Mapping[str, Any] | None, *, key_separator: str = ": ",
             item_separator: str = ", ") -> str:
        """A JSON value valid under ``schema``, printed with the given separators and no other
        whitespace (so the model cannot stall in spaces)."""
        body: dict[str, Any] = (dict(bounded_numbers(schema)) if isinstance(schema, Mapping) and schema
                                else {"type": "object"})
        guidance = {"whitespace_flexible": False, "key_separator": key_separator,
                    "item_separator": item_separator, **(body.get("x-guidance") or {})}
        body["x-guidance"] = guidance
        return self._rule(f"%json {json.dumps(body)}")

    def regex(self, pattern: str) -> str:
        """Text matching ``pattern`` (Python-style syntax, no ``/`` delimiters)."""
        return self._rule("/" + pattern.replace("/", "\\/") + "/")

    def ordered(self, items: Sequence[tuple[str, bool]], sep: str | None = None) -> str:
        """``items`` (expression, required) in their order, each optional unless required,
        ``sep`` (an expression) between the present ones; ``""`` when there are none. Every
        argument at most once, the required ones always: the call is valid under its schema
        and finite."""
        if not items:
            return ""
        if sep is None:
            return " ".join(e if required else f"({e})?" for e, required in items)
        # rest[i]: items i.. each preceded by sep; first: the first present item is at i or later
        rest = [""] * (len(items) + 1)
        for i in range(len(items) - 1, -1, -1):
            e, required = items[i]
            piece = f"{sep} {e}" if required else f"({sep} {e})?"
            rest[i] = self._rule(f"{piece} {rest[i + 1]}".strip())
        first = ""
        for i in range(len(items) - 1, -1, -1):
            e, required = items[i]
            head = f"{e} {rest[i + 1]}".strip()
            if required:
                first = self._rule(head)
            else:
                first = self._rule(f"{head} | {first}") if first else f"({head})?"
        return first

    def text_without(self, marker: str) -> str:
        """Any text (empty included) in which ``marker`` never appears."""
        name = f"T{len(self._rules)}"
        escaped = re.escape(marker).replace("/", "\\/")
        self._rules.append(f"{name}: /(?s:.*)/ & ~/(?s:.*{escaped}.*)/")
        return name

    def named(self, key: str, build: Any) -> str:
        """The rule ``build(name)`` defines, made once per ``key`` and grammar; ``build`` may
        refer to ``name`` (a recursive rule: nested values)."""
        if key not in self._named:
            name = self._named[key] = f"n{len(self._named)}"
            self._rules.append(f"{name}: {build(name)}")
        return self._named[key]

    def grammar(self, start: str) -> str:
        return "\n".join([f"start: {start}", *self._rules]) + "\n"

    def _rule(self, body: str) -> str:
        name = f"r{len(self._rules)}"
        self._rules.append(f"{name}: {body}")
        return name


def value_regex(schema: Mapping[str, Any] | None, *, text: str = r"[^<]*") -> str:
    """A regex for one argument value written as plain text (XML-style markups): an ``enum``'s
    members, a number, ``true``/``false``, else ``text`` (strings, and objects or arrays
    written as JSON)."""
    schema = schema if isinstance(schema, Mapping) else {}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        members = [v if isinstance(v, str) else json.dumps(v) for v in schema["enum"]]
        return "(?:" + "|".join(re.escape(m) for m in members) + ")"
    kind = schema.get("type")
    if kind in ("integer", "number"):
        return number_regex(integer=kind == "integer")
    if kind == "boolean":
        return "(?:true|false)"
    return text


def tool_call_constraint(profile: Any, tokenizer: Any, names: Sequence[str],
                         tools: Sequence[Mapping[str, Any]] | None, lead: str = "", *,
                         param: str = "tool_choice", several: bool = False) -> StructuredOutput | None:
    """The constraint that forces one call to one of ``names`` (``several``: one or more, on
    lines of their own) after the text ``lead`` (the reasoning close when the prompt left a
    think block open), or ``None`` when the family's parser cannot describe every such call."""
    make = getattr(profile.tool_parser, "call_grammar", None)
    if not callable(make) or not names:
        return None
    from mlxrt.text.tool_calls import tool_parameters

    g = CallGrammar(tokenizer)
    calls = []
    for name in names:
        expr = make(name, tool_parameters(tools, name), g)
        if expr is None:
            return None
        calls.append(f"({expr})")
    start = " | ".join(calls) if len(calls) > 1 else calls[0]
    if several:
        start = f'({start}) ("\\n" ({start}))*'
    if lead:
        start = f"{g.literal(lead)} ({start})"
    return StructuredOutput(kind="lark", spec=g.grammar(start), param=param)


def auto_tool_constraint(profile: Any, tokenizer: Any, tools: Sequence[Mapping[str, Any]] | None, *,
                         param: str = "tools", several: bool = False) -> StructuredOutput | None:
    """The constraint for ``tool_choice`` ``"auto"`` on a model whose tools mlxrt renders itself
    (``profile.tool_prompt`` with ``auto_grammar``): free text or one whole, schema-valid call
    (``several``: one or more). ``None`` for any other model (its family's own markup is left
    free)."""
    make = getattr(profile.tool_prompt, "auto_grammar", None)
    if not tools or not callable(make):
        return None
    g = CallGrammar(tokenizer)
    try:
        body = make(tools, g, several=several)
    except TypeError:  # a family's ToolPrompt without the keyword: one call
        body = make(tools, g)
    return StructuredOutput(kind="lark", spec=g.grammar(body), param=param)
