"""mlxrt's pytest plugin for plugin authors (mlxrt.testing.pytest_plugin) and the family conformance
runner (mlxrt.testing.check_family). The example plugin's own tests, which use both, run in
tests/test_plugin_path.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlxrt import hookimpl
from mlxrt.testing import check_family, write_tiny_checkpoint


def test_the_pytest_plugin_is_registered_and_imports_nothing_heavy():
    import importlib.metadata as md

    (ep,) = [ep for ep in md.entry_points(group="pytest11") if ep.value == "mlxrt.testing.pytest_plugin"]
    # (``import mlxrt`` registers mlx-lm's package without running it: mlxrt.compat.lean_mlx_lm)
    code = ("import sys, mlxrt.testing.pytest_plugin as p; "
            "print(sorted(m for m in ('mlx', 'mlx.core', 'mlx_lm.models', 'mlx_lm.generate', 'transformers',"
            " 'litestar', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert ep.name == "mlxrt"


def test_fixtures_serve_a_tiny_checkpoint(mlxrt_client, mlxrt_host):
    assert mlxrt_host.records["qwen"].status == "loaded"
    out = mlxrt_client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3,
                                                     "temperature": 0})
    assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] <= 3


def test_mlxrt_home_is_the_sessions_folder_and_nothing_downloads(mlxrt_home, tmp_path_factory):
    assert os.environ["MLXRT_HOME"] == str(mlxrt_home) and os.environ["HF_HUB_OFFLINE"] == "1"
    assert mlxrt_home.parent == tmp_path_factory.getbasetemp()  # one folder for the session's tests


def test_tiny_checkpoints_are_made_once_per_arguments(mlxrt_tiny_checkpoint, tmp_path):
    first = mlxrt_tiny_checkpoint("llama")
    assert mlxrt_tiny_checkpoint("llama") == first and first.name == "llama-0-gen"
    assert mlxrt_tiny_checkpoint("llama", seed=1) != first
    assert (mlxrt_tiny_checkpoint("llama", seed=1) / "model.safetensors").read_bytes() != \
        (first / "model.safetensors").read_bytes()
    # a real tokenizer's folder (here another tiny checkpoint's) names the checkpoint instead of "gen"
    source = write_tiny_checkpoint(tmp_path / "a" / "tok", "qwen3")
    other = write_tiny_checkpoint(tmp_path / "b" / "tok", "qwen3", seed=3)
    copied = mlxrt_tiny_checkpoint("qwen3", tokenizer_dir=source)
    assert copied.name == "qwen3-0-tok"
    assert (copied / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    assert mlxrt_tiny_checkpoint("qwen3", tokenizer_dir=str(source)) == copied
    assert mlxrt_tiny_checkpoint("qwen3", tokenizer_dir=other) not in (copied, mlxrt_tiny_checkpoint("qwen3"))


class _Who:
    def __init__(self, name: str) -> None:
        self.name = name

    @hookimpl
    def mlxrt_routes(self, host):
        from litestar import get

        @get("/example/who", sync_to_thread=False)
        def who() -> dict:
            return {"who": self.name}

        return [who]


class TestServeRegistersPluginsAfterTheFixtures:
    @pytest.fixture
    def mlxrt_plugins(self):
        return [("first", _Who("first"))]

    def test_per_call_plugins_come_after_mlxrt_plugins(self, mlxrt_serve, mlxrt_tiny_checkpoint):
        client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("second", _Who("second"))])
        # the plugin registered last wins a route both declare
        assert client.get("/example/who").json() == {"who": "second"}
        alone = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("second", _Who("second"))],
                            disable=["second"])
        assert alone.get("/example/who").json() == {"who": "first"}


def test_check_family_passes_a_built_in_family(tmp_path):
    check = check_family("qwen3", workdir=tmp_path, expect=["tools", "thinking"])
    assert check.results["parity"] == "pass" and check.results["template"] == "pass"
    assert check.provenance["tool_parser"] == "qwen"


def test_check_family_names_an_expected_capability_the_family_lacks(tmp_path):
    # (a plain llama has tools now, mlxrt's generic ones; it still has no thinking format)
    with pytest.raises(AssertionError, match=r"(?s)'llama' does not conform.*thinking: fail: expected to pass, is n/a"):
        check_family("llama", workdir=tmp_path, expect=["thinking"])


def test_check_family_names_a_parity_failure(tmp_path):
    class Greedy:  # a sampler plugin that always picks token 0: greedy mlx-lm disagrees
        from mlxrt import hookimpl

        @hookimpl
        def mlxrt_sampler(self, request, info):
            import mlx.core as mx

            return lambda logprobs: mx.zeros((logprobs.shape[0],), dtype=mx.uint32)

    with pytest.raises(AssertionError, match=r"parity: fail: mlxrt"):
        check_family("qwen3", workdir=tmp_path, plugins=[("zero", Greedy())])
