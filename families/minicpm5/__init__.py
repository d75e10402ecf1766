"""The MiniCPM5 family plugin: ``<function name=…><param name=…>`` tool calls and ``<think>``.

A MiniCPM5 checkpoint is a plain Llama (``model_type: llama``, ``LlamaForCausalLM``) that
mlx-lm loads as it stands, so the family is recognised by its tokenizer and template, not by
``model_type``: the MiniCPM5 vocabulary has ``<function`` and ``<param`` as added tokens and
its template asks for ``<function name="…"><param name="…">`` calls (mlx-lm's own test for
its ``minicpm5`` parser). ``minicpm`` / ``minicpm5`` typed checkpoints with that vocabulary
are claimed too.
"""

from __future__ import annotations

from mlxrt import ModelInfo, ThinkingFormat, ToolParser, ToolStreamMode, hookimpl

MLXRT_PLUGIN_KIND = "family"
MODEL_TYPES = frozenset({"llama", "minicpm", "minicpm5"})


def _ours(info: ModelInfo) -> bool:
    if info.model_type not in MODEL_TYPES:
        return False
    template = info.chat_template or ""
    if '<function name="' in template and '<param name="' in template:
        return True
    special = info.special_tokens
    return "<function" in special and "<param" in special and "<|im_start|>" in special


@hookimpl
def mlxrt_thinking_format(info: ModelInfo) -> ThinkingFormat | None:
    if _ours(info) and "<think>" in info.special_tokens:
        return ThinkingFormat(open="<think>", close="</think>")
    return None


@hookimpl
def mlxrt_tool_parser(info: ModelInfo) -> ToolParser | None:
    if not _ours(info):
        return None
    from mlxrt.families.minicpm5.tools import MiniCPM5Parser

    return MiniCPM5Parser()


@hookimpl
def mlxrt_tool_stream_mode(info: ModelInfo, has_tools: bool) -> ToolStreamMode | None:
    if not _ours(info):
        return None
    return ToolStreamMode.BUFFERED_TEXT if has_tools else ToolStreamMode.PLAIN
