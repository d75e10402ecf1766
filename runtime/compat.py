"""Every place mlxrt reaches into a dependency's private names, in one fence.

mlx, mlx-lm, uvicorn and Litestar do not promise their underscored names, nor the attributes
and file layouts their documentation leaves out (uvicorn's protocol state, Litestar's
``asgi_handler``, mlx-lm's model-module files and the module its samplers live in); an
upgrade may rename or remove any of them without notice. Each touch lives here, once, with a
test in tests/test_compat.py that fails by name when the dependency changes, so an upgrade
fails ``test_compat.py::test_<touch>`` instead of silently breaking (for example) batched LoRA.
Nothing outside this module may touch a private name of mlx, mlx-lm, uvicorn or Litestar.

Nothing here runs at import: :func:`lean_mlx_lm` changes ``sys.modules``, and only
``mlxrt serve`` calls it (:func:`mlxrt.cli.main`), so ``import mlxrt`` — in a plugin's
tests, a notebook, any process that merely has mlxrt installed — leaves mlx-lm alone.

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
import re
import sys
import threading
from collections.abc import Callable, Iterator, MutableSet
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "MLX_LAUNCH_CODE",
    "RequestProgress",
    "defer_module",
    "forget_captured_signals",
    "hf_tokenizer",
    "lean_litestar",
    "lean_mlx_lm",
    "masks_overridden",
    "mlx_lm_has_architecture",
    "mlx_lm_forward_known",
    "mlx_lm_remappings",
    "mlx_lm_sets_tokenizer_defaults",
    "route_attention",
    "route_swiglu",
    "uvicorn_connections",
    "uvicorn_http_protocol",
    "uvicorn_loop",
    "uvicorn_request",
    "uvicorn_request_progress",
    "uvicorn_request_scope",
    "uvicorn_transport",
    "wrap_litestar_handler",
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


# Why route_attention and route_swiglu replace module globals (the only replacement of mlx-lm's
# globals in mlxrt): mlx-lm offers no seam for either. Its model modules bind
# ``scaled_dot_product_attention`` (from ``mlx_lm.models.base``) and ``swiglu`` (from
# ``mlx_lm.models.activations``) by name at import and call those globals from their layers'
# forwards; no argument, model-class hook or registry chooses them, and a model's layers that
# call them are mlx-lm's own classes (``Attention``, ``MLP``), which mlxrt does not rebuild.
# mlxrt's other changes to a loaded model go through public seams: samplers and logits
# processors are passed to mlx-lm's loop (``make_sampler``, ``make_logits_processors``), and the
# kernel's layers replace MLX's through ``Module.update_modules`` (:mod:`mlxrt.engine.qmv`), and so
# do the subclasses of mlx-lm's ``Attention``, Gemma ``RMSNorm`` and ``MLP`` classes that recompute their
# forwards with fewer primitives (:data:`KNOWN_FORWARDS` below: subclassing, not patching, so the
# routed globals stay the only replaced names; the digest is what fences the copied forward).


def route_attention(model: Any, route: Callable[[Callable[..., Any]], Callable[..., Any]]) -> int:
    """Make the mlx-lm model modules ``model`` is built from call ``route(original)`` where they
    call ``mlx_lm.models.base.scaled_dot_product_attention`` (each imports it by name and calls
    that global); return how many modules now do. The replacement is process-wide (every model of
    those architectures), so ``route`` must compute what the original does: mlxrt routes through
    the kernel's attention primitive, which is MLX's own where it does not apply. Idempotent."""
    from mlx_lm.models import base

    return _route_global(model, "scaled_dot_product_attention", base.scaled_dot_product_attention, route)


def route_swiglu(model: Any, route: Callable[[Callable[..., Any]], Callable[..., Any]]) -> int:
    """As :func:`route_attention`, for ``mlx_lm.models.activations.swiglu`` (``silu(gate) * x``,
    the gated MLP of llama-style modules): ``route(original)`` must give the same results."""
    from mlx_lm.models import activations

    return _route_global(model, "swiglu", activations.swiglu, route)


def swap_known_layers(model: Any, class_name: str, subclass: Callable[[type], type], **settings: Any) -> int:
    """Swap ``model``'s mlx-lm layers of class ``class_name`` whose forward :func:`mlx_lm_forward_known`
    knows for an instance of ``subclass(type(layer))`` holding the layer's children, parameters
    and settings (its constructor needs the model's arguments, which the layer does not keep), plus
    ``settings`` as attributes, through MLX's public ``Module.update_modules``; return how many. A
    layer held in a list (no attribute name) is left alone: none of the known models does."""
    modules = dict(model.named_modules())
    swapped = 0
    for path, layer in modules.items():
        parent_path, _, key = path.rpartition(".")
        parent = modules.get(parent_path) if parent_path else model
        known = type(layer).__name__ == class_name and mlx_lm_forward_known(type(layer))
        if not known or parent is None or key.isdigit():
            continue
        cls = subclass(type(layer))
        new = cls.__new__(cls)
        dict.update(new, layer)  # an MLX module is a dict of its children and parameters
        new.__dict__.update(layer.__dict__)  # and keeps its settings (heads, scale) as attributes
        new.__dict__.update(settings)
        parent.update_modules({key: new})
        swapped += 1
    return swapped


def _route_global(model: Any, attr: str, original: Any, route: Callable[[Callable[..., Any]], Callable[..., Any]]
                  ) -> int:
    """Replace the global ``attr`` of ``model``'s modules where it is ``original``; count them."""
    routed = 0
    for name in {type(layer).__module__ for _path, layer in model.named_modules()}:
        found = sys.modules.get(name)
        current = getattr(found, attr, None)
        if current is original:
            routed_fn = route(original)
            routed_fn.__wrapped__ = original  # type: ignore[attr-defined]
            setattr(found, attr, routed_fn)
            routed += 1
        elif getattr(current, "__wrapped__", None) is original:
            routed += 1
    return routed


#: mlx-lm layer classes whose forward mlxrt recomputes with fewer primitives, by (model module,
#: class), with the first 16 hex digits of the SHA-256 of the forward's source
#: (``inspect.getsource(cls.__call__)``) it was written against (mlx-lm 0.32.2):
#: the ``Attention`` forwards that :mod:`mlxrt.engine.one_token` takes for one token (reshape,
#: transpose, per-head norms for qwen3 and gemma3_text, rope, ``cache.update_and_fetch``, the
#: module's ``scaled_dot_product_attention``, transpose, reshape, ``o_proj``), and the Gemma
#: ``RMSNorm`` (``mx.fast.rms_norm(x, 1.0 + self.weight, self.eps)``) that the kernel's fused norm
#: computes (:func:`mlxrt.engine.qmv.install_fused`), and the Gemma 2 and 3 ``MLP``
#: (``down_proj(nn.gelu_approx(gate_proj(x)) * up_proj(x))``) whose activation the kernel's
#: ``geglu`` computes (Gemma 1's MLP takes the exact ``nn.gelu``: not listed).
KNOWN_FORWARDS = {
    ("llama", "Attention"): "3b9b8774b647f7a4",
    ("qwen2", "Attention"): "0d02f6cbda3a89f1",
    ("qwen3", "Attention"): "789af9d8868081c1",
    ("gemma3_text", "Attention"): "a293df9f54178d8a",
    ("gemma", "RMSNorm"): "a459ce2c95139b11",
    ("gemma2", "RMSNorm"): "a459ce2c95139b11",
    ("gemma3_text", "RMSNorm"): "a459ce2c95139b11",
    ("gemma2", "MLP"): "af866537bc38d7c4",
    ("gemma3_text", "MLP"): "af866537bc38d7c4",
}


#: mlx-lm cache classes whose one-token update mlxrt's fused decode step performs itself
#: (:func:`mlxrt.engine.one_token._step_rows`: where the key and value are written, which rows are
#: attended, how ``offset`` and the rotating write index move), by class, with the first 16 hex
#: digits of the SHA-256 of those methods' sources, joined in this order (mlx-lm 0.32.2).
KNOWN_CACHES: dict[str, tuple[str, tuple[str, ...]]] = {
    "KVCache": ("3ffac056c62726d5", ("update_and_fetch",)),
    "RotatingKVCache": ("62e7cc81d3762b53", ("update_and_fetch", "_update_in_place", "keys_and_values")),
}


@functools.cache
def mlx_lm_cache_known(cls: type) -> bool:
    """Whether ``cls`` is one of mlx-lm's cache classes in :data:`KNOWN_CACHES` with its methods'
    sources still the ones listed: an mlx-lm that changed how one updates leaves its caches on
    mlx-lm's own ``update_and_fetch`` (tests/test_compat.py says which)."""
    import hashlib
    import inspect

    known = KNOWN_CACHES.get(cls.__name__) if cls.__module__ == "mlx_lm.models.cache" else None
    if known is None:
        return False
    digest, methods = known
    try:
        source = "".join(inspect.getsource(getattr(cls, name)) for name in methods)
    except (OSError, TypeError, AttributeError):
        return False
    return hashlib.sha256(source.encode()).hexdigest()[:16] == digest


@functools.cache
def mlx_lm_forward_known(cls: type) -> bool:
    """Whether ``cls`` is a class of mlx-lm's model modules in :data:`KNOWN_FORWARDS` with its
    forward's source still the one listed (an mlx-lm that changed it leaves that model's layers
    as they are, and ``test_compat.py`` says which). Those forwards are undocumented code that
    mlxrt recomputes, hence the fence; the swaps themselves go through MLX's public
    ``Module.update_modules``."""
    import hashlib
    import inspect

    package, _, name = cls.__module__.rpartition(".")
    digest = KNOWN_FORWARDS.get((name, cls.__name__)) if package == "mlx_lm.models" else None
    if digest is None:
        return False
    try:
        source = inspect.getsource(cls.__call__)
    except (OSError, TypeError):  # no source to compare (a frozen or compiled build)
        return False
    return hashlib.sha256(source.encode()).hexdigest()[:16] == digest


def lean_mlx_lm() -> None:
    """Let ``import mlx_lm.models.llama`` (or any other submodule) skip ``mlx_lm/__init__.py``.

    That file imports ``mlx_lm.generate``, ``mlx_lm.convert`` and ``mlx_lm.utils``, which import
    transformers and huggingface-hub at module level: ~1.4 s and ~45 MB of a server's start for
    names mlxrt does not use (docs/performance.md, start-up). The package is deferred
    (:func:`defer_module`): its submodules import without that file, and the first read of a
    name it would have defined (``mlx_lm.load``, ``from mlx_lm import generate``, ``__all__``)
    runs it then, so every other user of mlx-lm in the process sees the package it expects.
    Does nothing when ``mlx_lm`` is already imported or not installed.

    It changes ``sys.modules`` for the whole process, so only ``mlxrt serve`` calls it, first
    thing (:func:`mlxrt.cli.main`; its ranks under ``mlx.launch`` run the same command), never
    ``import mlxrt``.
    """
    package = defer_module("mlx_lm")
    if package is None:
        return
    try:  # cheap, and read by version checks
        package.__version__ = importlib.import_module("mlx_lm._version").__version__
    except (ImportError, AttributeError):
        pass


def defer_module(name: str) -> ModuleType | None:
    """Put module ``name`` in ``sys.modules`` without running its file: ``import name`` binds it
    as it is, its submodules import as usual, and the first read of a name it lacks (``name.f``,
    ``from name import f``, ``__all__``, ``__version__``; not other dunder names, which
    introspection probes) runs the file then (a PEP 562 module ``__getattr__``, removed first).
    Returns the module; ``None`` (and nothing done) when ``name`` is already imported or not
    installed.

    ``mlxrt serve`` defers, first thing, mlx-lm's package (:func:`lean_mlx_lm`) and three modules
    Litestar imports at module level for what a server rarely does: ``yaml``
    (``/schema/openapi.yaml`` alone), ``annotated_types`` (constraints in handler annotations;
    mlxrt's have none) and ``pdb`` (``pdb_on_exception``): ~20 ms and ~1.7 MiB of a start. Like :func:`lean_mlx_lm` it changes
    ``sys.modules`` for the whole process, so ``import mlxrt`` never calls it.
    (:class:`importlib.util.LazyLoader` does not do here: on Python 3.11 the next ``import name``
    reads the module's ``__spec__``, which runs it.)"""
    if name in sys.modules:
        return None
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    lock = threading.Lock()

    def finish_import(attr: str) -> Any:
        if attr.startswith("__") and attr not in ("__all__", "__version__"):  # probes such as __wrapped__
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        with lock:
            if module.__dict__.pop("__getattr__", None) is not None:
                spec.loader.exec_module(module)
        return getattr(module, attr)

    module.__getattr__ = finish_import  # type: ignore[method-assign]
    sys.modules[name] = module
    return module


#: The tables of ``mlx_lm/utils.py`` that map a model type (or a type and an architecture)
#: to the ``mlx_lm.models`` module that builds it.
_REMAPPING_TABLES = ("MODEL_REMAPPING", "MODEL_ARCHITECTURE_REMAPPING")


def _mlx_lm_folder() -> Path | None:
    """mlx-lm's package folder, found without importing it (finding a submodule would)."""
    spec = importlib.util.find_spec("mlx_lm")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        return Path(folder)
    return None


@functools.cache
def mlx_lm_remappings() -> tuple[dict[str, str], dict[tuple[str, str], str]] | None:
    """mlx-lm's ``MODEL_REMAPPING`` (model_type → module) and ``MODEL_ARCHITECTURE_REMAPPING``
    ((model_type, architecture) → module), read from ``mlx_lm/utils.py``'s source: importing that
    module imports transformers (see :func:`lean_mlx_lm`).

    ``None`` when they cannot be read (the file moved, or no longer assigns both tables as
    literals): callers then leave the model type to mlx-lm's own loader, which knows its tables,
    rather than refuse a remapped type (``mistral`` → ``llama``) as unknown."""
    package = _mlx_lm_folder()
    if package is None:
        return None
    found: dict[str, Any] = {}
    try:
        source = (package / "utils.py").read_text(encoding="utf-8")
        try:
            found = {name: _assigned_literal(source, name) for name in _REMAPPING_TABLES}
        except (TypeError, SyntaxError, ValueError):  # not plainly one statement each: the whole file
            for node in ast.parse(source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    if node.targets[0].id in _REMAPPING_TABLES:
                        found[node.targets[0].id] = ast.literal_eval(node.value)
    except (TypeError, OSError, SyntaxError, ValueError):
        return None
    by_type, by_architecture = (found.get(name) for name in _REMAPPING_TABLES)
    if not isinstance(by_type, dict) or not isinstance(by_architecture, dict):
        return None
    return by_type, by_architecture


def _assigned_literal(source: str, name: str) -> Any:
    """The literal that ``source`` assigns to ``name`` in its one top-level ``name = ...``,
    parsed from that statement alone: ``ast.parse`` of all of ``mlx_lm/utils.py`` costs a
    start ~10 ms. Raises ValueError (or SyntaxError) when that is not plainly so: the caller
    then parses the whole file."""
    starts = [m.start() for m in re.finditer(rf"^{re.escape(name)}\s*=", source, re.M)]
    if len(starts) != 1:
        raise ValueError(name)
    # The statement ends at the next line that starts in column 0 without closing a bracket.
    end = re.compile(r"^[^\s)\]}#]", re.M).search(source, starts[0] + len(name))
    body = ast.parse(source[starts[0]:end.start() if end else len(source)]).body
    if not (len(body) == 1 and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1
            and isinstance(body[0].targets[0], ast.Name) and body[0].targets[0].id == name):
        raise ValueError(name)
    return ast.literal_eval(body[0].value)


def mlx_lm_has_architecture(model_type: str) -> bool:
    """Whether mlx-lm builds ``model_type``: a module ``mlx_lm/models/<model_type>.py``, or a
    type its ``MODEL_REMAPPING`` sends to one (nothing imported unless the table cannot be read
    from source; then it is imported from ``mlx_lm.utils``, transformers with it)."""
    package = _mlx_lm_folder()
    if package is None:
        return False
    folder = package / "models"
    if (folder / f"{model_type}.py").is_file():
        return True
    tables = mlx_lm_remappings()
    if tables is not None:
        by_type = tables[0]
    else:
        try:
            from mlx_lm.utils import MODEL_REMAPPING as by_type
        except ImportError:
            return False
    remapped = by_type.get(model_type)
    return bool(remapped) and remapped != model_type and (folder / f"{remapped}.py").is_file()


def mlx_lm_sets_tokenizer_defaults(model_type: str) -> bool:
    """Whether mlx-lm's module for ``model_type`` (after ``MODEL_REMAPPING``) defines
    ``TOKENIZER_DEFAULTS``: a chat renderer, tool parser or EOS list its tokenizer loader
    applies (``mlx_lm.utils._tokenizer_defaults``). Read from the module's source, not imported.
    True when the remap table cannot be read, so that mlx-lm's own loader decides."""
    package = _mlx_lm_folder()
    if package is None:
        return False
    tables = mlx_lm_remappings()
    if tables is None:
        return True
    module = tables[0].get(model_type, model_type).replace("-", "_")
    try:
        return "TOKENIZER_DEFAULTS" in (package / "models" / f"{module}.py").read_text(encoding="utf-8")
    except OSError:
        return False


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


def wrap_litestar_handler(app: Any, wrap: Callable[[Any], Any]) -> None:
    """Put the ASGI middleware ``wrap(handler) -> handler`` around everything the Litestar
    ``app`` does for a request — routing, its exception handlers, CORS — so that unmatched paths
    and CORS preflights pass through it too (Litestar's own middleware runs only on a matched
    route). It replaces ``app.asgi_handler``, the undocumented attribute ``Litestar.__call__``
    awaits."""
    app.asgi_handler = wrap(app.asgi_handler)


# uvicorn's HTTP protocols (h11's and httptools', whichever ``AutoHTTPProtocol`` is) keep their
# state in undocumented attributes: ``connections`` (the server's set of open protocols),
# ``loop``, ``transport`` and ``cycle`` (the request in flight, or None), and on a cycle
# ``more_body``, ``response_started``, ``response_complete`` and ``scope``.
# mlxrt.api.connections reads them through the functions below.


def uvicorn_http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (h11 or httptools, as uvicorn picks), to subclass."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return AutoHTTPProtocol


def uvicorn_connections(protocol: Any) -> MutableSet[Any]:
    """Every open connection (protocol) of the server ``protocol`` belongs to, itself included."""
    return protocol.connections  # type: ignore[no-any-return]


def uvicorn_loop(protocol: Any) -> asyncio.AbstractEventLoop:
    """The event loop ``protocol`` runs on."""
    return protocol.loop  # type: ignore[no-any-return]


def uvicorn_transport(protocol: Any) -> asyncio.Transport:
    """The connection's transport (set when the connection is made)."""
    return protocol.transport  # type: ignore[no-any-return]


def uvicorn_request(protocol: Any) -> Any | None:
    """The request in flight on the connection (uvicorn's request-response cycle, compared by
    identity), or None before a complete request head has arrived."""
    return getattr(protocol, "cycle", None)


class RequestProgress(NamedTuple):
    """Where one request of :func:`uvicorn_request` stands."""

    #: Part of the request body has still to arrive.
    more_body: bool
    #: The response's head has been sent.
    response_started: bool
    #: The whole response has been sent.
    response_complete: bool


def uvicorn_request_progress(request: Any) -> RequestProgress:
    """Where ``request`` (from :func:`uvicorn_request`) stands."""
    return RequestProgress(request.more_body, request.response_started, request.response_complete)


def uvicorn_request_scope(request: Any) -> dict[str, Any]:
    """The ASGI scope ``request`` (from :func:`uvicorn_request`) hands to the app."""
    return request.scope  # type: ignore[no-any-return]
