"""OpenAI Responses wire types and the rules their raw fields obey."""

from __future__ import annotations

from typing import Any

import attrs

from mlxrt.api.wire import FieldRule

__all__ = ["ResponsesRequest", "ReasoningConfig", "RESPONSES_RULES"]

RESPONSES_RULES = (
    FieldRule("model", (str,)),
    FieldRule("input", (str, list)),
    FieldRule("instructions", (str,)),
    FieldRule("previous_response_id", (str,)),
    FieldRule("store", (bool,)),
    FieldRule("stream", (bool,)),
    FieldRule("max_output_tokens", (int,), min=1),
    FieldRule("temperature", (float, int), min=0, max=2),
    FieldRule("top_p", (float, int), min=0, max=1),
    FieldRule("top_k", (int,), min=0),
    FieldRule("seed", (int,)),
    FieldRule("tools", (list,)),
    FieldRule("tool_choice", (str, dict)),
    FieldRule("parallel_tool_calls", (bool,)),
    FieldRule("reasoning", (dict,)),
    FieldRule("text", (dict,)),
    FieldRule("metadata", (dict,)),
    FieldRule("user", (str,)),
    FieldRule("truncation", (str,)),
    # llama-server's telemetry switches (mlxrt.api.timings)
    FieldRule("timings_per_token", (bool,)),
    FieldRule("return_progress", (bool,)),
)


@attrs.frozen
class ReasoningConfig:
    effort: str | None = None
    summary: str | None = None


@attrs.frozen
class ResponsesRequest:
    """The scalar fields mlxrt reads from a Responses body (``input``, ``tools``,
    ``tool_choice`` and ``text`` are decoded apart)."""

    model: str | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    parallel_tool_calls: bool = True
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    #: llama-server's: every ``response.output_text.delta`` carries the running ``timings``.
    timings_per_token: bool | None = None
    #: llama-server's: a stream carries ``response.in_progress`` events with ``prompt_progress``.
    return_progress: bool | None = None
