"""The Qwen family plugin on tiny checkpoints (generated and real tokenizers)."""

from __future__ import annotations

import pytest
from conftest import shared_tokenizer
from support import openai_client

from mlxrt.host import make_host
from mlxrt.loading import load_model
from mlxrt.loading.resolve import ModelSource, read_model_info
from mlxrt.records import ToolStreamMode


def profile_of(path):
    info = read_model_info(ModelSource(path, path.name, "folder"))
    _loaded, profile = load_model(info, make_host())
    return profile


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_5"])
def test_profile_answers_come_from_qwen(mlxrt_tiny_checkpoint, model_type):
    profile = profile_of(mlxrt_tiny_checkpoint(model_type))
    assert profile.provenance["thinking_format"] == "qwen"
    assert profile.provenance["tool_parser"] == "qwen"
    assert profile.provenance["load_model"] == "mlx-lm"
    assert profile.thinking_format.open == "<think>"
    assert profile.tool_stream_mode is ToolStreamMode.PLAIN
    assert profile.tool_stream_mode_with_tools is ToolStreamMode.BUFFERED_TEXT


def test_other_families_are_not_claimed_by_qwen(mlxrt_tiny_checkpoint):
    profile = profile_of(mlxrt_tiny_checkpoint("llama"))
    assert profile.thinking_format is None and "thinking_format" not in profile.provenance
    assert "tool_parser" not in profile.provenance  # (its tools are mlxrt's generic ones)


def test_reasoning_effort_none_turns_thinking_off(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3", tokenizer_dir=shared_tokenizer("qwen3")))
    oai = openai_client(client)
    msg = [{"role": "user", "content": "hi"}]
    on = oai.chat.completions.create(model="m", messages=msg, max_tokens=1)
    off = oai.chat.completions.create(model="m", messages=msg, max_tokens=1, reasoning_effort="none")
    # Qwen3's real template pre-closes an empty <think></think> when thinking is off.
    assert off.usage.prompt_tokens > on.usage.prompt_tokens
    explicit = oai.chat.completions.create(model="m", messages=msg, max_tokens=1, reasoning_effort="none",
                                           extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert explicit.usage.prompt_tokens == on.usage.prompt_tokens


def test_qwen3_5_starts_in_thinking(mlxrt_tiny_checkpoint, mlxrt_serve):
    """Qwen3.5's generation prompt opens <think>: everything generated is reasoning until it closes."""
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3_5"))
    out = openai_client(client).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0)
    message = out.choices[0].message
    assert message.model_extra.get("reasoning") and "</think>" not in message.model_extra["reasoning"]


def test_generic_tier_serves_plain_chat(mlxrt_tiny_checkpoint, mlxrt_serve):
    """An architecture no family claims (a plain Llama) is loaded by mlx-lm and marked generic."""
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"))
    out = openai_client(client).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
    assert out.choices[0].message.role == "assistant"
    profile = client.app.state.models.primary.engine.profile
    # its template renders no tools: mlxrt's generic tool prompt, no family's answer
    assert profile.provenance == {"load_model": "mlx-lm", "tool_prompt": "default"} and profile.tier == "generic"
    row = client.get("/v1/models/" + client.app.state.models.primary.engine.info.model_id).json()
    assert row["tier"] == "generic" and row["family"] == "mlx-lm" and row["reasoning"] is False


def test_qwen3_5_text_is_remapped_to_mlx_lm_qwen3_5(mlxrt_tiny_checkpoint, tmp_path):
    """A text-only Qwen3.5 checkpoint (model_type qwen3_5_text, flat config, model.layers.*),
    which mlx-lm has no module for, loads through mlx-lm's qwen3_5 and generates the same."""
    import json
    import shutil

    import mlx.core as mx

    src = mlxrt_tiny_checkpoint("qwen3_5")
    dst = tmp_path / "qwen3_5_text"
    shutil.copytree(src, dst)
    config = json.loads((src / "config.json").read_text())
    flat = {**config["text_config"], "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"]}
    (dst / "config.json").write_text(json.dumps(flat))
    weights = mx.load(str(src / "model.safetensors"))
    text = {k.replace("model.language_model.", "model."): v for k, v in weights.items()
            if not k.startswith("model.visual")}
    mx.save_safetensors(str(dst / "model.safetensors"), text)
    profile = profile_of(dst)
    assert profile.provenance["load_model"] == "qwen"
    assert type(profile.tool_parser).__name__ == "Qwen3XmlParser"
    ids = [[1, 2, 3, 4]]
    a, _ = load_model(read_model_info(ModelSource(src, "a", "folder")), make_host())
    b, _ = load_model(read_model_info(ModelSource(dst, "b", "folder")), make_host())
    assert mx.allclose(a.model(mx.array(ids)), b.model(mx.array(ids)), atol=1e-4).item()


def test_server_thinking_default_and_the_client_chain(mlxrt_tiny_checkpoint, mlxrt_serve):
    """--thinking off pre-closes Qwen3's think; reasoning_effort and chat_template_kwargs win."""
    path = mlxrt_tiny_checkpoint("qwen3")
    msg = [{"role": "user", "content": "hi"}]
    on = openai_client(mlxrt_serve(path)).chat.completions.create(model="m", messages=msg, max_tokens=1)
    oai = openai_client(mlxrt_serve(path, options={"thinking": False}))
    off = oai.chat.completions.create(model="m", messages=msg, max_tokens=1)
    assert off.usage.prompt_tokens > on.usage.prompt_tokens
    effort = oai.chat.completions.create(model="m", messages=msg, max_tokens=1, reasoning_effort="low")
    assert effort.usage.prompt_tokens == on.usage.prompt_tokens
    explicit = oai.chat.completions.create(model="m", messages=msg, max_tokens=1, reasoning_effort="low",
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert explicit.usage.prompt_tokens == off.usage.prompt_tokens
