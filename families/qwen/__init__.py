"""The Qwen family plugin: Qwen3, Qwen3-MoE and Qwen3.5 reasoning, tools and template switches.

mlx-lm has these architectures, so this plugin loads only one kind of model itself:
Qwen3-Embedding checkpoints (see :mod:`mlxrt.embedding`), whose weights lack mlx-lm's
``model.`` prefix. It answers the family hooks for its own model types and returns ``None``
for every other model.
"""

from __future__ import annotations

from mlxrt import ThinkingFormat, ToolStreamMode, hookimpl

MLXRT_PLUGIN_KIND = "family"

#: Model types with Qwen3's JSON tool calls.
JSON_TOOL_TYPES = frozenset({"qwen3", "qwen3_moe"})
#: Model types with Qwen3.5/Coder's XML tool calls.
XML_TOOL_TYPES = frozenset({"qwen3_5", "qwen3_5_moe", "qwen3_next"})
MODEL_TYPES = JSON_TOOL_TYPES | XML_TOOL_TYPES


def _ours(info) -> bool:  # noqa: ANN001
    return info.model_type in MODEL_TYPES


@hookimpl
def mlxrt_load_model(info, host):  # noqa: ANN001, ANN201
    # Qwen3-Embedding: the prefix-less Qwen3Model layout (mlx-lm rejects it as it stands).
    if info.model_type != "qwen3":
        return None
    from mlxrt.embedding import is_embedding_model

    if not is_embedding_model(info):
        return None
    from mlxrt.families.qwen.embedding import ModelArgs, Qwen3EmbeddingModel
    from mlxrt.loading import mlx_lm_load

    return mlx_lm_load(info, (Qwen3EmbeddingModel, ModelArgs),
                       trust_remote_code=bool(host.options.get("trust_remote_code")))


@hookimpl
def mlxrt_thinking_format(info):  # noqa: ANN001, ANN201
    if _ours(info) and "<think>" in info.special_tokens:
        return ThinkingFormat(open="<think>", close="</think>")
    return None


@hookimpl
def mlxrt_tool_parser(info):  # noqa: ANN001, ANN201
    if info.model_type in JSON_TOOL_TYPES:
        from mlxrt.families.qwen.tools import Qwen3JsonParser

        return Qwen3JsonParser()
    if info.model_type in XML_TOOL_TYPES:
        from mlxrt.families.qwen.tools import Qwen3XmlParser

        return Qwen3XmlParser()
    return None


@hookimpl
def mlxrt_tool_stream_mode(info, has_tools):  # noqa: ANN001, ANN201
    if not _ours(info):
        return None
    return ToolStreamMode.BUFFERED_TEXT if has_tools else ToolStreamMode.PLAIN


@hookimpl
def mlxrt_chat_template_kwargs(info, request):  # noqa: ANN001, ANN201
    # reasoning_effort "none" turns Qwen's thinking off; any other effort turns it on.
    if not _ours(info) or request.reasoning_effort is None:
        return None
    return {"enable_thinking": request.reasoning_effort != "none"}
