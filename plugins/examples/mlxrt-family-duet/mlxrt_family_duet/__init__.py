"""mlxrt family plugin for Duet, an architecture mlx-lm does not have.

A model is Duet's when its config.json says ``"model_type": "duet"``. For such a model this
plugin loads the weights into its own model code (:mod:`mlxrt_family_duet.model`), reads its
tool calls (:mod:`mlxrt_family_duet.tools`) and names its reasoning markers; for every other
model each hook returns ``None``, so the built-in families answer as before.

This module is what the ``mlxrt`` entry point names, so it stays light: ``mlxrt plugins``
imports it, and MLX model code is imported only inside ``mlxrt_load_model``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlxrt import LoadedModel, ModelInfo, ThinkingFormat, ToolParser, hookimpl

if TYPE_CHECKING:
    from mlxrt.host import PluginHost

#: Shown as this plugin's kind by ``mlxrt plugins``.
MLXRT_PLUGIN_KIND = "family"

MODEL_TYPE = "duet"


@hookimpl
def mlxrt_load_model(info: ModelInfo, host: PluginHost) -> LoadedModel | None:
    if info.model_type != MODEL_TYPE:
        return None
    from mlxrt.loading import mlx_lm_load
    from mlxrt_family_duet.model import Model, ModelArgs

    # mlx-lm's loading path (weights by name, quantized checkpoints, the tokenizer) with our classes
    return mlx_lm_load(info, (Model, ModelArgs), trust_remote_code=bool(host.options.get("trust_remote_code")))


@hookimpl
def mlxrt_tool_parser(info: ModelInfo) -> ToolParser | None:
    if info.model_type != MODEL_TYPE:
        return None
    from mlxrt_family_duet.tools import DuetToolParser

    return DuetToolParser()


@hookimpl
def mlxrt_thinking_format(info: ModelInfo) -> ThinkingFormat | None:
    # With thinking on (reasoning_effort, chat_template_kwargs, --thinking) the template opens
    # <|think|> in the generation prompt: mlxrt sees the unclosed marker in the rendered prompt
    # and reads the answer as reasoning until the model writes <|/think|>.
    if info.model_type != MODEL_TYPE:
        return None
    return ThinkingFormat(open="<|think|>", close="<|/think|>")
