"""Decoding Anthropic Messages bodies: raw JSON → validated wire request and a dialect-neutral
:class:`~mlxrt.records.ChatInput` (OpenAI-shaped messages, which every chat template reads).

Blocks map as Anthropic's own OpenAI compatibility layer does: ``text`` blocks join into the
message's content, an assistant's ``tool_use`` blocks become its ``tool_calls`` and its
``thinking`` blocks its ``reasoning_content`` (as the OpenAI dialect passes it, so the chat
template renders the same prompt either way), a user's ``tool_result`` blocks become ``tool``
messages (before the rest of that user turn, which also takes the results' images), and
``system`` entries inside ``messages`` (current Claude Code) become system messages at their
place (:func:`mlxrt.templating.render_chat` folds them into user turns for a template that
cannot render them there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

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
from mlxrt.loading.images import ImageRef, content_parts
from mlxrt.plugins.anthropic.wire import (
    COUNT_RULES,
    EFFORTS,
    MESSAGES_RULES,
    THINKING_TYPES,
    TOOL_CHOICE_TYPES,
    MessagesRequest,
    ThinkingConfig,
)
from mlxrt.records import ChatInput

__all__ = ["DecodedMessages", "decode_messages", "reasoning_effort"]

_CONVERTER = strict_converter()
_ROLES = frozenset({"user", "assistant", "system"})
#: Body fields read besides the wire type's (``model`` is read and not acted on: one served model).
_READ = frozenset({"messages", "system", "tools", "tool_choice", "thinking", "service_tier", "adapter",
                   "output_config"})
#: ``output_config`` keys read; any other is reported as ``output_config.<key>`` in ``x-mlxrt-ignored``.
_OUTPUT_CONFIG = frozenset({"effort"})


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
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{where}.text: Field required (a string)", where)
    return text


def _tool_content(content: Any, where: str, images: list[ImageRef]) -> str:
    """A tool_result's content (a string or blocks) as one string; its ``image`` blocks go to
    ``images``, which the rest of the user turn carries (images in user turns are what every
    vision template renders, and a model without vision refuses them as in any user turn)."""
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
            parts.append(_text(block, f"{where}.{j}"))
        elif kind == "image":
            images.append(_image(block, f"{where}.{j}"))
        elif isinstance(kind, str):
            # A tool's PDF or search result must not end an agent's session: the model is
            # told what it cannot see instead.
            parts.append(f"[{kind} omitted: the served model reads text and images only]")
        else:
            raise _bad(f"{where}.{j}: must be an object with a type", where)
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
    if isinstance(source, dict):
        kind = source.get("type")
        if kind == "base64" and isinstance(source.get("data"), str):
            media = source.get("media_type")
            return ImageRef(where=where, data=source["data"], media_type=media if isinstance(media, str) else None)
        if kind == "url" and isinstance(source.get("url"), str):
            return ImageRef(where=where, url=source["url"])
    return ImageRef(where=where, error='source must be {"type": "base64", "media_type", "data"} '
                                       'or {"type": "url", "url"}')


def _system_entry(where: str, content: Any) -> dict[str, Any]:
    """A ``system`` entry inside ``messages`` (Claude Code's mid-conversation system): a string
    or text blocks, joined with newlines as the ``system`` field's blocks are."""
    if isinstance(content, str):
        return {"role": "system", "content": content}
    if not isinstance(content, list):
        raise _bad(f"{where}.content: a system entry's content must be a string or a list of text blocks",
                   "messages")
    parts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            got = f"{kind!r}" if isinstance(kind, str) else "an object without a type"
            raise _bad(f"{where}.content.{j}: a system entry takes text blocks only (got {got})", "messages")
        parts.append(_text(block, f"{where}.content.{j}"))
    return {"role": "system", "content": "\n".join(parts)}


def _message(i: int, msg: Any, out: list[dict[str, Any]], images: list[ImageRef]) -> None:
    where = f"messages.{i}"
    if not isinstance(msg, dict):
        raise _bad(f"{where}: must be an object", "messages")
    role = msg.get("role")
    if not isinstance(role, str) or role not in _ROLES:  # a dict or list role is unhashable
        raise _bad(f"{where}.role: Input should be 'user', 'assistant' or 'system'", "messages")
    content = msg.get("content")
    if role == "system":
        out.append(_system_entry(where, content))
        return
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise _bad(f"{where}.content: must be a string or a list of content blocks", "messages")
    texts: list[str | ImageRef] = []
    #: Images of this turn's tool results: they lead the rest of the turn.
    results: list[ImageRef] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "thinking" and role == "assistant":
            if not isinstance(block.get("thinking"), str):
                raise _bad(f"{at}.thinking: Field required (a string)", "messages")
            thoughts.append(block["thinking"])
        elif kind in ("thinking", "redacted_thinking"):
            continue  # redacted: encrypted by Anthropic, nothing a local model can read
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
                        "content": _tool_content(block.get("content"), f"{at}.content", results)})
        elif kind == "image":
            texts.append(_image(block, at))
        elif isinstance(kind, str):
            raise _bad(f"{at}.type: {kind!r} is not supported in a {role} message", "messages")
        else:
            raise _bad(f"{at}: must be an object with a type", "messages")
    texts = [*results, *texts]
    if texts or calls or thoughts:
        images.extend(t for t in texts if isinstance(t, ImageRef))
        message: dict[str, Any] = {"role": role, "content": content_parts(texts, "\n")}
        if thoughts:
            # The key the OpenAI dialect passes: templates render the reasoning of the
            # current tool loop (Qwen3) and drop older turns' themselves.
            message["reasoning_content"] = "\n".join(thoughts)
        if calls:
            message["tool_calls"] = calls
        out.append(message)


