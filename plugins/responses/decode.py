"""Decoding OpenAI Responses bodies: raw JSON → validated wire request, input items and a
dialect-neutral :class:`~mlxrt.records.ChatInput`.

Items map onto chat messages: ``message`` items by role; ``function_call`` items become the
assistant's ``tool_calls`` (consecutive calls join one assistant turn); ``function_call_output``
items become ``tool`` messages; ``reasoning`` items are dropped (templates re-derive them).
``instructions`` and every system/developer item merge into ONE leading system message:
strict templates reject a second one, and Codex sends both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxrt.api.output_format import structured_output
from mlxrt.api.wire import (
    adapter_field,
    check_fields,
    claimed_values,
    declared_fields,
    ignored_fields,
    ignored_headers,
    strict_converter,
    structure,
)
from mlxrt.errors import InvalidRequest
from mlxrt.loading.images import ImageRef, content_parts, url_ref
from mlxrt.plugins.responses.wire import RESPONSES_RULES, ResponsesRequest
from mlxrt.records import ChatInput, StructuredOutput

__all__ = ["DecodedResponse", "decode_response", "input_items", "chat_input", "output_as_input"]

_CONVERTER = strict_converter()
_READ = frozenset({"input", "tools", "tool_choice", "text", "truncation", "adapter"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "refusal"})


@attrs.frozen
class DecodedResponse:
    request: ResponsesRequest
    #: The request's own input, as items (a string input is one user message item).
    input: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] | None
    #: ``tool_choice`` as sent (echoed in the response).
    tool_choice: Any
    #: Tools the answer must call (``required``: every tool; a named function: that one).
    forced: tuple[str, ...] = ()
    extra: Mapping[str, Any] = attrs.field(factory=dict)
    ignored: tuple[str, ...] = ()
    #: ``text.format`` as the engine's constraint; ``None`` is free text.
    structured: StructuredOutput | None = None
    #: The ``adapter`` field (``None``: the server's default adapter set).
    adapter: str | None = None
    #: ``text.format`` as sent, echoed in the response (``{"type": "text"}`` when absent).
    text_format: Mapping[str, Any] = attrs.field(factory=lambda: {"type": "text"})

    @property
    def headers(self) -> dict[str, str]:
        return ignored_headers(self.ignored)


def _bad(message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def input_items(value: Any) -> tuple[Mapping[str, Any], ...]:
    """``input``: a string (one user message) or a list of items, each checked."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return ({"type": "message", "role": "user", "content": value},)
    items = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise _bad(f"input[{i}] must be an object", "input")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                raise _bad(f"input[{i}].role must be one of user, assistant, system, developer", "input")
            _text_of(item.get("content"), f"input[{i}].content")
        elif kind == "function_call":
            for key in ("call_id", "name"):
                if not isinstance(item.get(key), str):
                    raise _bad(f"input[{i}].{key} must be a string", "input")
            _arguments(item.get("arguments"), f"input[{i}].arguments")
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise _bad(f"input[{i}].call_id must be a string", "input")
        elif kind != "reasoning":
            raise _bad(f"input[{i}].type {kind!r} is not supported", "input")
        items.append({**item, "type": kind})
    return tuple(items)


def _text_of(content: Any, where: str, images: list[ImageRef] | None = None) -> str | list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or an array of content parts", "input")
    texts: list[str | ImageRef] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            if not isinstance(part.get("text", part.get("refusal")), str):
                raise _bad(f"{where}[{j}].text must be a string", "input")
            texts.append(part.get("text", part.get("refusal")))
        elif kind == "input_image":
            texts.append(url_ref(part.get("image_url"), f"{where}[{j}]") if part.get("image_url") is not None
                         else ImageRef(where=f"{where}[{j}]", error="input_image needs an image_url (file_id is "
                                                                    "not supported)"))
        elif kind in ("input_file", "input_audio"):
            raise _bad(f"{where}[{j}]: {kind} is not supported by the served model", "input")
        else:
            raise _bad(f"{where}[{j}].type {kind!r} is not supported", "input")
    if images is not None:
        images.extend(t for t in texts if isinstance(t, ImageRef))
    return content_parts(texts)


