"""The CLI's family surfaces (`mlxrt plugins --model`, `--thinking`, the family the start banner names) and what
`mlxrt serve` prints at start."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from support import MLXRT_BIN


def test_plugins_with_a_model_reports_family_tier_and_self_test(mlxrt_tiny_checkpoint):
    out = subprocess.run([MLXRT_BIN, "plugins", "--json", "--model", str(mlxrt_tiny_checkpoint("qwen3"))],
                         capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout)
    assert any(p["name"] == "qwen" for p in report["plugins"])
    model = report["model"]
    assert model["tier"] == "family" and model["self_test"]["tools"] == "pass"
    assert set(model["self_test"]) >= {"template", "tools", "thinking"}
    table = subprocess.run([MLXRT_BIN, "plugins", "--model", str(mlxrt_tiny_checkpoint("qwen3"))],
                           capture_output=True, text=True, timeout=120, check=True).stdout
    assert "self-test tools: pass" in table


def test_no_thinking_flag_turns_reasoning_off_by_default(mlxrt_tiny_checkpoint, server_process):
    server = server_process([str(mlxrt_tiny_checkpoint("qwen3")), "--no-thinking"])
    body = {"prompt": "x", "max_tokens": 1}
    # What the template rendered is visible through the prompt length: thinking off adds the
    # empty think block Qwen3's template writes when enable_thinking is false.
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    off = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=30).json()["usage"]["prompt_tokens"]
    on = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                    json={**chat, "chat_template_kwargs": {"enable_thinking": True}}).json()["usage"]["prompt_tokens"]
    assert off > on
    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).status_code == 200


def test_the_start_banner_v1_models_and_plugins_name_the_same_family(mlxrt_tiny_checkpoint, server_process):
    """One source (``FamilyProfile.family``): a Qwen3 folder is ``qwen`` everywhere (the banner
    said ``family mlx-lm``, the loader's name, while /v1/models said ``qwen``)."""
    model = str(mlxrt_tiny_checkpoint("qwen3"))
    server = server_process([model])
    row = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]
    status = httpx.get(f"{server.url}/pages/status", timeout=30).json()["model"]
    output = server.stop().splitlines()
    first = next(i for i, line in enumerate(output) if " serving " in line)
    banner = " ".join(output[first:first + 2])  # the banner's first lines: what, then how
    assert row["family"] == "qwen" and status["family"] == "qwen"
    assert ", family qwen, " in banner
    models = next(line.strip() for line in output if line.strip().startswith("models: "))
    assert models.endswith("; other names: the served model (x-mlxrt-model-fallback)")
    report = json.loads(subprocess.run([MLXRT_BIN, "plugins", "--json", "--model", model], capture_output=True,
                                       text=True, timeout=120, check=True).stdout)
    assert report["model"]["family"] == "qwen"


def test_no_pytorch_notice_when_transformers_is_imported(mlxrt_tiny_checkpoint, server_process):
    """`--batch 2` imports mlx-lm's batch generator, and with it transformers, at start: its
    "PyTorch was not found" notice is dropped (mlxrt never runs PyTorch); the default start does
    not import transformers at all (tests/test_lean_start.py)."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed: transformers prints no notice to drop")
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    server = server_process([str(mlxrt_tiny_checkpoint("llama")), "--batch", "2", "--log-level", "debug"])
    loaded = httpx.get(f"{server.url}/stats", timeout=30).json()["engine"]["lane"]
    output = server.stop()
    assert loaded == "batch" and "serving" in output
    assert "PyTorch was not found" not in output
