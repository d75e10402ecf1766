"""mlxrt's pytest plugin for plugin authors (mlxrt.testing.pytest_plugin) and the family conformance
runner (mlxrt.testing.check_family). The example plugin's own tests, which use both, run in
tests/test_plugin_path.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mlxrt.testing import check_family


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
