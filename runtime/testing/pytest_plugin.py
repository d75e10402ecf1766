"""Pytest fixtures for mlxrt plugin authors (entry point ``pytest11``: loaded in every pytest
run of an environment where mlxrt is installed; docs/plugins/writing-a-plugin.md).

Fixtures (all named ``mlxrt_*`` so that they never shadow a project's own):

* ``mlxrt_plugins`` — the plugins under test, registered before the installed ones; override
  it in your ``conftest.py`` (default: none beyond what entry points install).
* ``mlxrt_host`` — a fresh plugin host with ``mlxrt_plugins`` registered (entry-point plugins
  load too, as in ``mlxrt serve``).
* ``mlxrt_tiny_checkpoint`` — factory: ``mlxrt_tiny_checkpoint("qwen3")`` → the folder of a
  tiny random checkpoint of that family (``mlxrt.testing.TINY_MODEL_TYPES``), made once per
  session and per ``(model_type, seed)``.
* ``mlxrt_serve`` — factory: ``mlxrt_serve(model_folder, options=None, disable=())`` → a
  Litestar ``TestClient`` of the whole app, in process, with ``mlxrt_plugins`` registered (any
  ``model`` name in a body reaches the served model); the engine is stopped at teardown.
* ``mlxrt_model_type`` — the family ``mlxrt_client`` serves (default ``"qwen3"``; override it).
* ``mlxrt_client`` — ``mlxrt_serve(mlxrt_tiny_checkpoint(mlxrt_model_type))``.

The family conformance runner is :func:`mlxrt.testing.check_family`.

Importing this module imports nothing but pytest: mlx and the app load when a fixture runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["mlxrt_client", "mlxrt_host", "mlxrt_model_type", "mlxrt_plugins", "mlxrt_serve",
           "mlxrt_tiny_checkpoint"]


@pytest.fixture
def mlxrt_plugins() -> Sequence[object]:
    """The plugins under test (modules or objects with hookimpls, or ``(name, plugin)`` pairs)."""
    return ()


@pytest.fixture
def mlxrt_host(mlxrt_plugins: Sequence[object]) -> Any:
    from mlxrt.host import make_host

    return make_host(extra=mlxrt_plugins)


@pytest.fixture(scope="session")
def mlxrt_tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    from mlxrt.testing.writers import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("mlxrt-tiny")
    made: dict[tuple[str, int], Path] = {}

    def make(model_type: str, *, seed: int = 0) -> Path:
        if (model_type, seed) not in made:
            made[model_type, seed] = write_tiny_checkpoint(root / f"{model_type}-{seed}", model_type, seed=seed)
        return made[model_type, seed]

    return make


@pytest.fixture
def mlxrt_serve(mlxrt_plugins: Sequence[object], tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    from mlxrt.testing.conformance import served

    # conversions and caches in the test's folder, never the user's home; no downloads
    monkeypatch.setenv("MLXRT_HOME", str(tmp_path / "mlxrt-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with contextlib.ExitStack() as stack:
        def serve(model: str | Path, *, options: dict[str, Any] | None = None, disable: Sequence[str] = ()) -> Any:
            return stack.enter_context(served(model, plugins=mlxrt_plugins, options=options, disable=disable))

        yield serve


@pytest.fixture
def mlxrt_model_type() -> str:
    return "qwen3"


@pytest.fixture
def mlxrt_client(mlxrt_serve: Callable[..., Any], mlxrt_tiny_checkpoint: Callable[..., Path],
                 mlxrt_model_type: str) -> Any:
    return mlxrt_serve(mlxrt_tiny_checkpoint(mlxrt_model_type))
