"""Decoding OpenAI chat bodies: raw JSON → validated wire request, chat input and stops."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from mlxrt.api.wire import check_fields, strict_converter, structure
from mlxrt.errors import InvalidRequest
from mlxrt.plugins.openai.wire import CHAT_RULES, ROLES, ChatCompletionRequest
from mlxrt.templating import ChatInput

__all__ = ["DecodedChat", "decode_chat", "decode_stop"]

_CONVERTER = strict_converter()

#: Fields mlx_lm.server accepts whose features arrive with the OpenAI-dialect issue. A
#: request that asks for them (a non-neutral value) is refused by name instead of ignored.
_NOT_YET = {
    "repetition_penalty": (0, 0.0, 1, 1.0),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "xtc_probability": (0, 0.0),
    "logit_bias": ({},),
    "logprobs": (False,),
    "top_logprobs": (-1, 0),
    "n": (1,),
    "response_format": ({"type": "text"},),
    "tool_choice": ("auto", "none"),
    "adapter": ("none",),
    "adapters": (),
}


@attrs.frozen
class DecodedChat:
    request: ChatCompletionRequest
    chat: ChatInput
    stop: tuple[str, ...]
    extra: Mapping[str, Any] = attrs.field(factory=dict)


def decode_stop(value: Any) -> tuple[str, ...]:
    """``stop``: a string or a list of strings (mlx_lm.server dies on anything else)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise InvalidRequest("stop must be a string or a list of strings", param="stop")


def _text_of(content: Any, where: str) -> str | list[dict[str, Any]] | None:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or an array of content parts",
                             param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequest(f"{where}.content[{j}] must be an object with a type", param=f"{where}.content")
        if part["type"] in ("text", "input_text"):
            if not isinstance(part.get("text"), str):
                raise InvalidRequest(f"{where}.content[{j}].text must be a string", param=f"{where}.content")
            texts.append(part["text"])
        elif part["type"] in ("image_url", "image", "input_image"):
            raise InvalidRequest(f"{where}.content[{j}]: the served model has no vision input",
                                 param=f"{where}.content")
        else:
            raise InvalidRequest(f"{where}.content[{j}].type {part['type']!r} is not supported",
                                 param=f"{where}.content")
    return "".join(texts)


def _decode_message(i: int, msg: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise InvalidRequest(f"{where} must be an object", param="messages")
    role = msg.get("role")
    if not isinstance(role, str):
        raise InvalidRequest(f"{where}.role must be a string", param=f"{where}.role")
    if role not in ROLES:
        raise InvalidRequest(f"{where}.role {role!r} is not one of {', '.join(sorted(ROLES))}",
                             param=f"{where}.role")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": _text_of(msg.get("content"), where)}
    if out["content"] is None and role != "assistant":
        raise InvalidRequest(f"{where}.content is required for role {role!r}", param=f"{where}.content")
    if out["content"] is None:
        out["content"] = ""
    for key in ("name", "tool_call_id", "reasoning", "reasoning_content"):
        if key in msg and msg[key] is not None:
            if not isinstance(msg[key], str):
                raise InvalidRequest(f"{where}.{key} must be a string", param=f"{where}.{key}")
            out[key] = msg[key]
    if msg.get("tool_calls") is not None:
        out["tool_calls"] = _decode_tool_calls(msg["tool_calls"], where)
    return out


def _decode_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    import json

    if not isinstance(calls, list):
        raise InvalidRequest(f"{where}.tool_calls must be an array", param=f"{where}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"{where}.tool_calls[{j}].function.name must be a string",
                                 param=f"{where}.tool_calls")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except json.JSONDecodeError as exc:
                raise InvalidRequest(f"{where}.tool_calls[{j}].function.arguments is not valid JSON: {exc}",
                                     param=f"{where}.tool_calls") from None
        # Templates (Qwen3's among them) expect arguments as a mapping, not a JSON string.
        out.append({"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def _decode_tools(tools: Any) -> tuple[Mapping[str, Any], ...] | None:
    if not tools:
        return None
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                                 param="tools")
    return tuple(tools)


def _claimed(body: Mapping[str, Any], claimed: Mapping[str, type]) -> dict[str, Any]:
    extra = {}
    for name, kind in claimed.items():
        if name not in body or body[name] is None:
            continue
        value = body[name]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            raise InvalidRequest(f"{name} must be of type {kind.__name__}", param=name)
        extra[name] = value
    return extra


def _refuse_unimplemented(body: Mapping[str, Any], claimed: Mapping[str, type]) -> None:
    for name, neutral in _NOT_YET.items():
        if name in claimed:
            continue
        if name in body and body[name] is not None and body[name] not in neutral:
            raise InvalidRequest(f"{name} is not supported by this server yet", param=name,
                                 code="unsupported_parameter")


def decode_chat(body: Mapping[str, Any], claimed: Mapping[str, type] | None = None) -> DecodedChat:
    """Validate a chat-completions body (mlx_lm.server's rules and texts, stricter types).

    ``claimed`` are the plugin-claimed fields (``mlxrt_request_fields``): type-checked and
    returned in ``extra``.
    """
    claimed = claimed or {}
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("Request did not contain messages", param="messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages must be of type list", param="messages")
    if not messages:
        raise InvalidRequest("messages must contain at least one message", param="messages")
    check_fields(body, CHAT_RULES)
    _refuse_unimplemented(body, claimed)
    extra = _claimed(body, claimed)
    stop = decode_stop(body.get("stop"))
    fields = {f.name for f in attrs.fields(ChatCompletionRequest)}
    request = structure(_CONVERTER, {k: v for k, v in body.items() if k in fields}, ChatCompletionRequest)
    decoded = tuple(_decode_message(i, m) for i, m in enumerate(messages))
    tools = _decode_tools(body.get("tools")) if body.get("tool_choice") != "none" else None
    chat = ChatInput(
        messages=decoded,
        tools=tools,
        template_kwargs=request.chat_template_kwargs or {},
        reasoning_effort=request.reasoning_effort,
    )
    return DecodedChat(request=request, chat=chat, stop=stop, extra=extra)
