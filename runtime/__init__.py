"""mlxrt: a plugin-architecture model runtime and inference server built on MLX.

This module is the public surface for plugin authors::

    from mlxrt import hookimpl, ModelInfo, ThinkingFormat
"""

from __future__ import annotations

import pluggy

from mlxrt.records import (
    EngineKind,
    FamilyProfile,
    FinishedTurn,
    FinishEvent,
    FinishReason,
    GenerationRequest,
    LoadedModel,
    LogitsProcessor,
    ModelInfo,
    PluginRecord,
    PluginStatus,
    Sampler,
    SamplingParams,
    SplicedPrompt,
    ThinkingFormat,
    ThinkingKind,
    TokenEvent,
    ToolCall,
    ToolParser,
    ToolPrompt,
    ToolStreamMode,
    VisionAdapter,
)

__version__ = "0.1.0"

#: Marks a function as an implementation of an mlxrt hook (see :mod:`mlxrt.hookspecs`).
hookimpl = pluggy.HookimplMarker("mlxrt")

__all__ = [
    "__version__",
    "hookimpl",
    "EngineKind",
    "FamilyProfile",
    "FinishEvent",
    "FinishedTurn",
    "FinishReason",
    "GenerationRequest",
    "LoadedModel",
    "LogitsProcessor",
    "ModelInfo",
    "PluginRecord",
    "PluginStatus",
    "Sampler",
    "SamplingParams",
    "ThinkingFormat",
    "ThinkingKind",
    "TokenEvent",
    "ToolCall",
    "ToolParser",
    "ToolPrompt",
    "ToolStreamMode",
    "SplicedPrompt",
    "VisionAdapter",
]
