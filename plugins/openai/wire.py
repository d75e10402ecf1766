"""OpenAI chat-completions wire types (requests) and the rules their raw fields obey."""

from __future__ import annotations

from typing import Any

import attrs

from mlxrt.api.wire import FieldRule

__all__ = ["ChatCompletionRequest", "StreamOptions", "CHAT_RULES", "ROLES"]

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

#: mlx_lm.server's validation table, with its texts (``<name> must be of type <type>``…).
CHAT_RULES = (
    FieldRule("stream", (bool,)),
    FieldRule("model", (str,)),
    FieldRule("max_tokens", (int,), min=1),
    FieldRule("max_completion_tokens", (int,), min=1),
    FieldRule("temperature", (float, int), min=0),
    FieldRule("top_p", (float, int), min=0, max=1),
    FieldRule("top_k", (int,), min=0),
    FieldRule("min_p", (float, int), min=0, max=1),
    FieldRule("seed", (int,)),
    FieldRule("n", (int,), min=1),
    FieldRule("repetition_penalty", (float, int), min=0),
    FieldRule("repetition_context_size", (int,), min=0),
    FieldRule("presence_penalty", (float, int)),
    FieldRule("presence_context_size", (int,), min=0),
    FieldRule("frequency_penalty", (float, int)),
    FieldRule("frequency_context_size", (int,), min=0),
    FieldRule("xtc_probability", (float, int), min=0, max=1),
    FieldRule("xtc_threshold", (float, int), min=0, max=1),
    FieldRule("logprobs", (bool,)),
    FieldRule("top_logprobs", (int,), min=0, max=11, allowed=(-1,)),
    FieldRule("logit_bias", (dict,)),
    FieldRule("chat_template_kwargs", (dict,)),
    FieldRule("stream_options", (dict,)),
    FieldRule("tools", (list,)),
    FieldRule("reasoning_effort", (str,)),
    FieldRule("user", (str,)),
)


@attrs.frozen
class StreamOptions:
    include_usage: bool = False


@attrs.frozen
class ChatCompletionRequest:
    """The fields mlxrt reads from a chat-completions body (messages are decoded apart)."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    n: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    user: str | None = None
