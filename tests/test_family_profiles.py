"""Family recognition, the load-time self-test and what /v1/models says about each family."""

from __future__ import annotations

import attrs
import pytest

from mlxrt.families.qwen.tools import Qwen3JsonParser
from mlxrt.host import make_host
from mlxrt.loading import load_model
from mlxrt.loading.resolve import ModelSource, read_model_info
from mlxrt.loading.self_test import run_self_test
from mlxrt.records import ThinkingKind, ToolStreamMode
from mlxrt.testing import write_tiny_checkpoint

MINICPM5 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
PASS = {"template": "pass", "tools": "pass", "tool_result": "pass", "thinking": "pass"}


def load(path):
    return load_model(read_model_info(ModelSource(path, path.name, "folder")), make_host())


@pytest.fixture(scope="module")
def minicpm5(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("m5") / "minicpm5", "minicpm", config_overrides=MINICPM5)


@pytest.mark.parametrize(("model_type", "family", "mode"), [
    ("qwen3", "qwen", ToolStreamMode.BUFFERED_TEXT),
    ("qwen3_5", "qwen", ToolStreamMode.BUFFERED_TEXT),
    ("gemma4_text", "gemma4", ToolStreamMode.GEMMA_SENTINEL),
])
def test_each_family_claims_its_models_and_passes_its_self_test(mlxrt_tiny_checkpoint, model_type, family, mode):
    _loaded, profile = load(mlxrt_tiny_checkpoint(model_type))
    assert profile.provenance["tool_parser"] == profile.provenance["thinking_format"] == family
    assert profile.tool_stream_mode is ToolStreamMode.PLAIN and profile.tool_stream_mode_with_tools is mode
    assert profile.tier == "family" and dict(profile.self_test) == PASS


def test_minicpm5_is_recognised_although_its_model_type_is_llama(minicpm5, mlxrt_tiny_checkpoint):
    _loaded, profile = load(minicpm5)
    assert profile.info.model_type == "llama"
    assert profile.provenance["tool_parser"] == "minicpm5" and profile.thinking_format.open == "<think>"
    assert dict(profile.self_test) == PASS
    _loaded, smol = load(mlxrt_tiny_checkpoint("llama"))  # another llama: nobody's
    assert smol.tier == "generic" and smol.provenance["tool_prompt"] == "default"  # mlxrt's generic tools
    assert smol.tool_parser is smol.tool_prompt.parser and "tool_parser" not in smol.provenance


def test_gemma4_thinking_is_the_channel(mlxrt_tiny_checkpoint):
    _loaded, profile = load(mlxrt_tiny_checkpoint("gemma4_text"))
    assert profile.thinking_format.kind is ThinkingKind.GEMMA_CHANNEL
    assert (profile.thinking_format.open, profile.thinking_format.close) == ("<|channel>thought\n", "<channel|>")


def test_gemma4_typed_model_without_sentinels_gets_no_sentinel_router(mlxrt_tiny_checkpoint, tmp_path):
    """A gemma4_text config over a Qwen vocabulary: ids 48/49 are text there, so no router."""
    path = write_tiny_checkpoint(tmp_path / "g", "gemma4_text")
    qwen = mlxrt_tiny_checkpoint("qwen3")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (path / name).write_bytes((qwen / name).read_bytes())
    info = read_model_info(ModelSource(path, "g", "folder"))
    from mlxrt.loading import resolve_profile

    profile = resolve_profile(info, make_host())
    assert profile.tool_parser is None and profile.thinking_format is None
    assert profile.tool_stream_mode_with_tools is ToolStreamMode.BUFFERED_TEXT  # the default, unused: no parser


def test_self_test_reports_a_parser_that_cannot_read_its_template(mlxrt_tiny_checkpoint):
    loaded, profile = load(mlxrt_tiny_checkpoint("qwen3_5"))
    wrong = attrs.evolve(profile, tool_parser=Qwen3JsonParser())  # Qwen3's JSON reader on Qwen3.5's XML
    result = run_self_test(wrong, loaded.tokenizer)
    assert result["tools"].startswith("fail: ") and result["template"] == "pass"


@pytest.mark.parametrize(("model_type", "family"), [("qwen3", "qwen"), ("gemma4_text", "gemma4"), ("llama", "mlx-lm")])
def test_v1_models_reports_family_tier_and_self_test(mlxrt_tiny_checkpoint, mlxrt_serve, model_type, family):
    client = mlxrt_serve(mlxrt_tiny_checkpoint(model_type))
    row = client.get("/v1/models").json()["data"][0]
    assert row["family"] == family
    assert row["tier"] == ("generic" if family == "mlx-lm" else "family")
    # the tiny llama's template renders no tools: mlxrt's generic tool prompt serves them
    assert row["reasoning"] is (family != "mlx-lm") and row["tools"] is True
    expected = PASS if family != "mlx-lm" else {"template": "pass", "tools": "pass", "tool_result": "pass",
                                                  "thinking": "n/a"}
    assert row["self_test"] == expected
