"""Anthropic Messages wire types and the rules their raw fields obey."""

from __future__ import annotations

from typing import Any

import attrs

from mlxrt.api.wire import FieldRule

__all__ = ["MessagesRequest", "ThinkingConfig", "ToolChoice", "MESSAGES_RULES", "COUNT_RULES",
           "TOOL_CHOICE_TYPES", "THINKING_TYPES", "EFFORTS"]

TOOL_CHOICE_TYPES = frozenset({"auto", "any", "tool", "none"})
THINKING_TYPES = frozenset({"enabled", "disabled", "adaptive"})
#: ``output_config.effort`` values (Anthropic's; ``max`` reads as ``high``).
EFFORTS = frozenset({"low", "medium", "high", "max"})

#: Fields of a count_tokens body (no max_tokens, no sampling).
COUNT_RULES = (
    FieldRule("model", (str,)),
    FieldRule("messages", (list,)),
    FieldRule("system", (str, list)),
    FieldRule("tools", (list,)),
    FieldRule("tool_choice", (dict,)),
    FieldRule("thinking", (dict,)),
    FieldRule("output_config", (dict,)),
)

#: Anthropic's ranges (temperature 0–1, unlike OpenAI's 0–2).
MESSAGES_RULES = (
    *COUNT_RULES,
    FieldRule("max_tokens", (int,), min=1),
    FieldRule("stop_sequences", (list,)),
    FieldRule("stream", (bool,)),
    FieldRule("temperature", (float, int), min=0, max=1),
    FieldRule("top_p", (float, int), min=0, max=1),
    FieldRule("top_k", (int,), min=0),
    FieldRule("metadata", (dict,)),
    FieldRule("service_tier", (str,)),
)


@attrs.frozen
class ThinkingConfig:
    type: str
    budget_tokens: int | None = None


@attrs.frozen
class ToolChoice:
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool = False


@attrs.frozen
class MessagesRequest:
    """The scalar fields mlxrt reads from a Messages body (messages, system and tools are
    decoded apart: they become a :class:`mlxrt.records.ChatInput`)."""

    model: str | None = None
    max_tokens: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    thinking: ThinkingConfig | None = None
    tool_choice: ToolChoice | None = None
