"""Shared fixtures: tiny checkpoints, an in-process server, and the official SDK clients."""

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


def shared_tokenizer(name: str) -> Path:
    path = TOKENIZERS / name
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"needs ../shared/data/tokenizers/{name}")
    return path


@pytest.fixture(autouse=True)
def _isolated_mlxrt_home(tmp_path_factory, monkeypatch):
    # Conversions and caches land in a per-session folder, never in the user's home.
    monkeypatch.setenv("MLXRT_HOME", str(tmp_path_factory.getbasetemp() / "mlxrt-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Factory: ``tiny_models("qwen3")`` → folder of a tiny random checkpoint (cached per session)."""
    from mlxrt.testing import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("ckpt")
    made: dict[tuple, Path] = {}

    def make(model_type: str, *, seed: int = 0, tokenizer: str | None = None) -> Path:
        key = (model_type, seed, tokenizer)
        if key not in made:
            tok_dir = shared_tokenizer(tokenizer) if tokenizer else None
            made[key] = write_tiny_checkpoint(root / f"{model_type}-{seed}-{tokenizer or 'gen'}",
                                              model_type, tokenizer_dir=tok_dir, seed=seed)
        return made[key]

    return make


@pytest.fixture
def serve_app():
    """Factory: build the app in-process for a model folder; yields a Litestar TestClient."""
    from litestar.testing import TestClient

    from mlxrt.cli import build_server
    from mlxrt.host import make_host

    clients = []

    def start(model: str | Path, *, extra=(), options=None, disable=()):
        host = make_host(extra=extra, disable=disable)
        # model_fallback: tests send placeholder names ("m"); tests/test_multi_model.py turns it off.
        app = build_server(host, str(model), {"host": "127.0.0.1", "port": 0, "model_fallback": True,
                                              **(options or {})})
        client = TestClient(app, base_url="http://127.0.0.1")  # a Host the loopback server serves
        client.__enter__()
        clients.append((client, host))
        return client

    yield start
    for client, host in clients:
        client.__exit__(None, None, None)
        host.models.stop()


@pytest.fixture
def qwen3_client(tiny_models, serve_app):
    return serve_app(tiny_models("qwen3"))


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
