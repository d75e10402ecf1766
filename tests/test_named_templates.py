"""``mlxrt serve --chat-template NAME``: the built-in chat templates by llama-server's names
(mlxrt.text.named_templates), a template file, Jinja text, and a clear error for anything else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxrt.text.named_templates import NAMED_TEMPLATES, chat_template_text

CHAT = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": " Hello! "}, {"role": "user", "content": "Bye"}]

#: What each name renders for CHAT (on a tokenizer that adds no BOS), generation prompt included.
EXPECTED = {
    "chatml": "<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
              "<|im_start|>assistant\n Hello! <|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nYou are a test.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello!<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Bye<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "gemma": "<start_of_turn>user\nYou are a test.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
             "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
    "mistral-v7": "[SYSTEM_PROMPT] You are a test.[/SYSTEM_PROMPT][INST] Hi there[/INST]  Hello! </s>[INST] Bye[/INST]",
    "phi3": "<|system|>\nYou are a test.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\n Hello! <|end|>\n"
            "<|user|>\nBye<|end|>\n<|assistant|>\n",
    "zephyr": "<|system|>\nYou are a test.<|endoftext|>\n<|user|>\nHi there<|endoftext|>\n"
              "<|assistant|>\n Hello! <|endoftext|>\n<|user|>\nBye<|endoftext|>\n<|assistant|>\n",
}


def _prompt(client, messages=CHAT) -> str:
    resp = client.post("/apply-template", json={"messages": messages})
    assert resp.status_code == 200, resp.text
    return resp.json()["prompt"]


def test_every_name_has_its_expected_rendering():
    assert set(EXPECTED) == set(NAMED_TEMPLATES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_named_template_renders_its_format(name, mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"chat_template": name})
    assert _prompt(client) == EXPECTED[name]


def test_llama_servers_own_expectations_for_command_r(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"chat_template": "command-r"})
    # tools/server/tests/unit/test_chat_completion.py::test_apply_chat_template's expected prompt
    assert _prompt(client, CHAT[:2]) == ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
                                         "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
                                         "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    # and a chat answers with it (the tiny model writes noise; the prompt is what counts)
    resp = client.post("/v1/chat/completions", json={"messages": CHAT[:2], "max_tokens": 2, "verbose": True})
    assert resp.status_code == 200 and resp.json()["__verbose"]["prompt"].endswith("<|CHATBOT_TOKEN|>")


def test_a_tokenizer_that_adds_a_bos_gets_it_first(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("gemma4_text"), options={"chat_template": "gemma"})
    assert _prompt(client, CHAT[1:2]) == "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"
    tokens = client.post("/v1/chat/completions/input_tokens", json={"messages": CHAT[1:2]}).json()["input_tokens"]
    assert tokens == len(client.post("/tokenize", json={"content": _prompt(client, CHAT[1:2])}).json()["tokens"])


def test_values_other_than_names(tmp_path: Path):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert chat_template_text(template) == template
    path = tmp_path / "t.jinja"
    path.write_text(template)
    assert chat_template_text(str(path)) == template
    with pytest.raises(ValueError) as err:
        chat_template_text("llama4-not-a-name")
    assert all(name in str(err.value) for name in NAMED_TEMPLATES)


def test_serve_refuses_an_unknown_name_before_loading_anything(tmp_path: Path):
    mlxrt = Path(sys.executable).with_name("mlxrt")
    out = subprocess.run([str(mlxrt), "serve", str(tmp_path / "no-such-model"), "--chat-template", "lama3"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "MLXRT_HOME": str(tmp_path)})
    assert out.returncode == 2, out.stderr
    assert "--chat-template" in out.stderr and "'lama3' is not a built-in chat template" in out.stderr
    assert "llama3" in out.stderr and "command-r" in out.stderr
