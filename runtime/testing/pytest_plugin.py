"""Pytest fixtures for mlxrt plugin authors (entry point ``pytest11``: loaded in every pytest
run of an environment where mlxrt is installed; docs/plugins/writing-a-plugin.md). mlxrt's own
test suite uses the same fixtures.

Fixtures (all named ``mlxrt_*`` so that they never shadow a project's own):

* ``mlxrt_plugins`` — the plugins under test, registered before the installed ones; override
  it in your ``conftest.py`` (default: none beyond what entry points install).
* ``mlxrt_host`` — a fresh plugin host with ``mlxrt_plugins`` registered (entry-point plugins
  load too, as in ``mlxrt serve``).
* ``mlxrt_home`` — the test's ``MLXRT_HOME``: one folder per session (conversions and caches
  are shared by the session's tests, never written to the user's home), with
  ``HF_HUB_OFFLINE=1`` so nothing downloads; set in the environment for the test, so that
  ``mlxrt`` subprocesses inherit it. ``mlxrt_serve`` uses it; request it from an autouse
  fixture to isolate every test.
* ``mlxrt_tiny_checkpoint`` — factory: ``mlxrt_tiny_checkpoint("qwen3", seed=0,
  tokenizer_dir=None)`` → the folder of a tiny random checkpoint of that family
  (``mlxrt.testing.TINY_MODEL_TYPES``, ``TINY_VARIANTS``, ``TINY_FAMILY_TYPES``), made once
  per session and per arguments; ``tokenizer_dir`` copies a real tokenizer instead of the
  generated one. The folder, and so the served model's id, is named
  ``<model_type>-<seed>-gen`` (``gen`` replaced by the tokenizer folder's name).
* ``mlxrt_serve`` — factory: ``mlxrt_serve(model_folder, plugins=(), options=None,
  disable=())`` → a Litestar ``TestClient`` of the whole app, in process, with
  ``mlxrt_plugins`` and then ``plugins`` registered; ``options`` are ``mlxrt serve``'s
  options by their Python names (``{"batch": 4}``); ``disable`` names plugins to leave out.
  Any ``model`` name in a body reaches the served model; engines stop at teardown.
* ``mlxrt_model_type`` — the family ``mlxrt_client`` serves (default ``"qwen3"``; override it).
* ``mlxrt_client`` — ``mlxrt_serve(mlxrt_tiny_checkpoint(mlxrt_model_type))``.

The family conformance runner is :func:`mlxrt.testing.check_family`.

Importing this module imports nothing but pytest: mlx and the app load when a fixture runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["mlxrt_client", "mlxrt_home", "mlxrt_host", "mlxrt_model_type", "mlxrt_plugins", "mlxrt_serve",
           "mlxrt_tiny_checkpoint"]


@pytest.fixture
def mlxrt_plugins() -> Sequence[object]:
    """The plugins under test (modules or objects with hookimpls, or ``(name, plugin)`` pairs)."""
    return ()


@pytest.fixture
def mlxrt_host(mlxrt_plugins: Sequence[object]) -> Any:
    from mlxrt.host import make_host

    return make_host(extra=mlxrt_plugins)


@pytest.fixture
def mlxrt_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``MLXRT_HOME`` for this test, in a folder shared by the session; no downloads."""
    home = tmp_path_factory.getbasetemp() / "mlxrt-home"
    monkeypatch.setenv("MLXRT_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


@pytest.fixture(scope="session")
def mlxrt_tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: a tiny random checkpoint's folder, written once per session and per arguments."""
    from mlxrt.testing.writers import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("mlxrt-tiny")
    made: dict[tuple[str, int, Path | None], Path] = {}

    def make(model_type: str, *, seed: int = 0, tokenizer_dir: str | os.PathLike | None = None) -> Path:
        tokenizer = Path(tokenizer_dir).resolve() if tokenizer_dir is not None else None
        key = (model_type, seed, tokenizer)
        if key not in made:
            name = f"{model_type}-{seed}-{tokenizer.name if tokenizer else 'gen'}"
            if (root / name).exists():  # another tokenizer folder of the same name
                name = f"{name}-{len(made)}"
            made[key] = write_tiny_checkpoint(root / name, model_type, tokenizer_dir=tokenizer, seed=seed)
        return made[key]

    return make


@pytest.fixture
def mlxrt_serve(mlxrt_plugins: Sequence[object], mlxrt_home: Path) -> Iterator[Callable[..., Any]]:
    """Factory: the whole app for a model folder, in process, as a Litestar ``TestClient``."""
    from mlxrt.testing.conformance import served

    with contextlib.ExitStack() as stack:
        def serve(model: str | Path, *, plugins: Sequence[object] = (), options: dict[str, Any] | None = None,
                  disable: Sequence[str] = ()) -> Any:
            return stack.enter_context(served(model, plugins=[*mlxrt_plugins, *plugins], options=options,
                                              disable=disable))

        yield serve


@pytest.fixture
def mlxrt_model_type() -> str:
    return "qwen3"


@pytest.fixture
def mlxrt_client(mlxrt_serve: Callable[..., Any], mlxrt_tiny_checkpoint: Callable[..., Path],
                 mlxrt_model_type: str) -> Any:
    return mlxrt_serve(mlxrt_tiny_checkpoint(mlxrt_model_type))
