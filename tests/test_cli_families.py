"""The CLI's family surfaces: `mlxrt plugins --model` (self-test) and `--thinking`."""

from __future__ import annotations

import json
import subprocess

import httpx
from support import MLXRT_BIN


def test_plugins_with_a_model_reports_family_tier_and_self_test(tiny_models):
    out = subprocess.run([MLXRT_BIN, "plugins", "--json", "--model", str(tiny_models("qwen3"))],
                         capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout)
    assert any(p["name"] == "qwen" for p in report["plugins"])
    model = report["model"]
    assert model["tier"] == "family" and model["self_test"]["tools"] == "pass"
    assert set(model["self_test"]) >= {"template", "tools", "thinking"}
    table = subprocess.run([MLXRT_BIN, "plugins", "--model", str(tiny_models("qwen3"))],
                           capture_output=True, text=True, timeout=120, check=True).stdout
    assert "self-test tools: pass" in table


def test_no_thinking_flag_turns_reasoning_off_by_default(tiny_models, server_process):
    server = server_process([str(tiny_models("qwen3")), "--no-thinking"])
    body = {"prompt": "x", "max_tokens": 1}
    # What the template rendered is visible through the prompt length: thinking off adds the
    # empty think block Qwen3's template writes when enable_thinking is false.
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    off = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=30).json()["usage"]["prompt_tokens"]
    on = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                    json={**chat, "chat_template_kwargs": {"enable_thinking": True}}).json()["usage"]["prompt_tokens"]
    assert off > on
    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).status_code == 200
