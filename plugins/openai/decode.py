"""Decoding OpenAI bodies (chat and text completions): raw JSON → validated wire request,
prompt input and the request's :class:`~mlxrt.records.RequestOptions`.

Chat and completions share one validation path (:func:`decode_options`); the engine request
is built by the served model (:meth:`mlxrt.serving.ServedModel.plan`), as for every dialect.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs

from mlxrt.api.wire import (
    FieldRule,
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
from mlxrt.plugins.openai.llama_fields import request_structured, template_ending
from mlxrt.plugins.openai.wire import (
    CHAT_RULES,
    COMPLETION_RULES,
    ROLES,
    SAMPLING_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationFields,
)
from mlxrt.records import ChatInput, RequestOptions

__all__ = [
    "DecodedOptions", "DecodedChat", "DecodedCompletion",
    "decode_chat", "decode_completion", "decode_stop", "decode_logit_bias",
]

_CONVERTER = strict_converter()
W = TypeVar("W", bound=GenerationFields)

#: Fields mlx_lm.server accepts whose features mlxrt does not implement yet. A request that
#: asks for them (a non-neutral value) is refused by name instead of ignored.
_NOT_YET = {
    "adapters": (),
}
#: Fields every generation endpoint reads besides its rules, wire type and ``_NOT_YET`` table.
#: ``model`` and ``user`` are read and deliberately not acted on (one served model; no accounts).
_READ = frozenset({"messages", "prompt", "stop", "logit_bias", "stream_options", "tools", "tool_choice",
                   "response_format",
                   "model", "user", "adapter"})
#: Legacy-completions fields OpenAI has and mlx_lm.server silently ignores.
_NOT_YET_COMPLETIONS = {**_NOT_YET, "echo": (False,), "suffix": ("",), "best_of": (1,),
                        "tool_choice": ("auto", "none")}
_PROMPT_TEXT = ("prompt (a non-empty string) is required (token-array prompts are not accepted, "
                "matching mlx_lm.server)")
_INT_KEY = re.compile(r"-?[0-9]+")


@attrs.frozen
class DecodedOptions:
    """What chat and text completions share after validation."""

    request: GenerationFields
    #: How to answer: sampling, limits, stops, tools, ``response_format`` … (the pipeline's input).
    run: RequestOptions
    include_usage: bool
    #: Body fields mlxrt does not read (reported in ``x-mlxrt-ignored``; 400 under ``--strict``).
    ignored: tuple[str, ...] = ()

    @property
    def headers(self) -> dict[str, str]:
        return ignored_headers(self.ignored)


@attrs.frozen
class DecodedChat:
    request: ChatCompletionRequest
    chat: ChatInput
    options: DecodedOptions


@attrs.frozen
class DecodedCompletion:
    request: CompletionRequest
    prompt: str
    options: DecodedOptions


def decode_stop(value: Any) -> tuple[str, ...]:
    """``stop``: a string or a list of strings (mlx_lm.server dies on anything else).

    Any number of strings is accepted (OpenAI caps it at 4; mlx_lm.server does not); empty
    strings are dropped.
    """
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise InvalidRequest("stop must be a string or a list of strings", param="stop")


def decode_logit_bias(value: Any) -> dict[int, float]:
    """``logit_bias``: JSON object of token id (a decimal string key) → finite number."""
    if value is None:
        return {}
    bad = InvalidRequest("logit_bias must be a dict of int to float", param="logit_bias")
    if not isinstance(value, dict):
        raise bad
    out = {}
    for key, bias in value.items():
        if not isinstance(key, str) or not _INT_KEY.fullmatch(key):
            raise bad
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise bad
        out[int(key)] = float(bias)
    return out


def _stream_options(value: Any) -> bool:
    if value is None:
        return False
    usage = value.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise InvalidRequest("stream_options.include_usage must be of type bool", param="stream_options")
    return bool(usage)


def _text_of(content: Any, where: str, images: list[ImageRef]) -> str | list[dict[str, Any]] | None:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or an array of content parts",
                             param=f"{where}.content")
    texts: list[str | ImageRef] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequest(f"{where}.content[{j}] must be an object with a type", param=f"{where}.content")
        if part["type"] in ("text", "input_text"):
            if not isinstance(part.get("text"), str):
                raise InvalidRequest(f"{where}.content[{j}].text must be a string", param=f"{where}.content")
            texts.append(part["text"])
        elif part["type"] in ("image_url", "input_image"):
            texts.append(url_ref(part.get("image_url"), f"{where}.content[{j}]"))
        elif part["type"] == "image":  # mlx-bun's {"type": "image", "data": <base64>}
            texts.append(ImageRef(where=f"{where}.content[{j}]", data=part.get("data"))
                         if isinstance(part.get("data"), str) else url_ref(part.get("image_url"),
                                                                         f"{where}.content[{j}]"))
        else:
            raise InvalidRequest(f"{where}.content[{j}].type {part['type']!r} is not supported",
                                 param=f"{where}.content")
    images.extend(p for p in texts if isinstance(p, ImageRef))
    return content_parts(texts)


def _decode_message(i: int, msg: Any, images: list[ImageRef]) -> dict[str, Any]:
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
                           "content": _text_of(msg.get("content"), where, images)}
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


def _decode_tool_choice(value: Any, tools: tuple[Mapping[str, Any], ...] | None) -> tuple[str, ...]:
    """``tool_choice``: ``"none"``/``"auto"`` (free), ``"required"`` (every tool allowed) or
    ``{"type": "function", "function": {"name": ...}}``; returns the tools a call must use."""
    if value is None or value in ("auto", "none"):
        return ()
    names = tuple(t["function"]["name"] for t in tools or ())
    if value == "required":
        if not names:
            raise InvalidRequest("tool_choice 'required' needs at least one tool in tools", param="tool_choice")
        return names
    fn = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequest('tool_choice must be "none", "auto", "required" or '
                             '{"type": "function", "function": {"name": ...}}', param="tool_choice")
    if fn["name"] not in names:
        raise InvalidRequest(f"tool_choice names function {fn['name']!r}, which is not in tools",
                             param="tool_choice")
    return (fn["name"],)


def _refuse_unimplemented(body: Mapping[str, Any], claimed: Mapping[str, type],
                          table: Mapping[str, tuple[Any, ...]]) -> None:
    for name, neutral in table.items():
        if name in claimed:
            continue
        if name in body and body[name] is not None and body[name] not in neutral:
            raise InvalidRequest(f"{name} is not supported by this server yet", param=name,
                                 code="unsupported_parameter")


def decode_options(body: Mapping[str, Any], claimed: Mapping[str, type] | None, *,
                   rules: Sequence[FieldRule], cls: type[W],
                   not_yet: Mapping[str, tuple[Any, ...]] = _NOT_YET,
                   strict: bool = False) -> tuple[W, DecodedOptions]:
    """Validate the fields every generation endpoint shares and structure the wire request.

    ``claimed`` are the plugin-claimed fields (``mlxrt_request_fields``): type-checked and
    returned in ``extra``. Fields nobody reads are listed in ``ignored``; with ``strict`` they
    are a 400 instead.
    """
    claimed = claimed or {}
    known = {r.name for r in rules} | {f.name for f in attrs.fields(cls)} | set(not_yet) | _READ | set(claimed)
    ignored = ignored_fields(body, known, strict)
    check_fields(body, rules)
    _refuse_unimplemented(body, claimed, not_yet)
    extra = claimed_values(body, claimed)
    stop = decode_stop(body.get("stop"))
    logit_bias = decode_logit_bias(body.get("logit_bias"))
    include_usage = _stream_options(body.get("stream_options"))
    request = structure(_CONVERTER, declared_fields(body, cls), cls)
    run = RequestOptions(
        sampling={name: getattr(request, name) for name in SAMPLING_FIELDS}, max_tokens=request.requested_max_tokens,
        seed=request.seed, stop=stop, logit_bias=logit_bias, logprobs=request.logprob_count,
        adapter=adapter_field(body), structured=request_structured(body),
        num_draft_tokens=request.num_draft_tokens, extra=extra, n=request.n or 1,
        progress=bool(request.return_progress and request.stream), ignore_eos=bool(request.ignore_eos),
    )
    options = DecodedOptions(request=request, run=run, include_usage=include_usage, ignored=ignored)
    return request, options


def decode_chat(body: Mapping[str, Any], claimed: Mapping[str, type] | None = None, *,
                strict: bool = False) -> DecodedChat:
    """Validate a chat-completions body (mlx_lm.server's rules and texts, stricter types)."""
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("Request did not contain messages", param="messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages must be of type list", param="messages")
    if not messages:
        raise InvalidRequest("messages must contain at least one message", param="messages")
    request, options = decode_options(body, claimed, rules=CHAT_RULES, cls=ChatCompletionRequest,
                                      strict=strict)
    images: list[ImageRef] = []
    decoded = tuple(_decode_message(i, m, images) for i, m in enumerate(messages))
    tools = _decode_tools(body.get("tools")) if body.get("tool_choice") != "none" else None
    run = attrs.evolve(options.run, tools=tools, forced_tools=_decode_tool_choice(body.get("tool_choice"), tools),
                       parallel_tool_calls=request.parallel_tool_calls is not False)
    options = attrs.evolve(options, run=run)
    add_generation_prompt, continue_final = template_ending(decoded, request.add_generation_prompt,
                                                            request.continue_final_message)
    chat = ChatInput(
        messages=decoded,
        tools=tools,
        template_kwargs=request.chat_template_kwargs or {},
        reasoning_effort=request.reasoning_effort,
        images=tuple(images),
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final,
    )
    return DecodedChat(request=request, chat=chat, options=options)


def decode_completion(body: Mapping[str, Any], claimed: Mapping[str, type] | None = None, *,
                      strict: bool = False) -> DecodedCompletion:
    """Validate a text-completions body: a non-empty string ``prompt`` plus the shared fields."""
    prompt = body.get("prompt")
    if prompt is None:
        raise InvalidRequest("Request did not contain a prompt", param="prompt")
    if not isinstance(prompt, str) or not prompt:
        raise InvalidRequest(_PROMPT_TEXT, param="prompt")
    request, options = decode_options(body, claimed, rules=COMPLETION_RULES, cls=CompletionRequest,
                                      not_yet=_NOT_YET_COMPLETIONS, strict=strict)
    return DecodedCompletion(request=request, prompt=prompt, options=options)
