"""The real plugin path: a third-party package installed with pip, found through its entry
point by a real `mlxrt` process; a plugin that raises at import is reported and skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import MLXRT_BIN, openai_client

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "plugins" / "examples" / "mlxrt-family-example"
BROKEN = REPO / "tests" / "fixture-plugins" / "mlxrt-broken-example"


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    """Both example distributions pip-installed (no network) into a folder put on PYTHONPATH."""
    target = tmp_path_factory.mktemp("site")
    for project in (EXAMPLE, BROKEN):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
             "--no-index", "--target", str(target), str(project)],
            check=True, capture_output=True, text=True,
        )
    return target


def env_with(plugin_dir):
    return {**os.environ, "PYTHONPATH": str(plugin_dir)}


def plugins_json(env, *args):
    out = subprocess.run([MLXRT_BIN, "plugins", "--json", *args], env=env, capture_output=True,
                         text=True, check=True, cwd="/")
    return {row["name"]: row for row in json.loads(out.stdout)}


def test_builtins_listed_without_third_parties():
    rows = plugins_json({**os.environ, "PYTHONPATH": ""})
    for name in ("qwen", "minicpm5", "gemma4", "diffusion_gemma"):
        assert rows[name]["status"] == "loaded" and rows[name]["kind"] == "family" and rows[name]["builtin"]
    assert rows["openai"]["kind"] == "dialect"
    assert "example" not in rows


def test_example_is_discovered_and_broken_is_reported(plugin_dir):
    rows = plugins_json(env_with(plugin_dir))
    example = rows["example"]
    assert example["status"] == "loaded" and example["dist"] == "mlxrt-family-example"
    assert example["hooks"] == ["mlxrt_thinking_format"] and example["builtin"] is False
    broken = rows["broken"]
    assert broken["status"] == "failed" and "broken on purpose" in broken["error"]
    assert rows["qwen"]["status"] == "loaded"


def test_plugins_table(plugin_dir):
    out = subprocess.run([MLXRT_BIN, "plugins"], env=env_with(plugin_dir), capture_output=True, text=True,
                         check=True, cwd="/").stdout
    assert "example" in out and "thinking_format" in out
    assert "failed" in out and "RuntimeError: mlxrt-broken-example is broken on purpose" in out


def test_disable_plugin_never_imports_it(plugin_dir):
    rows = plugins_json(env_with(plugin_dir), "--disable-plugin", "broken")
    assert rows["broken"]["status"] == "disabled" and rows["broken"]["error"] is None


def test_example_changes_behaviour_and_broken_does_not_stop_the_server(plugin_dir, mlxrt_tiny_checkpoint, server_process):
    model = mlxrt_tiny_checkpoint("qwen3")
    request = dict(model="m", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=12,
                   temperature=0)

    import httpx

    plain = server_process([str(model), "--disable-plugin", "example"], env=env_with(plugin_dir))
    with httpx.Client(base_url=plain.url, timeout=60) as http:
        before = openai_client(http).chat.completions.create(**request).choices[0].message
    log = plain.stop()
    assert "plugin broken failed to load" in log

    hooked = server_process([str(model)], env=env_with(plugin_dir))
    with httpx.Client(base_url=hooked.url, timeout=60) as http:
        after = openai_client(http).chat.completions.create(**request).choices[0].message
    # Same greedy text; the example plugin says generation starts inside <think>, so it is reasoning now.
    assert before.content and not (before.model_extra or {}).get("reasoning")
    assert after.model_extra["reasoning"] == before.content
    assert after.content == ""


def test_example_plugin_own_tests_pass_with_the_shipped_fixtures(plugin_dir):
    """The example's tests use only mlxrt.testing and the mlxrt_* fixtures of the pytest11 plugin
    (a typo in a fixture name, or a fixture that stops working, fails them here)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd=EXAMPLE, env=env_with(plugin_dir), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "4 passed" in out.stdout