def _arguments(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise _bad(f"{where} must be a JSON string", "input")
    try:
        parsed = json.loads(value or "{}")
    except json.JSONDecodeError as exc:
        raise _bad(f"{where} is not valid JSON: {exc}", "input") from None
    # Templates (Qwen3's among them) expect arguments as a mapping, not a JSON string.
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def _output_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        return "".join(p.get("text", "") for p in value if isinstance(p.get("text"), str))
    return json.dumps(value, ensure_ascii=False)


def chat_input(instructions: str | None, items: Sequence[Mapping[str, Any]],
               tools: tuple[Mapping[str, Any], ...] | None, reasoning_effort: str | None) -> ChatInput:
    """The chat the model sees for ``instructions`` + ``items`` (the whole conversation)."""
    system = [instructions] if instructions else []
    messages: list[dict[str, Any]] = []
    images: list[ImageRef] = []
    for i, item in enumerate(items):
        kind = item["type"]
        if kind == "message":
            system_role = item["role"] in ("system", "developer")
            text = _text_of(item.get("content"), f"input[{i}].content", None if system_role else images)
            if system_role:
                if not isinstance(text, str):
                    raise _bad(f"input[{i}].content: images go in user messages, not {item['role']} ones", "input")
                system.append(text)
            else:
                messages.append({"role": item["role"], "content": text})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": _arguments(item.get("arguments"), "arguments")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _output_text(item.get("output", ""))})
    if system:
        messages.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return ChatInput(messages=tuple(messages), tools=tools, reasoning_effort=reasoning_effort,
                     images=tuple(images))


def output_as_input(output: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    """A stored response's output items as the next turn's input (reasoning dropped)."""
    items: list[Mapping[str, Any]] = []
    for item in output:
        if item.get("type") == "message":
            items.append({"type": "message", "role": "assistant", "content": item.get("content") or []})
        elif item.get("type") == "function_call":
            items.append({"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                          "arguments": item.get("arguments", "")})
    return tuple(items)


def _tools(tools: Any) -> tuple[Mapping[str, Any], ...] | None:
    """Function tools, as chat-completions tools; hosted tools (web_search …) cannot run here."""
    out = []
    for i, tool in enumerate(tools or ()):
        if not isinstance(tool, dict):
            raise _bad(f"tools[{i}] must be an object", "tools")
        if tool.get("type") != "function":
            continue
        if not isinstance(tool.get("name"), str):
            raise _bad(f"tools[{i}].name must be a string", "tools")
        function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return tuple(out) or None


def _tool_choice(choice: Any, tools: tuple[Mapping[str, Any], ...] | None) -> tuple[bool, tuple[str, ...]]:
    """``(tools_on, forced names)`` for a ``tool_choice``."""
    names = [t["function"]["name"] for t in tools or ()]
    if choice is None or choice == "auto":
        return True, ()
    if choice == "none":
        return False, ()
    if choice == "required":
        if not names:
            raise _bad("tool_choice 'required' needs at least one function tool", "tool_choice")
        return True, tuple(names)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        if choice["name"] not in names:
            raise _bad(f"tool_choice names {choice['name']!r}, which is not in tools", "tool_choice")
        return True, (choice["name"],)
    raise _bad("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}",
               "tool_choice")


def _text_format(text: Any) -> StructuredOutput | None:
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (``name``/``schema``/``strict``
    beside ``type``), plus mlxrt's ``regex`` and ``choice``."""
    if text is not None and not isinstance(text, dict):
        raise InvalidRequest("text must be an object", param="text")
    return structured_output((text or {}).get("format"), param="text.format", flat=True)


def decode_response(body: Mapping[str, Any], claimed: Mapping[str, type] | None = None, *,
                    strict: bool = False) -> DecodedResponse:
    claimed = claimed or {}
    known = {r.name for r in RESPONSES_RULES} | {f.name for f in attrs.fields(ResponsesRequest)} | _READ | set(claimed)
    ignored = ignored_fields(body, known, strict)
    check_fields(body, RESPONSES_RULES)
    request = structure(_CONVERTER, declared_fields(body, ResponsesRequest), ResponsesRequest)
    items = input_items(body.get("input"))
    if not items and request.previous_response_id is None:
        raise _bad("input is required (a string or a non-empty array of items)", "input")
    structured = _text_format(body.get("text"))
    tools = _tools(body.get("tools"))
    tools_on, forced = _tool_choice(body.get("tool_choice"), tools)
    return DecodedResponse(request=request, input=items, tools=tools if tools_on else None,
                           tool_choice=body.get("tool_choice", "auto"), forced=forced,
                           extra=claimed_values(body, claimed), ignored=ignored, structured=structured,
                           adapter=adapter_field(body),
                           text_format=dict(((body.get("text") or {}).get("format")) or {"type": "text"}))
