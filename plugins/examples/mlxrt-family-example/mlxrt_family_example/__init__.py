"""Example mlxrt family plugin: Qwen3 generations start inside the reasoning span."""

from __future__ import annotations

from mlxrt import ModelInfo, ThinkingFormat, hookimpl

MODEL_TYPES = frozenset({"qwen3"})


@hookimpl
def mlxrt_thinking_format(info: ModelInfo) -> ThinkingFormat | None:
    if info.model_type not in MODEL_TYPES:
        return None
    return ThinkingFormat(open="<think>", close="</think>", starts_in_thinking=True)
