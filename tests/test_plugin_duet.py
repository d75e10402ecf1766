"""The second example plugin, plugins/examples/mlxrt-family-duet (a new architecture with its own
tool calls and reasoning markup), through the real plugin path: pip-installed, found through its
entry point by a real ``mlxrt`` process, served from the command line, and its own tests passing
with the fixtures mlxrt ships (docs/plugins/writing-a-plugin.md walks through the package)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support import MLXRT_BIN, openai_client

REPO = Path(__file__).resolve().parents[1]
DUET = REPO / "plugins" / "examples" / "mlxrt-family-duet"
HOOKS = ["mlxrt_load_model", "mlxrt_thinking_format", "mlxrt_tool_parser"]


@pytest.fixture(scope="module")
def duet_site(tmp_path_factory):
    """The package pip-installed (no network) into a folder put on PYTHONPATH."""
    target = tmp_path_factory.mktemp("duet-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(DUET)], check=True, capture_output=True, text=True)
    return target


def env_with(site):
    return {**os.environ, "PYTHONPATH": str(site)}


def test_duet_is_discovered_with_its_hooks(duet_site):
    out = subprocess.run([MLXRT_BIN, "plugins", "--json"], env=env_with(duet_site), capture_output=True, text=True,
                         check=True, cwd="/")
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    duet = rows["duet"]
    assert duet["status"] == "loaded" and duet["dist"] == "mlxrt-family-duet"
    assert duet["kind"] == "family" and duet["builtin"] is False and duet["hooks"] == HOOKS


def test_mlxrt_serve_loads_a_duet_checkpoint_and_reads_its_calls(duet_site, tmp_path, server_process):
    """`python -m mlxrt_family_duet.checkpoint` then `mlxrt serve` on it, as the docs say."""
    env = env_with(duet_site)
    subprocess.run([sys.executable, "-m", "mlxrt_family_duet.checkpoint", str(tmp_path / "duet")], env=env,
                   check=True, capture_output=True, text=True, cwd="/")
    server = server_process([str(tmp_path / "duet")], env=env)
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"], "additionalProperties": False}}}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        model = http.get("/v1/models").json()["data"][0]
        out = openai_client(http).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Look up 7."}], tools=[tool], max_tokens=40,
            tool_choice={"type": "function", "function": {"name": "lookup"}}, temperature=0)
    assert out.choices[0].finish_reason == "tool_calls"
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "lookup" and isinstance(json.loads(call.function.arguments)["id"], int)
    assert model["family"] == "duet" and model["tools"] and model["reasoning"]
    assert set(model["self_test"].values()) == {"pass"}  # the load-time self-test through Duet's template


def test_duet_own_tests_pass_with_the_shipped_fixtures(duet_site):
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd=DUET, env=env_with(duet_site), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "8 passed" in out.stdout
