"""Every place mlxrt reaches into a dependency's private names, in one fence.

mlx, mlx-lm and uvicorn do not promise their underscored names; an upgrade may rename or
remove any of them without notice. Each touch lives here, once, with a test in
tests/test_compat.py that fails by name when the dependency changes, so an upgrade fails
``test_compat.py::test_<touch>`` instead of silently breaking (for example) batched LoRA.
Nothing outside this module may touch a private name of mlx, mlx-lm, uvicorn or Litestar.

The pin in pyproject.toml (``mlx-lm``) names the versions these tests were run against.
One more contract with mlx-lm lives outside (it uses only public names): the batch lane's own
loop merges, extends, filters and extracts mlx-lm's cache classes (:mod:`mlxrt.engine.batch_steps`,
tested in tests/test_batch_steps.py against the serial loop on plain, sliding and recurrent caches).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "MLX_LAUNCH_CODE",
    "forget_captured_signals",
    "hf_tokenizer",
    "lean_litestar",
    "lean_mlx_lm",
    "masks_overridden",
    "mlx_lm_remappings",
]

#: ``mlx.launch`` as a ``python -c`` program: its module (mlx's private ``_distributed_utils``)
#: has no ``__main__`` guard, so the entry point the ``mlx.launch`` script calls is called.
MLX_LAUNCH_CODE = "from mlx._distributed_utils.launch import main; main()"


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's ``TokenizerWrapper`` (its ``_tokenizer``), or
    the one mlxrt's own :class:`~mlxrt.text.tokenizer.TextTokenizer` loads on first use (this
    imports transformers); any other object is returned as it is."""
    build = getattr(tokenizer, "transformers_tokenizer", None)
    if build is not None:
        return build()
    return getattr(tokenizer, "_tokenizer", tokenizer)


def forget_captured_signals(server: Any) -> None:
    """Make a ``uvicorn.Server`` forget the signals it caught, so that after a graceful
    shutdown it does not re-raise them (which would end the process as "killed").

    uvicorn keeps them in ``Server._captured_signals`` and re-raises each on the way out of
    ``capture_signals``.
    """
    captured = server._captured_signals
    if not isinstance(captured, list):
        raise TypeError(f"uvicorn.Server._captured_signals is a {type(captured).__name__}, not a list")
    captured.clear()


@contextlib.contextmanager
def masks_overridden(text_model: Any, make: Callable[[Callable[[Any, Any], Any]], Callable[[Any, Any], Any]]
                     ) -> Iterator[None]:
    """While active, ``text_model._make_masks(h, cache)`` (mlx-lm's Gemma 4 text model builds
    its per-layer attention masks there) is ``make(original)``: an instance attribute shadows
    the method, and is deleted on the way out."""
    original = text_model._make_masks
    text_model._make_masks = make(original)
    try:
        yield
    finally:
        del text_model._make_masks


def lean_mlx_lm() -> None:
    """Let ``import mlx_lm.models.llama`` (or any other submodule) skip ``mlx_lm/__init__.py``.

    That file imports ``mlx_lm.generate``, ``mlx_lm.convert`` and ``mlx_lm.utils``, which import
    transformers and huggingface-hub at module level: ~1.4 s and ~45 MB of a server's start for
    names mlxrt does not use (docs/performance.md, start-up). Here the package module is created
    from its spec without running that file; the first read of a name it would have defined
    (``mlx_lm.load``, ``from mlx_lm import generate``, ``__all__``) runs it then, so every other
    user of mlx-lm in the process sees the package it expects. Does nothing when ``mlx_lm`` is
    already imported or not installed.
    """
    if "mlx_lm" in sys.modules:
        return
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return
    package = importlib.util.module_from_spec(spec)
    lock = threading.Lock()

    def finish_import(name: str) -> Any:
        if name.startswith("__") and name != "__all__":  # probes such as __wrapped__: not ours to define
            raise AttributeError(f"module 'mlx_lm' has no attribute {name!r}")
        with lock:
            if package.__dict__.pop("__getattr__", None) is not None:
                spec.loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = finish_import  # PEP 562: asked only for names the module lacks
    sys.modules["mlx_lm"] = package
    try:  # cheap, and read by version checks
        package.__version__ = importlib.import_module("mlx_lm._version").__version__
    except (ImportError, AttributeError):
        pass


@functools.cache
def mlx_lm_remappings() -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """mlx-lm's ``MODEL_REMAPPING`` (model_type → module) and ``MODEL_ARCHITECTURE_REMAPPING``
    ((model_type, architecture) → module), read from ``mlx_lm/utils.py``'s source: importing that
    module imports transformers (see :func:`lean_mlx_lm`). Empty tables when it cannot be read."""
    spec = importlib.util.find_spec("mlx_lm.utils")
    found: dict[str, Any] = {}
    try:
        with open(spec.origin, encoding="utf-8") as f:  # type: ignore[union-attr,arg-type]
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id in ("MODEL_REMAPPING", "MODEL_ARCHITECTURE_REMAPPING"):
                    found[node.targets[0].id] = ast.literal_eval(node.value)
    except (AttributeError, TypeError, OSError, SyntaxError, ValueError):
        return {}, {}
    return found.get("MODEL_REMAPPING", {}), found.get("MODEL_ARCHITECTURE_REMAPPING", {})


def lean_litestar() -> type:
    """A ``Litestar`` subclass that adds Litestar's pydantic plugins only when pydantic is
    already imported (a plugin's routes use pydantic models).

    Litestar's ``_get_default_plugins`` imports them whenever pydantic is installed; mlxrt's own
    routes use attrs types and raw requests, and pydantic costs a start ~0.1 s and ~11 MB.
    The other default plugins (msgspec dependency injection, attrs schemas) are kept.
    """
    from litestar import Litestar

    default_plugins = Litestar._get_default_plugins

    class LeanLitestar(Litestar):
        @staticmethod
        def _get_default_plugins(plugins: list[Any]) -> list[Any]:
            if "pydantic" in sys.modules:
                return default_plugins(plugins)
            from litestar.plugins.attrs import AttrsSchemaPlugin
            from litestar.plugins.core import MsgspecDIPlugin

            plugins.append(MsgspecDIPlugin())
            if not any(isinstance(p, AttrsSchemaPlugin) for p in plugins):
                plugins.append(AttrsSchemaPlugin())
            return plugins

    return LeanLitestar
