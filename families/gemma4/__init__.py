"""The Gemma 4 family plugin (text): sentinel tool calls and the thinking channel.

mlx-lm loads Gemma 4 text checkpoints itself (``gemma4``, ``gemma4_text``), so this plugin
answers only the behaviour hooks. Gemma 4 marks tool calls with the sentinel tokens
``<|tool_call>`` / ``<tool_call|>`` and reasoning with ``<|channel>thought`` … ``<channel|>``.
Their ids are looked up in the model's own tokenizer (``ModelInfo.special_tokens``), never
hard-coded: on other tokenizers the same low ids (48/49, 100/101) are ordinary text, and a
Gemma-typed checkpoint whose vocabulary lacks the sentinels is left to the generic tier.
Multimodal checkpoints (``vision_config`` of type ``gemma4_vision`` and tower weights) get a
vision adapter (:mod:`mlxrt.families.gemma4.splice`) whose tower loads on the first image.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mlxrt import (
    ModelInfo,
    ThinkingFormat,
    ThinkingKind,
    ToolParser,
    ToolStreamMode,
    VisionAdapter,
    hookimpl,
)

if TYPE_CHECKING:
    from mlxrt.serving import ServedModel

MLXRT_PLUGIN_KIND = "family"
MODEL_TYPES = frozenset({"gemma4", "gemma4_text", "gemma4_unified"})
TOOL_CALL = ("<|tool_call>", "<tool_call|>")
CHANNEL = ("<|channel>", "<channel|>")


def _ours(info: ModelInfo) -> bool:
    if info.model_type in MODEL_TYPES or info.text_model_type in MODEL_TYPES:
        return True
    archs = info.config.get("architectures") or ()
    return any(isinstance(a, str) and a.startswith("Gemma4") for a in archs)


def _model_of(model: ServedModel) -> Callable[[], Any]:
    """The loaded MLX model, read when the tower first runs (the hook runs before the weights load)."""
    return lambda: model.loaded.model


def _sentinels(info: ModelInfo, pair: tuple[str, str]) -> bool:
    """Both markers are single added tokens of this tokenizer."""
    return all(isinstance(info.special_tokens.get(tok), int) for tok in pair)


@hookimpl
def mlxrt_thinking_format(info: ModelInfo) -> ThinkingFormat | None:
    if _ours(info) and _sentinels(info, CHANNEL):
        return ThinkingFormat(kind=ThinkingKind.GEMMA_CHANNEL, open=CHANNEL[0] + "thought\n", close=CHANNEL[1])
    return None


@hookimpl
def mlxrt_tool_parser(info: ModelInfo) -> ToolParser | None:
    if _ours(info) and _sentinels(info, TOOL_CALL):
        from mlxrt.families.gemma4.tools import Gemma4Parser

        return Gemma4Parser()
    return None


@hookimpl
def mlxrt_tool_stream_mode(info: ModelInfo, has_tools: bool) -> ToolStreamMode | None:
    if not (_ours(info) and _sentinels(info, TOOL_CALL)):
        return None
    return ToolStreamMode.GEMMA_SENTINEL if has_tools else ToolStreamMode.PLAIN


@hookimpl
def mlxrt_vision(info: ModelInfo, model: ServedModel) -> VisionAdapter | None:
    vision = info.config.get("vision_config")
    if not _ours(info) or not isinstance(vision, dict) or vision.get("model_type", "gemma4_vision") != "gemma4_vision":
        return None
    from mlxrt.families.gemma4.splice import Gemma4Vision, tower_files

    if not tower_files(info.path):
        return None  # a text-only conversion of a multimodal repo
    return Gemma4Vision(info, _model_of(model))
