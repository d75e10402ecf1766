"""The Qwen family plugin on tiny checkpoints (generated and real tokenizers)."""

from __future__ import annotations

import pytest
from support import openai_client

from mlxrt.host import make_host
from mlxrt.loading import ModelSource, load_model, read_model_info
from mlxrt.records import ToolStreamMode


def profile_of(path):
    info = read_model_info(ModelSource(path, path.name, "folder"))
    _loaded, profile = load_model(info, make_host())
    return profile


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_5"])
def test_profile_answers_come_from_qwen(tiny_models, model_type):
    profile = profile_of(tiny_models(model_type))
    assert profile.provenance["thinking_format"] == "qwen"
    assert profile.provenance["tool_parser"] == "qwen"
    assert profile.provenance["load_model"] == "mlx-lm"
    assert profile.thinking_format.open == "<think>"
    assert profile.tool_stream_mode is ToolStreamMode.PLAIN
    assert profile.tool_stream_mode_with_tools is ToolStreamMode.BUFFERED_TEXT


def test_other_families_are_not_claimed_by_qwen(tiny_models):
    profile = profile_of(tiny_models("llama"))
    assert profile.thinking_format is None and profile.tool_parser is None
    assert "thinking_format" not in profile.provenance


def test_reasoning_effort_none_turns_thinking_off(tiny_models, serve_app):
    client = serve_app(tiny_models("qwen3", tokenizer="qwen3"))
    oai = openai_client(client)
    msg = [{"role": "user", "content": "hi"}]
    on = oai.chat.completions.create(model="m", messages=msg, max_tokens=1)
    off = oai.chat.completions.create(model="m", messages=msg, max_tokens=1, reasoning_effort="none")
    # Qwen3's real template pre-closes an empty <think></think> when thinking is off.
    assert off.usage.prompt_tokens > on.usage.prompt_tokens
    explicit = oai.chat.completions.create(model="m", messages=msg, max_tokens=1, reasoning_effort="none",
                                           extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert explicit.usage.prompt_tokens == on.usage.prompt_tokens


def test_qwen3_5_starts_in_thinking(tiny_models, serve_app):
    """Qwen3.5's generation prompt opens <think>: everything generated is reasoning until it closes."""
    client = serve_app(tiny_models("qwen3_5"))
    out = openai_client(client).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0)
    message = out.choices[0].message
    assert message.model_extra.get("reasoning") and "</think>" not in message.model_extra["reasoning"]


def test_gemma4_and_minicpm_generic_tier(tiny_models, serve_app):
    for model_type in ("gemma4_text", "minicpm"):
        client = serve_app(tiny_models(model_type))
        out = openai_client(client).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
        assert out.choices[0].message.role == "assistant"
        assert client.app.state.host.engine.profile.provenance == {"load_model": "mlx-lm"}
