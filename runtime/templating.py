"""Chat templating: messages (and tools) → prompt token ids, with the family's template
keyword arguments from ``mlxrt_chat_template_kwargs``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.errors import InvalidRequest
from mlxrt.reasoning import prompt_opens_thinking
from mlxrt.records import FamilyProfile

if TYPE_CHECKING:
    from mlxrt.host import PluginHost

__all__ = ["ChatInput", "RenderedPrompt", "render_chat", "canonicalize", "DEFAULT_CHAT_TEMPLATE"]

#: ChatML, for ``--use-default-chat-template`` on a model that ships no template.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@attrs.frozen
class ChatInput:
    """A dialect-neutral chat turn to render.

    :ivar messages: OpenAI-shaped messages (role, content, tool_calls, …), already validated.
    :ivar tools: OpenAI function tools, or ``None``.
    :ivar template_kwargs: The client's ``chat_template_kwargs``.
    :ivar reasoning_effort: The client's ``reasoning_effort``, if given.
    """

    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] | None = None
    template_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    reasoning_effort: str | None = None


@attrs.frozen
class RenderedPrompt:
    text: str
    ids: tuple[int, ...]
    starts_in_thinking: bool


def render_chat(host: PluginHost, tokenizer: Any, profile: FamilyProfile, chat: ChatInput) -> RenderedPrompt:
    """Render ``chat`` with the model's chat template and tokenize it.

    The family's kwargs come first, then ``--chat-template-args``; the client's explicit
    ``chat_template_kwargs`` win.
    Template errors are the client's (a message shape the template rejects): 400
    ``prompt build failed: …``.
    """
    _plugin, family_kwargs = host.first_answer(
        "mlxrt_chat_template_kwargs", info=profile.info, request=chat
    )
    server_kwargs = host.options.get("chat_template_args") or {}
    kwargs = {**(family_kwargs or {}), **server_kwargs, **chat.template_kwargs}
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequest(
            "prompt build failed: this model has no chat template; use /v1/completions"
        )
    try:
        text = tokenizer.apply_chat_template(
            [dict(m) for m in chat.messages],
            tools=[dict(t) for t in chat.tools] if chat.tools else None,
            add_generation_prompt=True,
            tokenize=False,
            **kwargs,
        )
    except Exception as exc:  # jinja raises many types; all mean the input can't be rendered
        raise InvalidRequest(f"prompt build failed: {exc}") from exc
    # The template writes BOS itself where the model wants it; HF tokenizes templated text
    # without adding special tokens again.
    ids = tokenizer.encode(text, add_special_tokens=False)
    return RenderedPrompt(
        text=text,
        ids=tuple(ids),
        starts_in_thinking=prompt_opens_thinking(text, profile.thinking_format),
    )


def encode_text(tokenizer: Any, text: str) -> Sequence[int]:
    """Tokenize raw text with the tokenizer's own special-token handling (completions)."""
    return tokenizer.encode(text)


def canonicalize(host: PluginHost, request: Any, dialect: str) -> Any:
    """The request after ``mlxrt_prompt_canonicalize`` (unchanged when no plugin answers)."""
    _plugin, replaced = host.first_answer("mlxrt_prompt_canonicalize", request=request, dialect=dialect)
    return replaced if replaced is not None else request
