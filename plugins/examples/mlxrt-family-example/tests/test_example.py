"""The example plugin's own tests, written only with what mlxrt ships for plugin authors: the
``mlxrt_*`` pytest fixtures (entry point ``pytest11``) and ``mlxrt.testing.check_family``.

Run them with the plugin installed (``pip install -e .`` then ``pytest``): the fixtures' host
loads it through its entry point, as ``mlxrt serve`` does. (A plugin that is not installed is
registered by overriding the ``mlxrt_plugins`` fixture instead.)"""

from __future__ import annotations

import pytest

from mlxrt.testing import check_family

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "temperature": 0}


def test_the_host_registers_the_plugin(mlxrt_host):
    record = mlxrt_host.records["example"]
    assert record.status == "loaded" and record.dist == "mlxrt-family-example"
    assert "mlxrt_thinking_format" in record.hooks


def test_qwen3_answers_are_reasoning(mlxrt_client, mlxrt_serve, mlxrt_tiny_checkpoint):
    mine = mlxrt_client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]
    plain = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), disable=["example"])
    theirs = plain.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]
    # the same greedy text: the plugin changes where it goes, not what the model writes
    assert theirs["content"] and not theirs.get("reasoning")
    assert mine["reasoning"] == theirs["content"] and not mine["content"]


def test_qwen3_conforms_with_the_plugin(tmp_path):
    check = check_family("qwen3", workdir=tmp_path, expect=["tools", "thinking"])
    assert check.provenance["thinking_format"] == "example"


@pytest.mark.parametrize("model_type", ["llama"])
def test_other_families_are_left_alone(model_type, mlxrt_serve, mlxrt_tiny_checkpoint):
    client = mlxrt_serve(mlxrt_tiny_checkpoint(model_type))
    assert client.get("/stats").json()["model"]["provenance"].get("thinking_format") != "example"