def _prefill(messages: list[Any], chat_messages: list[dict[str, Any]]) -> bool:
    """Whether the answer continues the last message: Anthropic's prefill, a last ``assistant``
    message of text (no tool calls), which the answer goes on from. Its text may not end in
    whitespace (Anthropic's 400: the continuation would start inside a token)."""
    last = chat_messages[-1] if chat_messages else {}
    if not (isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant" and last.get("role") == "assistant"
            and not last.get("tool_calls") and isinstance(last.get("content"), str) and last["content"]):
        return False
    if last["content"] != last["content"].rstrip():
        raise _bad(f"messages.{len(messages) - 1}: final assistant content cannot end with trailing whitespace",
                   "messages")
    return True


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
        # OpenAI's key order: templates dump tools as JSON, so both dialects render them alike.
        function: dict[str, Any] = {"name": tool["name"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = tool["input_schema"]
        out.append({"type": "function", "function": function})
    return tuple(out) or None


def reasoning_effort(thinking: ThinkingConfig | None, effort: str | None = None) -> str | None:
    """``thinking`` and ``output_config.effort`` as a reasoning effort, the switch families
    read (``"none"`` is off; ``None``: the template's default).

    ``disabled`` is off whatever the effort; otherwise an explicit effort wins (``max`` reads as
    ``high``, the strongest effort templates take), then an ``enabled`` budget (under 4096 low,
    under 16384 medium, else high); ``adaptive`` alone is on at Anthropic's default effort, high.
    """
    if thinking is not None and thinking.type == "disabled":
        return "none"
    if effort is not None:
        return "high" if effort == "max" else effort
    if thinking is None:
        return None
    if thinking.type == "adaptive":
        return "high"
    budget = thinking.budget_tokens or 0
    return "low" if budget < 4096 else "medium" if budget < 16384 else "high"


def _output_config(value: Any) -> tuple[str | None, tuple[str, ...]]:
    """``output_config``: its ``effort`` and the keys mlxrt does not read (as
    ``output_config.<key>``, for ``x-mlxrt-ignored``)."""
    if value is None:
        return None, ()
    effort = value.get("effort")
    if effort is not None and (not isinstance(effort, str) or effort not in EFFORTS):
        raise _bad("output_config.effort: Input should be 'low', 'medium', 'high' or 'max'", "output_config")
    return effort, tuple(f"output_config.{k}" for k in value if k not in _OUTPUT_CONFIG)


def _structure(body: Mapping[str, Any]) -> MessagesRequest:
    request = structure(_CONVERTER, declared_fields(body, MessagesRequest), MessagesRequest)
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
    check_fields(body, rules)
    effort, unread = _output_config(body.get("output_config"))
    ignored = ignored_fields({**body, **dict.fromkeys(unread)}, known, strict)
    messages = body.get("messages")
    if messages is None:
        raise _bad("messages: Field required", "messages")
    if not count_only and body.get("max_tokens") is None:
        raise _bad("max_tokens: Field required", "max_tokens")
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
    prefill = _prefill(messages, chat_messages)
    chat = ChatInput(messages=tuple(chat_messages), tools=tools,
                     reasoning_effort=reasoning_effort(request.thinking, effort), images=tuple(images),
                     add_generation_prompt=not prefill, continue_final_message=prefill)
    return DecodedMessages(request=request, chat=chat, stop=tuple(s for s in stops if s), forced=forced,
                           extra=claimed_values(body, claimed), ignored=ignored, adapter=adapter_field(body))
