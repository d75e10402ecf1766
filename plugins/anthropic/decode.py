"""Decoding Anthropic Messages bodies: raw JSON → validated wire request and a dialect-neutral
:class:`~mlxrt.records.ChatInput` (OpenAI-shaped messages, which every chat template reads).

Blocks map as Anthropic's own OpenAI compatibility layer does: ``text`` blocks join into the
message's content, an assistant's ``tool_use`` blocks become its ``tool_calls``, a user's
``tool_result`` blocks become ``tool`` messages (before the rest of that user turn), and
``thinking`` blocks of earlier turns are dropped (templates re-derive them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from mlxrt.api.wire import (
    adapter_field,
    check_fields,
    claimed_values,
    ignored_fields,
    ignored_headers,
    strict_converter,
    structure,
)
from mlxrt.errors import InvalidRequest
from mlxrt.images import ImageRef, content_parts
from mlxrt.plugins.anthropic.wire import (
    COUNT_RULES,
    MESSAGES_RULES,
    THINKING_TYPES,
    TOOL_CHOICE_TYPES,
    MessagesRequest,
    ThinkingConfig,
)
from mlxrt.records import ChatInput

__all__ = ["DecodedMessages", "decode_messages", "reasoning_effort"]

_CONVERTER = strict_converter()
_ROLES = frozenset({"user", "assistant"})
#: Body fields read besides the wire type's (``model`` is read and not acted on: one served model).
_READ = frozenset({"messages", "system", "tools", "tool_choice", "thinking", "service_tier", "adapter"})


@attrs.frozen
class DecodedMessages:
    request: MessagesRequest
    chat: ChatInput
    stop: tuple[str, ...]
    #: Tools the answer must call (``tool_choice`` ``any``: every tool; ``tool``: the named one).
    forced: tuple[str, ...] = ()
    extra: Mapping[str, Any] = attrs.field(factory=dict)
    ignored: tuple[str, ...] = ()
    #: The ``adapter`` field (``None``: the server's default adapter set).
    adapter: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return ignored_headers(self.ignored)


def _bad(message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _text(block: Mapping[str, Any], where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise _bad(f"{where}.text: Field required (a string)", where)
    return block["text"]


def _flatten(content: Any, where: str) -> str:
    """A tool_result's content (a string or text blocks) as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}: must be a string or a list of content blocks", where)
    parts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(_text(block, f"{where}[{j}]"))
        elif isinstance(kind, str):
            # A tool's screenshot or PDF must not end an agent's session: the model is told
            # what it cannot see instead.
            parts.append(f"[{kind} omitted: the served model reads text only]")
        else:
            raise _bad(f"{where}[{j}]: must be an object with a type", where)
    return "\n".join(parts)


def system_text(system: Any) -> str:
    """``system``: a string or text blocks, joined with newlines (Claude Code sends blocks)."""
    if system is None or isinstance(system, str):
        return system or ""
    parts = []
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _bad(f"system[{j}]: must be a text block", "system")
        parts.append(_text(block, f"system[{j}]"))
    return "\n".join(parts)


def _image(block: Mapping[str, Any], where: str) -> ImageRef:
    """An image block's ``source``: ``{"type": "base64", "media_type", "data"}`` or
    ``{"type": "url", "url"}``; a malformed one is reported only if the model takes images."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type")
        return ImageRef(where=where, data=source["data"], media_type=media if isinstance(media, str) else None)
    if kind == "url" and isinstance(source.get("url"), str):
        return ImageRef(where=where, url=source["url"])
    return ImageRef(where=where, error='source must be {"type": "base64", "media_type", "data"} '
                                       'or {"type": "url", "url"}')


def _message(i: int, msg: Any, out: list[dict[str, Any]], images: list[ImageRef] | None = None) -> None:
    where = f"messages.{i}"
    if not isinstance(msg, dict):
        raise _bad(f"{where}: must be an object", "messages")
    role = msg.get("role")
    if not isinstance(role, str) or role not in _ROLES:  # a dict or list role is unhashable
        raise _bad(f"{where}.role: Input should be 'user' or 'assistant'", "messages")
    content = msg.get("content")
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise _bad(f"{where}.content: must be a string or a list of content blocks", "messages")
    texts: list[str | ImageRef] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text(block, at))
        elif kind in ("thinking", "redacted_thinking"):
            continue
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str):
                raise _bad(f"{at}.name: Field required", "messages")
            args = block.get("input") if block.get("input") is not None else {}
            if not isinstance(args, dict):
                raise _bad(f"{at}.input: must be an object", "messages")
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block["name"], "arguments": args}})
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise _bad(f"{at}.tool_use_id: Field required", "messages")
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                        "content": _flatten(block.get("content"), f"{at}.content")})
        elif kind == "image":
            texts.append(_image(block, at))
        elif isinstance(kind, str):
            raise _bad(f"{at}.type: {kind!r} is not supported in a {role} message", "messages")
        else:
            raise _bad(f"{at}: must be an object with a type", "messages")
    if texts or calls:
        if images is not None:
            images.extend(t for t in texts if isinstance(t, ImageRef))
        message: dict[str, Any] = {"role": role, "content": content_parts(texts, "\n")}
        if calls:
            message["tool_calls"] = calls
        out.append(message)


def _tools(tools: Any) -> tuple[dict[str, Any], ...] | None:
    """Client tools as OpenAI function tools; server tools (no ``input_schema``) are dropped."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise _bad(f"tools.{i}.name: Field required", "tools")
        if "input_schema" not in tool:
            continue  # a server tool (web_search, bash_…): the model cannot run it here
        if not isinstance(tool["input_schema"], dict):
            raise _bad(f"tools.{i}.input_schema: must be an object", "tools")
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return tuple(out) or None


