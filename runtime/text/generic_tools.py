"""Tools on a model whose chat template renders none: mlxrt's generic tool prompt and format.

Many chat templates (the embedded SmolLM2's, most of the generic tier's) ignore ``tools``:
rendered as they are, the tools would silently vanish from the prompt. For such a model
(:func:`template_renders_tools` is false at load) mlxrt renders the tools itself through a
:class:`~mlxrt.records.ToolPrompt`: a family may supply its own (``mlxrt_tool_prompt``), else
:class:`GenericToolPrompt` does, and its parser reads the calls back.

The generic format is the Hermes/Qwen3 one many small models were tuned on::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The tools are described in a system message (:data:`GENERIC_TOOL_PROMPT`, joined to the
conversation's own system message); earlier calls are rendered in the same format in the
assistant's text, and tool results as user turns in ``<tool_response>`` tags, so any template
that renders plain user/assistant/system turns can carry a whole tool conversation. With the
``structured`` plugin the reply is held to the format by a grammar (:meth:`auto_grammar`):
free text that never opens a call, or one whole call with arguments valid under the tool's
schema; ``tool_choice`` ``"required"``/named force the call (the parser's ``call_grammar``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mlxrt.records import ToolCall
from mlxrt.text.tool_calls import call_bodies, tool_parameters, typed_arguments
from mlxrt.text.tool_grammar import CallGrammar

__all__ = ["JsonToolCallParser", "closed_objects", "GenericToolPrompt", "GENERIC_TOOL_PROMPT", "template_renders_tools"]

#: The system text that describes the tools (``{tools}``: one JSON object per line).
GENERIC_TOOL_PROMPT = (
    "You can call these tools. Each line is one tool: its name, what it does, and the JSON schema "
    "of its arguments.\n{tools}\n\n"
    "To call a tool, reply with exactly this and nothing else:\n"
    '<tool_call>\n{{"name": "TOOL_NAME", "arguments": {{ARGUMENTS_AS_JSON}}}}\n</tool_call>\n'
    "A tool's result comes back in <tool_response> tags. When you need no tool, reply in plain text."
)

_PROBE = "mlxrt_probe_tool_7f3a"


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template puts ``tools`` in the prompt (a probe tool's name shows
    up in the rendered text); ``True`` when there is no template or it fails on the probe (then
    nothing mlxrt adds would help)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return True
    probe = [{"type": "function", "function": {"name": _PROBE, "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}]
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=probe,
                                             add_generation_prompt=True, tokenize=False)
    except Exception:  # a template that rejects tools outright: leave it to report its error
        return True
    return _PROBE in text


_DECODER = json.JSONDecoder()


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _end_outside_strings(text: str, pos: int, end: str) -> int | None:
    """Past the first ``end`` at or after ``pos`` that is not inside a JSON string."""
    in_string = escaped = False
    for i in range(pos, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
            continue
        if c == '"':
            in_string = True
        elif text.startswith(end, i):
            return i + len(end)
    return None


class JsonToolCallParser:
    """``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` blocks (Qwen3's format, and
    the generic one); arguments typed by the tool's schema, ``"arguments"`` given as a JSON
    string decoded."""

    start = "<tool_call>"
    end = "</tool_call>"

    def opening(self, name: str) -> str:
        return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": '

    def call_grammar(self, name: str, parameters: Mapping[str, Any], g: CallGrammar) -> str:
        """One call: the opening, arguments valid under the tool's schema (printed as the
        templates print JSON; an object that does not say otherwise takes no other keys than
        its ``properties``: :func:`closed_objects`), the close."""
        close = g.literal("}\n" + self.end)
        return f"{g.literal(self.opening(name))} {g.json(closed_objects(parameters))} {close}"

    def call_end(self, text: str) -> int | None:
        """Where the call at the start of ``text`` ends: past the end marker that follows its
        JSON object (a string in it may hold ``</tool_call>``); ``None`` while the object or
        the marker is unfinished. An object that does not decode ends at the first marker
        outside its strings (``None`` when there is none: the text ends inside it)."""
        pos = _skip_space(text, len(self.start))
        try:
            _obj, after = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            return _end_outside_strings(text, pos, self.end)
        close = _skip_space(text, after)
        if text.startswith(self.end, close):
            return close + len(self.end)
        if self.end.startswith(text[close:]):
            return None  # the text ends before (or inside) the end marker
        return _end_outside_strings(text, after, self.end)

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]] | None) -> list[ToolCall]:
        calls = []
        for block in call_bodies(self, text):
            obj = json.loads(block)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise ValueError("a tool call must be a JSON object with a string name")
            args = obj.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args or "{}")
            if not isinstance(args, dict):
                raise ValueError("tool call arguments must be a JSON object")
            calls.append(ToolCall(name=obj["name"], arguments=typed_arguments(obj["name"], args, tools)))
        return calls


def closed_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that lists
    ``properties`` and says nothing about other keys (tool schemas mostly leave it unset, and a
    small model under a grammar then invents keys); what the schema says is kept. OpenAI's
    ``strict`` function schemas must say ``false`` already."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            value = {k: closed_objects(v) for k, v in value.items()}
        elif key in _SUBSCHEMAS:
            value = closed_objects(value)
        out[key] = value
    if isinstance(schema.get("properties"), Mapping):
        out.setdefault("additionalProperties", False)
    return out


#: Keywords whose value is a schema or a list of schemas, and those whose value maps names to
#: schemas: what :func:`closed_objects` walks into.
_SUBSCHEMAS = frozenset({"items", "anyOf", "oneOf", "allOf", "not", "prefixItems", "additionalProperties"})
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})


def _tool_line(tool: Mapping[str, Any]) -> str:
    function = tool.get("function")
    fn = function if isinstance(function, Mapping) else tool
    line = {"name": fn.get("name"), "description": fn.get("description") or "",
            "parameters": fn.get("parameters") or {"type": "object", "properties": {}}}
    return json.dumps(line, ensure_ascii=False)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


class GenericToolPrompt:
    """mlxrt's own tool rendering for templates without tools (see the module docstring)."""

    parser = JsonToolCallParser()

    def system_text(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """The system text that describes ``tools`` and the call format."""
        return GENERIC_TOOL_PROMPT.format(tools="\n".join(_tool_line(t) for t in tools))

    def render(self, messages: Sequence[Mapping[str, Any]],
               tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with the tools described in the system message, past calls written in
        the format and tool results as user turns."""
        out: list[dict[str, Any]] = []
        for message in messages:
            role = message.get("role")
            if role == "assistant" and message.get("tool_calls"):
                calls = []
                for call in message["tool_calls"]:
                    fn = call.get("function") or {}
                    args = fn.get("arguments")
                    try:
                        args = json.loads(args) if isinstance(args, str) else (args or {})
                    except json.JSONDecodeError:
                        pass
                    body = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
                    calls.append(f"{self.parser.start}\n{body}\n{self.parser.end}")
                text = "\n".join(filter(None, [_text(message.get("content")), *calls]))
                out.append({"role": "assistant", "content": text})
            elif role == "tool":
                out.append({"role": "user", "content": f"<tool_response>\n{_text(message.get('content'))}\n"
                                                       "</tool_response>"})
            else:
                out.append(dict(message))
        system = self.system_text(tools)
        if out and out[0].get("role") in ("system", "developer"):
            out[0] = {**out[0], "role": "system", "content": f"{_text(out[0].get('content'))}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
        return out

    def auto_grammar(self, tools: Sequence[Mapping[str, Any]], g: CallGrammar, *, several: bool = False) -> str:
        """``tool_choice`` ``"auto"``: free text that never opens a call, or one whole call of
        one of ``tools`` (arguments valid under its schema); ``several``: one call or more, each
        on its own line (the request allows parallel calls)."""
        names = [n for t in tools if isinstance(n := (t.get("function") or t).get("name"), str)]
        calls = " | ".join(f"({self.parser.call_grammar(n, tool_parameters(tools, n), g)})" for n in names)
        text = g.text_without(self.parser.start)
        if calls and several:
            calls = f'({calls}) ("\\n" ({calls}))*'
        return f"{text} | {calls}" if calls else text
