"""The system BLAS: detection, the matmul check and its fallback, the reports, and that a served
completion is the same token for token with and without it."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from support import MLXRT_BIN

from mlxrt.loading import blas
from mlxrt.testing import write_tiny_checkpoint

SYSTEM_BLAS = blas.find_system_blas(environ={})
needs_blas = pytest.mark.skipif(SYSTEM_BLAS is None or sys.platform != "linux",
                                reason="no system OpenBLAS (apt-get install libopenblas0-pthread)")
MKL = blas.find_mkl()
needs_mkl = pytest.mark.skipif(MKL is None or sys.platform != "linux", reason="no MKL (pip install 'mlxrt[mkl]')")


def _version(*args: str, env: dict[str, str] | None = None) -> str:
    import os

    run = subprocess.run([MLXRT_BIN, *args, "--version"], capture_output=True, text=True, cwd="/",
                         env={**os.environ, **(env or {})}, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_candidates_follow_the_override_then_the_debian_paths():
    paths = [str(p) for p in blas.candidate_paths({"MLXRT_BLAS_PATH": "/opt/my/libopenblas.so"}, "aarch64")]
    assert paths[0] == "/opt/my/libopenblas.so"
    assert "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0" in paths
    assert "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3" in paths
    assert str(blas.find_system_blas({"MLXRT_BLAS_PATH": "/nowhere/libx.so"})) == "/nowhere/libx.so"


def test_mkl_is_found_in_the_environment_lib_folder(tmp_path):
    empty, lib = tmp_path / "empty", tmp_path / "lib"
    empty.mkdir()
    lib.mkdir()
    for name in ("libmkl_rt.so.2", "libmkl_rt.so.3", "libmkl_core.so.3"):
        (lib / name).write_bytes(b"")
    assert blas.find_mkl([empty, lib]) == lib / "libmkl_rt.so.3"
    assert blas.find_mkl([empty]) is None


def _decide_with(monkeypatch, env, *, openblas, mkl, loaded):
    """activate() with the libraries faked: which one it loads and what it reports."""
    monkeypatch.setattr(blas, "_status", None)
    monkeypatch.setattr(blas, "_mlx_imported", lambda: False)
    monkeypatch.setattr(blas, "find_system_blas", lambda environ: openblas)
    monkeypatch.setattr(blas, "find_mkl", lambda: mkl)
    monkeypatch.setattr(blas, "_load", loaded.append)
    monkeypatch.setattr(blas, "matmul_matches", lambda: True)
    for name in ("MKL_THREADING_LAYER", "OPENBLAS_THREAD_TIMEOUT"):
        monkeypatch.setenv(name, "")  # so that monkeypatch restores what activate() sets
        monkeypatch.delenv(name)
    return blas.activate([], env)


def test_openblas_threads_sleep_after_a_product_unless_the_user_says_otherwise(monkeypatch):
    """OpenBLAS's workers would spin ~0.1 s after each product, taking a core from the kernel's
    threads: activate() sets OPENBLAS_THREAD_TIMEOUT=4 (sleep at once) before loading it, leaves
    a value the user set, and sets nothing for MKL."""
    from pathlib import Path

    class WithTimeout(list):
        """Each library loaded, with OPENBLAS_THREAD_TIMEOUT as the loader saw it."""

        def append(self, path):
            super().append((path, blas.os.environ.get("OPENBLAS_THREAD_TIMEOUT")))

    ob, mkl = Path("/usr/lib/x/libopenblas.so.0"), Path("/venv/lib/libmkl_rt.so.3")
    loaded: list = []
    seen = WithTimeout()
    assert _decide_with(monkeypatch, {}, openblas=ob, mkl=mkl, loaded=seen).kind == "openblas"
    assert seen == [(ob, "4")]  # set before the library is loaded
    assert _decide_with(monkeypatch, {"OPENBLAS_THREAD_TIMEOUT": "20"}, openblas=ob, mkl=mkl, loaded=loaded).kind == "openblas"
    assert blas.os.environ.get("OPENBLAS_THREAD_TIMEOUT") is None  # the user's value is OpenBLAS's to read
    assert _decide_with(monkeypatch, {}, openblas=None, mkl=mkl, loaded=loaded).kind == "mkl"
    assert blas.os.environ.get("OPENBLAS_THREAD_TIMEOUT") is None


def test_openblas_comes_before_mkl_and_mlxrt_blas_forces_either(monkeypatch):
    from pathlib import Path

    ob, mkl = Path("/usr/lib/x/libopenblas.so.0"), Path("/venv/lib/libmkl_rt.so.3")
    loaded: list = []
    assert _decide_with(monkeypatch, {}, openblas=ob, mkl=mkl, loaded=loaded).kind == "openblas"
    status = _decide_with(monkeypatch, {}, openblas=None, mkl=mkl, loaded=loaded)
    assert (status.kind, status.path, status.threading) == ("mkl", str(mkl), "SEQUENTIAL")
    assert str(status) == f"MKL ({mkl}, SEQUENTIAL threading)" and status.fast
    assert _decide_with(monkeypatch, {"MLXRT_BLAS": "mkl"}, openblas=ob, mkl=mkl, loaded=loaded).kind == "mkl"
    assert _decide_with(monkeypatch, {"MLXRT_BLAS": "openblas"}, openblas=ob, mkl=mkl, loaded=loaded).kind == "openblas"
    assert loaded == [ob, mkl, mkl, ob]
    bundled = _decide_with(monkeypatch, {"MLXRT_BLAS": "bundled"}, openblas=ob, mkl=mkl, loaded=loaded)
    assert str(bundled) == "bundled (MLXRT_BLAS=bundled)" and not bundled.fast
    assert len(loaded) == 4


def test_expected_names_what_activate_would_load_without_loading_it(monkeypatch):
    from pathlib import Path

    ob, mkl = Path("/usr/lib/x/libopenblas.so.0"), Path("/venv/lib/libmkl_rt.so.3")
    monkeypatch.setattr(blas, "_status", None)
    monkeypatch.setattr(blas, "current", lambda: blas.BlasStatus("bundled", reason="not activated"))
    monkeypatch.setattr(blas, "_mlx_imported", lambda: True)  # a fresh mlxrt process activates first
    monkeypatch.setattr(blas, "find_system_blas", lambda environ: ob)
    monkeypatch.setattr(blas, "find_mkl", lambda: mkl)
    monkeypatch.setattr(blas, "_load", lambda path: pytest.fail(f"expected() loaded {path}"))
    monkeypatch.setattr(blas, "matmul_matches", lambda: pytest.fail("expected() ran the check"))
    assert blas.expected({}) == blas.BlasStatus("openblas", path=str(ob))
    assert blas.expected({"MLXRT_BLAS": "mkl", "MKL_THREADING_LAYER": "intel"}) == \
        blas.BlasStatus("mkl", path=str(mkl), threading="INTEL")
    assert str(blas.expected({"MLXRT_NO_SYSTEM_BLAS": "1"})) == "bundled (MLXRT_NO_SYSTEM_BLAS=1)"
    # once activate() ran, what it decided is the answer
    monkeypatch.setattr(blas, "_status", blas.BlasStatus("bundled", reason="check failed"))
    monkeypatch.setattr(blas, "current", lambda: blas._status)
    assert str(blas.expected({})) == "bundled (check failed)"


def test_a_forced_source_that_is_missing_is_reported_not_replaced(monkeypatch):
    from pathlib import Path

    loaded: list = []
    ob, mkl = Path("/usr/lib/x/libopenblas.so.0"), Path("/venv/lib/libmkl_rt.so.3")
    status = _decide_with(monkeypatch, {"MLXRT_BLAS": "mkl"}, openblas=ob, mkl=None, loaded=loaded)
    assert str(status) == "bundled (MLXRT_BLAS=mkl but no MKL found; pip install 'mlxrt[mkl]')"
    status = _decide_with(monkeypatch, {"MLXRT_BLAS": "openblas"}, openblas=None, mkl=mkl, loaded=loaded)
    assert status.kind == "bundled" and "apt-get install libopenblas0-pthread" in status.reason
    status = _decide_with(monkeypatch, {"MLXRT_BLAS": "fast"}, openblas=ob, mkl=mkl, loaded=loaded)
    assert status.reason == "MLXRT_BLAS=fast is not one of openblas, mkl, bundled"
    status = _decide_with(monkeypatch, {}, openblas=None, mkl=None, loaded=loaded)
    assert "pip install 'mlxrt[mkl]'" in status.reason and "libopenblas0-pthread" in status.reason
    assert loaded == []


def test_mkl_threading_layer_follows_the_environment(monkeypatch):
    from pathlib import Path

    loaded: list = []
    mkl = Path("/venv/lib/libmkl_rt.so.3")
    status = _decide_with(monkeypatch, {"MKL_THREADING_LAYER": "sequential"}, openblas=None, mkl=mkl, loaded=loaded)
    assert status.threading == "SEQUENTIAL"
    assert blas.os.environ.get("MKL_THREADING_LAYER") is None  # the user's choice is left to MKL as given
    status = _decide_with(monkeypatch, {}, openblas=None, mkl=mkl, loaded=loaded)
    assert status.threading == "SEQUENTIAL" and blas.os.environ["MKL_THREADING_LAYER"] == "SEQUENTIAL"
    # a thread count asks for a threaded layer; MKL reads the count itself
    status = _decide_with(monkeypatch, {"MKL_NUM_THREADS": "2"}, openblas=None, mkl=mkl, loaded=loaded)
    assert status.threading in ("GNU", "INTEL") and blas.os.environ["MKL_THREADING_LAYER"] == status.threading
    status = _decide_with(monkeypatch, {"OMP_NUM_THREADS": "1"}, openblas=None, mkl=mkl, loaded=loaded)
    assert status.threading == "SEQUENTIAL"


@needs_blas
def test_detection_picks_the_system_library():
    assert SYSTEM_BLAS.exists() and "openblas" in str(SYSTEM_BLAS)


def test_matmul_check_passes_on_the_active_blas():
    assert blas.matmul_matches()


def test_a_wrong_matmul_fails_the_check(monkeypatch):
    monkeypatch.setattr(blas, "_mlx_matmul", lambda a, b: (a @ b) * 1.01)
    assert not blas.matmul_matches()


def test_a_failed_check_falls_back_to_bundled(monkeypatch, tmp_path):
    lib = tmp_path / "libopenblas.so.0"
    lib.write_bytes(b"")
    restarts = []
    monkeypatch.setattr(blas, "_mlx_imported", lambda: False)
    monkeypatch.setattr(blas, "_load", lambda path: None)
    monkeypatch.setattr(blas, "_mlx_matmul", lambda a, b: (a @ b) + 1)
    monkeypatch.setattr(blas, "_restart_without_system_blas", restarts.append)
    monkeypatch.setattr(blas, "_status", None)
    status = blas.activate([], {"MLXRT_BLAS_PATH": str(lib)})
    assert restarts == ["check failed"]
    assert str(status) == "bundled (check failed)"
    # The restarted process: the reason comes through the environment.
    assert str(blas.activate([], {"MLXRT_BLAS_FALLBACK": "check failed"})) == "bundled (check failed)"


def test_mlx_imported_first_keeps_the_bundled_blas(monkeypatch):
    import mlx.core  # noqa: F401

    monkeypatch.setattr(blas, "_status", None)
    assert str(blas.activate([], {})) == "bundled (mlx imported first)" or sys.platform != "linux"


def test_no_system_blas_flag_and_env(monkeypatch):
    monkeypatch.setattr(blas, "_status", None)
    assert str(blas.activate(["serve", "--no-system-blas"], {})) == "bundled (--no-system-blas)"
    assert blas.activate([], {"MLXRT_NO_SYSTEM_BLAS": "1"}).kind == "bundled"


@needs_blas
def test_version_names_the_system_blas():
    assert f"BLAS: system OpenBLAS ({SYSTEM_BLAS})" in _version()


@needs_mkl
def test_version_names_mkl_when_forced():
    out = _version(env={"MLXRT_BLAS": "mkl", "MKL_THREADING_LAYER": "", "MKL_NUM_THREADS": "", "OMP_NUM_THREADS": ""})
    assert f"BLAS: MKL ({MKL}, SEQUENTIAL threading)" in out


@needs_mkl
def test_version_respects_mkl_threading_layer():
    assert "INTEL threading)" in _version(env={"MLXRT_BLAS": "mkl", "MKL_THREADING_LAYER": "INTEL"})


def test_version_with_no_system_blas_says_bundled():
    assert "BLAS: bundled (--no-system-blas)" in _version("--no-system-blas")


def test_failed_check_restarts_the_real_process_on_bundled():
    code = ("import mlxrt.loading.blas as b; b.matmul_matches = lambda: False\n"
            "from mlxrt.cli import main; main(['--version'])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    expected = "bundled (check failed)" if SYSTEM_BLAS is not None and sys.platform == "linux" else "BLAS: bundled"
    assert expected in run.stdout, run.stderr


def test_dtype_float32_dequantizes_a_quantized_model():
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from mlxrt.loading import cast_weights

    model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64))
    nn.quantize(model, group_size=32, bits=4)
    x = mx.array([[1, 2, 3]])
    before = model(x)
    cast_weights(model, "float32")
    params = dict(tree_flatten(model.parameters()))
    assert not any(name.endswith("scales") for name in params)
    assert {p.dtype for p in params.values()} == {mx.float32}
    assert mx.allclose(model(x), before, atol=1e-4).item()


def _completion(url: str) -> tuple[str, int]:
    body = {"prompt": "hello world, this is", "max_tokens": 24, "temperature": 0}
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()
    assert "choices" in reply, reply
    return reply["choices"][0]["text"], reply["usage"]["completion_tokens"]


@needs_blas
def test_served_completion_is_identical_with_and_without_system_blas(tmp_path, server_process):
    model = write_tiny_checkpoint(tmp_path / "llama", "llama", dtype="float32")
    with_blas = server_process([str(model)])
    stats = httpx.get(f"{with_blas.url}/stats", timeout=30).json()
    assert stats["blas"]["active"] == "openblas" and stats["blas"]["path"] == str(SYSTEM_BLAS)
    tokens = _completion(with_blas.url)
    assert tokens[1] > 4  # a real sequence to compare, not an immediate EOS
    log = with_blas.stop()
    assert "BLAS: system OpenBLAS" in log
    bundled = server_process([str(model), "--no-system-blas"])
    assert httpx.get(f"{bundled.url}/stats", timeout=30).json()["blas"]["active"] == "bundled"
    assert _completion(bundled.url) == tokens


@needs_mkl
def test_served_completion_is_identical_with_mkl_and_bundled(tmp_path, server_process):
    model = write_tiny_checkpoint(tmp_path / "llama", "llama", dtype="float32")
    with_mkl = server_process([str(model)], env={"MLXRT_BLAS": "mkl"})
    stats = httpx.get(f"{with_mkl.url}/stats", timeout=30).json()
    assert stats["blas"]["active"] == "mkl" and stats["blas"]["path"] == str(MKL)
    tokens = _completion(with_mkl.url)
    assert tokens[1] > 4
    assert "BLAS: MKL (" in with_mkl.stop()
    bundled = server_process([str(model)], env={"MLXRT_BLAS": "bundled"})
    assert httpx.get(f"{bundled.url}/stats", timeout=30).json()["blas"]["text"] == "bundled (MLXRT_BLAS=bundled)"
    assert _completion(bundled.url) == tokens
