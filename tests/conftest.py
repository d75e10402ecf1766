"""The suite's own fixtures. Tiny checkpoints, the in-process app and the plugin host are the
``mlxrt_*`` fixtures mlxrt ships to plugin authors (mlxrt.testing.pytest_plugin, loaded through
the ``pytest11`` entry point): ``mlxrt_tiny_checkpoint``, ``mlxrt_serve``, ``mlxrt_client``,
``mlxrt_host``, ``mlxrt_home``. What is only ours lives here: the shared data, real
``mlxrt serve`` processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import MLXRT_BIN, ServerProcess  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
#: ../shared beside the checkout; tests that need its data skip when it is absent.
SHARED = Path(os.environ.get("MLXRT_SHARED", REPO.parent / "shared"))
TOKENIZERS = SHARED / "data" / "tokenizers"
# MLX's CUDA backend computes float32 matmuls in TF32 by default (~1e-3 error, seen on an H200);
# the tests compare float32 logits, logprobs and seeded texts exactly. Read at the first matmul;
# server subprocesses inherit it.
os.environ.setdefault("MLX_ENABLE_TF32", "0")
# The suite runs the kernel's 8-bit activations (the production default too, but a developer's
# MLXRT_QMV_EXACT=1 must not change what the suite tests; the exact path is tested by
# tests/test_qmv.py's forced "exact" run), here and in every server it starts.
os.environ.setdefault("MLXRT_QMV_EXACT", "0")


def shared_tokenizer(name: str) -> Path:
    path = TOKENIZERS / name
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"needs ../shared/data/tokenizers/{name}")
    return path


@pytest.fixture(autouse=True)
def _isolated_mlxrt_home(mlxrt_home):
    # Every test, also those that start `mlxrt serve` subprocesses (they inherit the environment):
    # conversions and caches in the session's folder, never in the user's home; no downloads.
    return mlxrt_home


@pytest.fixture
def server_process():
    started: list[ServerProcess] = []

    def start(args, env=None, timeout=120):
        server = ServerProcess(list(args), env, timeout)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
