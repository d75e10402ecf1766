"""The Qwen family plugin: Qwen3, Qwen3-MoE, Qwen3.5 and Qwen3-Embedding.

mlx-lm has these architectures, so this plugin loads only two kinds of model itself:
Qwen3-Embedding checkpoints (see :mod:`mlxrt.engine.embedding`), whose weights lack mlx-lm's
``model.`` prefix, and text-only ``qwen3_5_text`` checkpoints, which mlx-lm has no module
for (its ``qwen3_5`` model reads their flat config and weight names). It answers the family
hooks for its own models and returns ``None`` for every other model.

A model is Qwen's by ``model_type`` or by its ``architectures`` (``Qwen3ForCausalLM``…);
tool calls follow the template's format (JSON for Qwen3, XML for Qwen3.5/Coder), thinking
needs ``<think>`` in the vocabulary.
"""

from __future__ import annotations

from mlxrt import LoadedModel, ModelInfo, ThinkingFormat, ToolParser, ToolStreamMode, hookimpl
from mlxrt.host import PluginHost

MLXRT_PLUGIN_KIND = "family"

#: Model types with Qwen3's JSON tool calls.
JSON_TOOL_TYPES = frozenset({"qwen3", "qwen3_moe"})
#: Model types with Qwen3.5/Coder's XML tool calls.
XML_TOOL_TYPES = frozenset({"qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_next"})
MODEL_TYPES = JSON_TOOL_TYPES | XML_TOOL_TYPES
_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3_5", "Qwen3Next")


def _ours(info: ModelInfo) -> bool:
    if info.model_type in MODEL_TYPES:
        return True
    archs = info.config.get("architectures") or ()
    return any(isinstance(a, str) and a.startswith(_ARCHITECTURES) for a in archs)


def _xml(info: ModelInfo) -> bool:
    # The template decides (Qwen3-Coder is a qwen3_moe with XML calls); without one, the type.
    template = info.chat_template
    return "<function=" in template if template else info.model_type in XML_TOOL_TYPES


@hookimpl
def mlxrt_load_model(info: ModelInfo, host: PluginHost) -> LoadedModel | None:
    trust = bool(host.options.get("trust_remote_code"))
    if info.model_type == "qwen3_5_text":
        from mlx_lm.models import qwen3_5

        from mlxrt.loading import mlx_lm_load

        return mlx_lm_load(info, (qwen3_5.Model, qwen3_5.ModelArgs), trust_remote_code=trust)
    # Qwen3-Embedding: the prefix-less Qwen3Model layout (mlx-lm rejects it as it stands).
    if info.model_type != "qwen3":
        return None
    from mlxrt.engine.embedding import is_embedding_model

    if not is_embedding_model(info):
        return None
    from mlxrt.families.qwen.embedding import ModelArgs, Qwen3EmbeddingModel
    from mlxrt.loading import mlx_lm_load

    return mlx_lm_load(info, (Qwen3EmbeddingModel, ModelArgs), trust_remote_code=trust)


@hookimpl
def mlxrt_thinking_format(info: ModelInfo) -> ThinkingFormat | None:
    if _ours(info) and "<think>" in info.special_tokens:
        return ThinkingFormat(open="<think>", close="</think>")
    return None


@hookimpl
def mlxrt_tool_parser(info: ModelInfo) -> ToolParser | None:
    if not _ours(info):
        return None
    from mlxrt.families.qwen.tools import Qwen3JsonParser, Qwen3XmlParser

    return Qwen3XmlParser() if _xml(info) else Qwen3JsonParser()


@hookimpl
def mlxrt_tool_stream_mode(info: ModelInfo, has_tools: bool) -> ToolStreamMode | None:
    if not _ours(info):
        return None
    return ToolStreamMode.BUFFERED_TEXT if has_tools else ToolStreamMode.PLAIN