def reasoning_effort(thinking: ThinkingConfig | None) -> str | None:
    """``thinking`` as a reasoning effort, the switch families read (``"none"`` is off)."""
    if thinking is None or thinking.type == "adaptive":
        return None
    if thinking.type == "disabled":
        return "none"
    budget = thinking.budget_tokens or 0
    return "low" if budget < 4096 else "medium" if budget < 16384 else "high"


def _structure(body: Mapping[str, Any]) -> MessagesRequest:
    fields = {f.name for f in attrs.fields(MessagesRequest)}
    request = structure(_CONVERTER, {k: v for k, v in body.items() if k in fields}, MessagesRequest)
    if request.thinking is not None and request.thinking.type not in THINKING_TYPES:
        raise _bad("thinking.type: Input should be 'enabled', 'disabled' or 'adaptive'", "thinking")
    choice = request.tool_choice
    if choice is not None:
        if choice.type not in TOOL_CHOICE_TYPES:
            raise _bad("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'", "tool_choice")
        if choice.type == "tool" and not choice.name:
            raise _bad("tool_choice.name: Field required", "tool_choice")
    return request


def decode_messages(body: Mapping[str, Any], claimed: Mapping[str, type] | None = None, *,
                    strict: bool = False, count_only: bool = False) -> DecodedMessages:
    """Validate a Messages (or count_tokens) body; Anthropic requires ``max_tokens``."""
    claimed = claimed or {}
    rules = COUNT_RULES if count_only else MESSAGES_RULES
    known = {r.name for r in rules} | {f.name for f in attrs.fields(MessagesRequest)} | _READ | set(claimed)
    ignored = ignored_fields(body, known, strict)
    messages = body.get("messages")
    if messages is None:
        raise _bad("messages: Field required", "messages")
    if not count_only and body.get("max_tokens") is None:
        raise _bad("max_tokens: Field required", "max_tokens")
    check_fields(body, rules)
    if not messages:
        raise _bad("messages: at least one message is required", "messages")
    stops = body.get("stop_sequences") or []
    if not all(isinstance(s, str) for s in stops):
        raise _bad("stop_sequences: must be a list of strings", "stop_sequences")
    request = _structure(body)
    chat_messages: list[dict[str, Any]] = []
    system = system_text(body.get("system"))
    if system:
        chat_messages.append({"role": "system", "content": system})
    images: list[ImageRef] = []
    for i, msg in enumerate(messages):
        _message(i, msg, chat_messages, images)
    tools = _tools(body.get("tools"))
    choice = request.tool_choice
    forced: tuple[str, ...] = ()
    if choice is not None and choice.type == "none":
        tools = None
    elif choice is not None and choice.type in ("any", "tool"):
        names = [t["function"]["name"] for t in tools or ()]
        if choice.type == "tool":
            if choice.name not in names:
                raise _bad(f"tool_choice.name: no tool named {choice.name!r} in tools", "tool_choice")
            names = [choice.name]
        if not names:
            raise _bad(f"tool_choice: type {choice.type!r} needs at least one tool", "tool_choice")
        forced = tuple(names)
    chat = ChatInput(messages=tuple(chat_messages), tools=tools,
                     reasoning_effort=reasoning_effort(request.thinking), images=tuple(images))
    return DecodedMessages(request=request, chat=chat, stop=tuple(s for s in stops if s), forced=forced,
                           extra=claimed_values(body, claimed), ignored=ignored, adapter=adapter_field(body))
