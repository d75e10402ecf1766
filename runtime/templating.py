"""Chat templating: messages (and tools) → prompt token ids, with the family's template
keyword arguments from ``mlxrt_chat_template_kwargs``; system messages a template cannot render
mid-conversation are folded by a rule that keeps the prompt cache hitting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.capabilities import STRUCTURED_OUTPUTS
from mlxrt.capabilities import declared as declared_by
from mlxrt.errors import InvalidRequest
from mlxrt.records import ChatInput, FamilyProfile, GenerationRequest
from mlxrt.text.reasoning import prompt_opens_thinking

if TYPE_CHECKING:
    from mlxrt.registry import PluginHost

__all__ = ["RenderedPrompt", "render_chat", "canonicalize", "DEFAULT_CHAT_TEMPLATE",
           "thinking_switch", "thinking_kwargs", "rendered_request", "fold_system_messages",
           "name_tool_results", "merge_user_runs"]

#: ChatML, for ``--use-default-chat-template`` on a model that ships no template.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@attrs.frozen
class RenderedPrompt:
    text: str
    ids: tuple[int, ...]
    starts_in_thinking: bool
    #: The prompt with its images spliced in (``ids`` are then ``vision.ids``), or ``None``
    #: (:meth:`mlxrt.serving.ServedModel.render` splices them).
    vision: Any = attrs.field(default=None, eq=False, repr=False)
    #: Tokens before the generation prompt (``GenerationRequest.turn_start``), or ``None``.
    turn_start: int | None = None


def render_chat(host: PluginHost, tokenizer: Any, profile: FamilyProfile, chat: ChatInput, *,
                model: object = None, turn_boundary: bool = False) -> RenderedPrompt:
    """Render ``chat`` with the model's chat template and tokenize it (its images, if any, stay
    placeholders: :meth:`mlxrt.serving.ServedModel.render` splices them in).

    A model whose template renders no tools has them rendered by its profile's
    :class:`~mlxrt.records.ToolPrompt` (:mod:`mlxrt.text.generic_tools`).

    ``--chat-template-args`` come first, then the family's kwargs (by default, for a model with a
    thinking format, :func:`thinking_kwargs`: the client's ``reasoning_effort``, then
    ``--thinking``); the client's explicit
    ``chat_template_kwargs`` win. System messages after the first are rendered at their place
    where the template takes them there, else folded into user turns
    (:func:`fold_system_messages`).
    Template errors are the client's (a message shape the template rejects): 400
    ``prompt build failed: …``. ``turn_boundary``: also find where the last turn starts
    (``RenderedPrompt.turn_start``), for an engine whose prompt cache keeps snapshots
    (:attr:`mlxrt.serving.ServingEngine.keeps_snapshots`). ``model``: the
    :class:`~mlxrt.serving.ServedModel` rendering, handed to ``mlxrt_chat_template_kwargs`` as
    its ``model`` (``object`` here: templating sits below the serving layer and only passes it on).
    """
    if chat.images and profile.vision is None:
        where = chat.images[0].where
        raise InvalidRequest(f"{where}: the served model has no vision input", param=where)
    plugin, family_kwargs = host.first_answer(
        "mlxrt_chat_template_kwargs", info=profile.info, request=chat, host=host, model=model
    )
    if plugin is None and profile.thinking_format is not None:
        # A model that reasons gets the thinking on/off chain unless its family says otherwise.
        family_kwargs = thinking_kwargs(chat, host.options)
    server_kwargs = host.options.get("chat_template_args") or {}
    kwargs = {**server_kwargs, **(family_kwargs or {}), **chat.template_kwargs}
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequest(
            "prompt build failed: this model has no chat template; use /v1/completions"
        )
    if any(m.get("role") == "tool" and not m.get("name") for m in chat.messages):
        chat = attrs.evolve(chat, messages=name_tool_results(chat.messages))
    if chat.tools and profile.tool_prompt is not None:
        # The template renders no tools: mlxrt writes them (and past calls) into the messages.
        chat = attrs.evolve(chat, messages=tuple(profile.tool_prompt.render(chat.messages, chat.tools)), tools=None)
    messages, text = _placed_render(tokenizer, chat, kwargs)
    # The template writes BOS itself where the model wants it; HF tokenizes templated text
    # without adding special tokens again.
    ids = tokenizer.encode(text, add_special_tokens=False)
    turn_start = None
    if turn_boundary and not chat.images \
            and chat.add_generation_prompt and not chat.continue_final_message:  # else no generation prompt
        turn_start = _turn_start(tokenizer, messages, chat.tools, kwargs, text, ids)
    return RenderedPrompt(
        text=text,
        ids=tuple(ids),
        starts_in_thinking=prompt_opens_thinking(text, profile.thinking_format),
        turn_start=turn_start,
    )


def _apply(tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Any, kwargs: Mapping[str, Any],
           add_generation_prompt: bool = True, continue_final_message: bool = False) -> str:
    # continue_final_message only when asked: a tokenizer without it (transformers') renders the rest.
    more = {"continue_final_message": True} if continue_final_message else {}
    text: str = tokenizer.apply_chat_template(
        [dict(m) for m in messages], tools=[dict(t) for t in tools] if tools else None,
        add_generation_prompt=add_generation_prompt, tokenize=False, **more, **kwargs)
    return text


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content or () if isinstance(p, Mapping))


def _placed_render(tokenizer: Any, chat: ChatInput, kwargs: Mapping[str, Any]
                   ) -> tuple[Sequence[Mapping[str, Any]], str]:
    """The messages as rendered and the template's text.

    System messages after the first message are rendered at their place when the template
    takes them there (it renders without error and every one's text is in the prompt);
    otherwise the conversation is rendered as :func:`fold_system_messages` folds it.
    """
    messages = chat.messages
    later = [m for m in messages[1:] if m.get("role") == "system"]
    ending = {"add_generation_prompt": chat.add_generation_prompt and not chat.continue_final_message,
              "continue_final_message": chat.continue_final_message}
    error: Exception | None = None
    try:
        text = _apply(tokenizer, messages, chat.tools, kwargs, **ending)
        if all(_text_of(m.get("content")).strip() in text for m in later):
            return messages, text
    except Exception as exc:  # jinja raises many types; all mean the input can't be rendered
        error = exc
    # Then system messages folded (when some come later), then, if the template refused the
    # conversation, runs of user messages merged: tool results rendered as user turns
    # (the generic tier) come two in a row after parallel calls, and templates that insist
    # on alternating roles (Gemma 3's) refuse them.
    folded = fold_system_messages(messages) if later else messages
    for candidate in (folded, merge_user_runs(folded)):
        if candidate is messages or (candidate is not folded and error is None):
            continue
        try:
            return candidate, _apply(tokenizer, candidate, chat.tools, kwargs, **ending)
        except Exception as exc:
            error = error or exc
    raise InvalidRequest(f"prompt build failed: {error}") from error


def name_tool_results(messages: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    """``messages`` with each tool result that has no ``name`` given the name of the call it
    answers, so every template can render it (Gemma 4's writes ``response:NAME{…}``).

    A result answers the earlier call whose ``id`` is its ``tool_call_id`` (OpenAI's
    ``tool_call_id``, Anthropic's ``tool_use_id``, Responses' ``call_id``: the dialects decode
    all three into ``tool_call_id``); a result without a matching id answers the call at its
    place in the run of results after the assistant turn (the first result the first call).
    """
    names: dict[str, str] = {}
    calls: list[str] = []  # the last assistant turn's call names, in order
    at = 0  # the place of the next result in the run after that turn
    out: list[Mapping[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            calls, at = [], 0
            for call in message.get("tool_calls") or ():
                name = (call.get("function") or call).get("name") if isinstance(call, Mapping) else None
                if isinstance(name, str):
                    calls.append(name)
                    if isinstance(call.get("id"), str):
                        names[call["id"]] = name
        elif role == "tool":
            answered = message.get("tool_call_id")
            name = (names.get(answered) if isinstance(answered, str) else None) or (calls[at] if at < len(calls) else None)
            at += 1
            if name is not None and not message.get("name"):
                message = {**message, "name": name}
        elif role != "system":
            calls, at = [], 0
        out.append(message)
    return tuple(out)


def merge_user_runs(messages: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    """``messages`` with each run of consecutive user messages joined into one, texts
    separated by a newline (Qwen3's template joins consecutive tool results that way inside
    one user turn). Only the runs change, so a conversation that grows keeps its prefix."""
    out: list[Mapping[str, Any]] = []
    for message in messages:
        if out and message.get("role") == "user" and out[-1].get("role") == "user":
            out[-1] = {**out[-1], "content": _concatenated(out[-1].get("content"), message.get("content"))}
        else:
            out.append(message)
    return tuple(out)


def _concatenated(first: Any, second: Any) -> Any:
    if (isinstance(first, str) or first is None) and (isinstance(second, str) or second is None):
        return "\n".join(t for t in (first, second) if t)

    def parts(content: Any) -> list[Any]:
        return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or ())

    return [*parts(first), {"type": "text", "text": "\n"}, *parts(second)]


def fold_system_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    """``messages`` with every system message after the first folded in, for a template that
    cannot render a system message there (docs/dialects.md, "System entries inside messages").

    System messages before the first other message join the first into one leading system
    message. A later run of system messages goes into the user message right after it
    (before that message's text), else into the user message right before it (after its text),
    else becomes a user message of its own, at its place. The rule reads only a run's two
    neighbours, and a conversation that grows by appending turns keeps them (a run that ended
    one request is followed by the assistant's answer in the next, which reads like no message
    at all), so each turn's prompt stays a prefix of the next one's and the prompt cache keeps
    hitting. Joined texts are separated by a blank line.
    """
    out: list[dict[str, Any]] = []
    lead = 0
    while lead < len(messages) and messages[lead].get("role") == "system":
        lead += 1
    if lead:
        out.append({**messages[0], "content": "\n\n".join(_text_of(m.get("content")) for m in messages[:lead])})
    run: list[str] = []  # the texts of the system run being read
    pending: str | None = None  # a run that joins the next message
    for k in range(lead, len(messages)):
        message = dict(messages[k])
        if message.get("role") == "system":
            run.append(_text_of(message.get("content")))
            after = messages[k + 1] if k + 1 < len(messages) else None
            if after is not None and after.get("role") == "system":
                continue
            text, run = "\n\n".join(run), []
            if after is not None and after.get("role") == "user":
                pending = text
            elif out and out[-1].get("role") == "user":
                out[-1] = {**out[-1], "content": _joined(out[-1].get("content"), text, first=False)}
            else:
                out.append({"role": "user", "content": text})
            continue
        if pending is not None:
            message["content"] = _joined(message.get("content"), pending, first=True)
            pending = None
        out.append(message)
    return tuple(out)


def _joined(content: Any, text: str, *, first: bool) -> Any:
    """A user message's ``content`` with ``text`` before (``first``) or after it."""
    if isinstance(content, str) or content is None:
        parts = [text, content or ""] if first else [content or "", text]
        return "\n\n".join(p for p in parts if p)
    part = {"type": "text", "text": text}
    return [part, *content] if first else [*content, part]


def _turn_start(tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Any, kwargs: Mapping[str, Any],
                text: str, ids: Sequence[int]) -> int | None:
    """How many of ``ids`` precede the generation prompt: the template rendered without it
    must be a prefix of ``text``, and the rest must tokenize to the tail of ``ids`` (a
    template that re-renders earlier turns differently, or a token spanning the seam, gives
    ``None``). Only the short tail is tokenized again."""
    try:
        head = _apply(tokenizer, messages, tools, kwargs, add_generation_prompt=False)
    except Exception:  # a template that insists on the generation prompt: no boundary
        return None
    if not isinstance(head, str) or not text.startswith(head) or len(head) == len(text):
        return None
    tail = list(tokenizer.encode(text[len(head):], add_special_tokens=False))
    if not tail or len(tail) >= len(ids) or list(ids[-len(tail):]) != tail:
        return None
    return len(ids) - len(tail)


def rendered_request(request: GenerationRequest, rendered: RenderedPrompt) -> GenerationRequest:
    """``request`` carrying what rendering learned besides the ids: the spliced images
    (``vision``) and the turn boundary (``turn_start``); unchanged for a plain text prompt."""
    changes: dict[str, Any] = {}
    if rendered.vision is not None:
        changes["vision"] = rendered.vision
    if rendered.turn_start is not None:
        changes["turn_start"] = rendered.turn_start
    return attrs.evolve(request, **changes) if changes else request


def thinking_switch(chat: ChatInput, options: Mapping[str, Any] | None = None,
                    key: str = "enable_thinking") -> bool | None:
    """Whether thinking is on for one request, for templates with a boolean switch.

    The chain: the client's ``chat_template_kwargs[key]``, then its ``reasoning_effort``
    (``"none"`` is off, any other effort on), then ``--chat-template-args``' ``key``, then the
    server's ``--thinking`` default (``options["thinking"]``); ``None`` when nothing says, so
    the template's own default applies.
    """
    options = options or {}
    client = chat.template_kwargs.get(key)
    if isinstance(client, bool):
        return client
    if chat.reasoning_effort is not None:
        return bool(chat.reasoning_effort != "none")
    server = (options.get("chat_template_args") or {}).get(key)
    if isinstance(server, bool):
        return server
    default = options.get("thinking")
    return default if isinstance(default, bool) else None


def thinking_kwargs(chat: ChatInput, options: Mapping[str, Any] | None = None,
                    key: str = "enable_thinking") -> dict[str, bool] | None:
    """``{key: on}`` from :func:`thinking_switch`, or ``None`` when nothing says (what a
    family's ``mlxrt_chat_template_kwargs`` returns for a template with that switch)."""
    on = thinking_switch(chat, options, key)
    return None if on is None else {key: on}


def encode_text(tokenizer: Any, text: str) -> Sequence[int]:
    """Tokenize raw text with the tokenizer's own special-token handling (completions)."""
    ids: Sequence[int] = tokenizer.encode(text)
    return ids


def canonicalize(host: PluginHost, request: Any, dialect: str, *, declared: frozenset[str] | None = None,
                 model: object = None) -> Any:
    """The request after ``mlxrt_prompt_canonicalize`` (unchanged when no plugin answers).

    A structured-output constraint (``response_format``, ``text.format``) that no installed
    plugin can enforce is refused here, for every dialect: never silently ignored.
    ``declared``: the capabilities the plugins declared (:attr:`mlxrt.serving.EngineModel.declared`,
    collected once); by default they are asked now. ``model``: the
    :class:`~mlxrt.serving.ServedModel` the request runs on, handed to the hook as its ``model``.
    """
    structured = getattr(request, "structured", None)
    if structured is not None and STRUCTURED_OUTPUTS not in (declared_by(host) if declared is None else declared):
        from mlxrt.errors import InvalidRequest

        field = structured.param.split(".")[0] if getattr(structured, "param", None) else "response_format"
        raise InvalidRequest(f"{field} is not supported by this server yet", param=field,
                             code="unsupported_parameter")
    _plugin, replaced = host.first_answer("mlxrt_prompt_canonicalize", request=request, dialect=dialect,
                                         host=host, model=model)
    return replaced if replaced is not None else request
