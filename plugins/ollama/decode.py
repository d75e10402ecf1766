"""Decoding Ollama bodies: ``/api/chat`` and ``/api/generate`` → a chat (OpenAI-shaped
messages, which every chat template reads) and :class:`~mlxrt.records.RequestOptions`.

Ollama's shapes map onto the other dialects' like this: ``options`` holds the sampling fields
(``repeat_penalty`` is mlx-lm's ``repetition_penalty`` over the last ``repeat_last_n``
tokens), ``num_predict`` is the answer's limit (negative: none), ``format`` is a JSON mode or a
JSON schema (the structured-output grammar), ``think`` is the reasoning switch, ``images`` are
base64 images of a user turn, and a tool call's ``arguments`` is an object. Fields Ollama has
that change nothing here (load-time options such as ``num_gpu``, ``mirostat``) are named in
``x-mlxrt-ignored`` as ``options.<name>``, as every dialect reports what it did not act on.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxrt.api.output_format import json_schema_output
from mlxrt.api.wire import (
    FieldRule,
    adapter_field,
    check_fields,
    claimed_values,
    ignored_fields,
    ignored_headers,
)
from mlxrt.errors import InvalidRequest
from mlxrt.loading.images import ImageRef, content_parts
from mlxrt.plugins.ollama.wire import keep_alive_seconds, pool_name
from mlxrt.records import ChatInput, RequestOptions, StructuredOutput

__all__ = ["OllamaWire", "Decoded", "decode_chat", "decode_generate", "decode_options", "CHAT_DEFAULT_MAX_TOKENS"]

#: The answer's limit when neither ``num_predict`` nor ``num_ctx`` sets one (Ollama's default is
#: "until the context is full"; admission caps this to the context).
CHAT_DEFAULT_MAX_TOKENS = 65536
_ROLES = frozenset({"system", "user", "assistant", "tool"})
_EFFORTS = frozenset({"low", "medium", "high"})

_COMMON = (
    FieldRule("model", (str,)),
    FieldRule("stream", (bool,)),
    FieldRule("options", (dict,)),
    FieldRule("format", (str, dict)),
    FieldRule("keep_alive", (str, int, float)),
    FieldRule("think", (bool, str)),
)
CHAT_RULES = (*_COMMON, FieldRule("messages", (list,)), FieldRule("tools", (list,)))
GENERATE_RULES = (*_COMMON, FieldRule("prompt", (str,)), FieldRule("system", (str,)), FieldRule("raw", (bool,)),
                  FieldRule("images", (list,)), FieldRule("suffix", (str,)), FieldRule("template", (str,)),
                  FieldRule("context", (list,)))
_CHAT_READ = frozenset({"model", "stream", "options", "format", "keep_alive", "think", "messages", "tools",
                        "adapter"})
_GENERATE_READ = frozenset({"model", "stream", "options", "format", "keep_alive", "think", "prompt", "system",
                            "raw", "images", "adapter"})

#: ``options`` read: name → (types, minimum, maximum).
_OPTIONS: dict[str, tuple[tuple[type, ...], float | None, float | None]] = {
    "num_predict": ((int,), None, None),
    "num_ctx": ((int,), 1, None),
    "temperature": ((int, float), 0, None),
    "top_k": ((int,), 0, None),
    "top_p": ((int, float), 0, 1),
    "min_p": ((int, float), 0, 1),
    "repeat_penalty": ((int, float), 0, None),
    "repeat_last_n": ((int,), -1, None),
    "presence_penalty": ((int, float), None, None),
    "frequency_penalty": ((int, float), None, None),
    "seed": ((int,), None, None),
    "stop": ((list, str), None, None),
}


@attrs.frozen
class OllamaWire:
    """What the encoder needs of the request: which route, when it began (``time.monotonic_ns``,
    for ``total_duration``), the model load it waited for (``load_duration``), ``keep_alive``."""

    route: str
    started: int
    keep_alive: float | None = None
    load_ns: int = 0


@attrs.frozen
class Decoded:
    chat: ChatInput
    options: RequestOptions
    model: str | None
    stream: bool
    headers: Mapping[str, str]
    wire: OllamaWire
    #: ``/api/generate``'s ``raw`` prompt (no template), else ``None``.
    raw: str | None = None


def _bad(message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _is(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and not isinstance(value, bool)


def decode_options(value: Any, structured: StructuredOutput | None = None, *, adapter: str | None = None,
                   tools: tuple[Mapping[str, Any], ...] | None = None, extra: Mapping[str, Any] | None = None
                   ) -> tuple[RequestOptions, list[str]]:
    """``options`` as :class:`~mlxrt.records.RequestOptions`, and the option names not acted on."""
    given = value or {}
    for name, raw in given.items():
        if name not in _OPTIONS or raw is None:
            continue
        types, low, high = _OPTIONS[name]
        if not _is(raw, types):
            raise _bad(f"options.{name}: must be {'a number' if float in types else 'an integer'}"
                       if name != "stop" else "options.stop: must be a string or a list of strings", "options")
        if low is not None and not isinstance(raw, (list, str)) and raw < low:
            raise _bad(f"options.{name}: must be at least {low:g}", "options")
        if high is not None and not isinstance(raw, (list, str)) and raw > high:
            raise _bad(f"options.{name}: must be at most {high:g}", "options")
    opt = {k: v for k, v in given.items() if k in _OPTIONS and v is not None}
    stop = opt.get("stop", [])
    stops = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) for s in stops):
        raise _bad("options.stop: must be a string or a list of strings", "options")
    sampling: dict[str, Any] = {k: opt.get(k) for k in ("temperature", "top_k", "top_p", "min_p",
                                                         "presence_penalty", "frequency_penalty")}
    last_n = opt.get("repeat_last_n")
    if last_n != 0:  # Ollama's 0 turns the penalty off; -1 is the whole context (mlx-lm's 0)
        sampling["repetition_penalty"] = opt.get("repeat_penalty")
        sampling["repetition_context_size"] = 0 if last_n == -1 else last_n
    predict = opt.get("num_predict")
    max_tokens = predict if isinstance(predict, int) and predict > 0 else None
    if max_tokens is None and "num_ctx" in opt:
        # The answer may not run past the context the client sized (reduced to what fits, as
        # every max_tokens is).
        max_tokens = opt["num_ctx"]
    options = RequestOptions(sampling=sampling, max_tokens=max_tokens,
                             seed=opt.get("seed"), stop=tuple(s for s in stops if s), adapter=adapter, tools=tools,
                             structured=structured, extra=extra or {})
    return options, [f"options.{k}" for k in given if k not in _OPTIONS]


def _format(value: Any) -> StructuredOutput | None:
    """``format``: ``"json"`` (any JSON object) or a JSON schema; ``""`` is free text."""
    if value is None or value == "":
        return None
    if value == "json":
        return StructuredOutput(kind="json_object", param="format")
    if isinstance(value, dict):
        return json_schema_output(value, param="format")
    raise _bad('format: must be "json" or a JSON schema object', "format")


def _effort(think: Any) -> str | None:
    """``think``: ``true``/``false`` or an effort (``"low"``, ``"medium"``, ``"high"``)."""
    if think is None:
        return None
    if isinstance(think, bool):
        return "medium" if think else "none"
    if not isinstance(think, str) or think not in _EFFORTS:
        raise _bad('think: must be true, false, "low", "medium" or "high"', "think")
    return think


def _images(value: Any, where: str) -> list[ImageRef]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(f"{where}: must be a list of base64 images", where)
    return [ImageRef(where=f"{where}[{j}]", data=image) if isinstance(image, str) and image else
            ImageRef(where=f"{where}[{j}]", error="must be a base64 string") for j, image in enumerate(value)]


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    import json

    if not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls: must be a list", "messages")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"{where}.tool_calls[{j}].function.name: must be a string", "messages")
        args = fn.get("arguments")
        if isinstance(args, str):  # some clients send OpenAI's JSON text
            try:
                args = json.loads(args or "{}")
            except ValueError:
                raise _bad(f"{where}.tool_calls[{j}].function.arguments: not a JSON object", "messages") from None
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise _bad(f"{where}.tool_calls[{j}].function.arguments: must be an object", "messages")
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{j}"
        # Templates (Qwen3's among them) read the arguments as a mapping.
        out.append({"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def _message(i: int, msg: Any, images: list[ImageRef]) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise _bad(f"{where}: must be an object", "messages")
    role = msg.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise _bad(f"{where}.role: must be one of system, user, assistant, tool", "messages")
    content = msg.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise _bad(f"{where}.content: must be a string", "messages")
    refs = _images(msg.get("images"), f"{where}.images")
    images.extend(refs)
    out: dict[str, Any] = {"role": role, "content": content_parts([*refs, content]) if refs else content}
    thinking = msg.get("thinking")
    if isinstance(thinking, str) and thinking:
        out["reasoning_content"] = thinking  # as the OpenAI dialect passes it: templates render it
    if msg.get("tool_calls") is not None:
        out["tool_calls"] = _tool_calls(msg["tool_calls"], where)
    for key, as_key in (("tool_name", "name"), ("tool_call_id", "tool_call_id")):
        if isinstance(msg.get(key), str):
            out[as_key] = msg[key]
    return out


def _tools(value: Any) -> tuple[Mapping[str, Any], ...] | None:
    if not value:
        return None
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or tool.get("type", "function") != "function":
            raise _bad(f'tools[{i}]: must be {{"type": "function", "function": {{"name": ...}}}}', "tools")
    return tuple({**tool, "type": "function"} for tool in value)


def _common(body: Mapping[str, Any], rules: Sequence[FieldRule], read: frozenset[str], claimed: Mapping[str, type],
            strict: bool, route: str) -> tuple[OllamaWire, StructuredOutput | None, list[str]]:
    started = time.monotonic_ns()
    check_fields(body, rules)
    known = read | set(claimed)
    unread = [k for k in body if k not in known]
    ignored = list(ignored_fields({k: None for k in unread}, frozenset(), strict))
    return (OllamaWire(route=route, started=started, keep_alive=keep_alive_seconds(body.get("keep_alive"))),
            _format(body.get("format")), ignored)


def decode_chat(body: Mapping[str, Any], claimed: Mapping[str, type], *, strict: bool) -> Decoded:
    """An ``/api/chat`` body (its ``messages`` are non-empty: an empty list only loads the model)."""
    wire, structured, ignored = _common(body, CHAT_RULES, _CHAT_READ, claimed, strict, "chat")
    messages = body.get("messages") or []
    images: list[ImageRef] = []
    chat_messages = [_message(i, m, images) for i, m in enumerate(messages)]
    tools = _tools(body.get("tools"))
    options, unread = decode_options(body.get("options"), structured, adapter=adapter_field(body), tools=tools,
                                     extra=claimed_values(body, claimed))
    chat = ChatInput(messages=tuple(chat_messages), tools=tools, reasoning_effort=_effort(body.get("think")),
                     images=tuple(images))
    return Decoded(chat=chat, options=options, model=pool_name(body.get("model")), stream=body.get("stream") is not False,
                   headers=ignored_headers([*ignored, *unread]), wire=wire)


def decode_generate(body: Mapping[str, Any], claimed: Mapping[str, type], *, strict: bool) -> Decoded:
    """A ``/api/generate`` body: ``prompt`` (and ``system``, ``images``) as one user turn under the
    model's chat template, or as it is with ``raw``. ``suffix``, ``template`` and ``context`` are
    not acted on (reported)."""
    wire, structured, ignored = _common(body, GENERATE_RULES, _GENERATE_READ, claimed, strict, "generate")
    prompt = body.get("prompt") or ""
    options, unread = decode_options(body.get("options"), structured, adapter=adapter_field(body),
                                     extra=claimed_values(body, claimed))
    refs = _images(body.get("images"), "images")
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": body["system"]})
    messages.append({"role": "user", "content": content_parts([*refs, prompt]) if refs else prompt})
    raw = prompt if body.get("raw") else None
    if raw is not None and refs:
        raise _bad("images: a raw prompt takes no images (the template places them)", "images")
    chat = ChatInput(messages=tuple(messages), reasoning_effort=_effort(body.get("think")), images=tuple(refs))
    return Decoded(chat=chat, options=options, model=pool_name(body.get("model")), stream=body.get("stream") is not False,
                   headers=ignored_headers([*ignored, *unread]), wire=wire, raw=raw)
