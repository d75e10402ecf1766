"""The Litestar application factory: core routes plus every plugin's ``mlxrt_routes``.

``create_app(host, models)`` builds a fresh app around a plugin host and the model pool that
serves (``app.state.host``, ``app.state.models``). Route conflicts between plugins are found
before Litestar sees the handlers (Litestar would refuse to build the whole app): the later
plugin's route is reported and skipped. The core routes read what the pool and the
:class:`~mlxrt.serving.ServingEngine` protocol declare, for the model
:meth:`~mlxrt.model_pool.ModelPool.current` names.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from litestar import Litestar, Request, Response, get
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.router import Router

import mlxrt
from mlxrt.api.errors import exception_handlers
from mlxrt.api.models import pool_of
from mlxrt.api.schema_ui import SCHEMA_ROUTES, render_plugins
from mlxrt.compat import lean_litestar, wrap_litestar_handler
from mlxrt.engine.qmv import status as qmv_status
from mlxrt.loading.blas import current as current_blas

if TYPE_CHECKING:
    from mlxrt.model_pool import ModelPool
    from mlxrt.registry import PluginHost
    from mlxrt.serving import ServingEngine

__all__ = ["create_app", "claimed_fields"]

log = logging.getLogger("mlxrt.api")

HEALTH_BODY = b'{"status": "ok"}'
#: Default request-body cap (``--max-body-size 32MiB``): a base64 image at --max-image-bytes'
#: default (20 MiB → 27 MiB) plus its prompt; text that long is refused before tokenizing.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@get("/health", summary="Liveness", tags=["server"], include_in_schema=True, opt={"public": True})
async def health(request: Request[Any, Any, Any]) -> Response[Any]:
    # An engine that cannot serve any more (a distributed rank was lost) says why: 503.
    current = pool_of(request).current()
    problem = current.engine.unhealthy if current is not None and current.engine is not None else None
    if problem:
        return Response(content={"status": "unavailable", "error": problem}, status_code=503,
                        media_type="application/json")
    # Exact bytes (with the space) as mlx-bun and mlx_lm.server clients expect.
    return Response(content=HEALTH_BODY, media_type="application/json")


@get("/v1", summary="Index of endpoints", tags=["server"])
async def index(request: Request[Any, Any, Any]) -> dict[str, Any]:
    current = pool_of(request).current()
    endpoints = sorted(
        {f"{method} {path}" for path, methods in _route_table(request.app.route_handler_method_map)
         for method in methods},
        key=lambda s: (s.split(" ", 1)[1], s),
    )
    return {
        "name": "mlxrt",
        "version": mlxrt.__version__,
        "model": current.model_id if current is not None else None,
        "endpoints": endpoints,
    }


def _weights_dtype(engine: ServingEngine | None) -> dict[str, Any] | None:
    choice = engine.loaded.dtype if engine is not None and engine.loaded is not None else None
    return choice.as_dict() if choice is not None else None


def _current_engine(pool: ModelPool) -> ServingEngine | None:
    """The engine of the model the server describes (:meth:`ModelPool.current`), if one is resident."""
    current = pool.current()
    return current.engine if current is not None else None


@get("/stats", summary="Engine counters", tags=["server"])
async def stats(request: Request[Any, Any, Any]) -> dict[str, Any]:
    host: PluginHost = request.app.state.host
    pool = pool_of(request)
    engine = _current_engine(pool)
    return {
        "server": {"version": mlxrt.__version__, "started_at": host.options.get("started_at")},
        "blas": current_blas().as_dict(),
        "dtype": _weights_dtype(engine),
        "quantized_kernel": qmv_status().as_dict(),
        # None once every model was unloaded (--idle-unload): "models" still lists them
        "model": None if engine is None else {
            "id": engine.info.model_id, "model_type": engine.info.model_type,
            "family": engine.profile.family, "tier": engine.profile.tier,
            "self_test": dict(engine.profile.self_test), "provenance": dict(engine.profile.provenance)},
        "engine": engine.stats() if engine is not None else None,
        "models": pool.describe(),
        # the Responses plugin's store (mlxrt.plugins.responses), once a request has made it
        **({"responses": host.plugin_states["responses"].stats()} if "responses" in host.plugin_states else {}),
        # the structured plugin's compiled grammars (mlxrt.plugins.structured), once one was compiled
        **({"grammars": host.plugin_states["structured"].stats()} if "structured" in host.plugin_states else {}),
        "plugins": {"loaded": [r.name for r in host.loaded()],
                    "failed": {r.name: r.error for r in host.failed()},
                    "route_conflicts": list(host.route_conflicts)},
    }


@get("/metrics", summary="Prometheus metrics", tags=["server"], media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any]) -> Response[Any]:
    from mlxrt.metrics import render

    pool = pool_of(request)
    engine = _current_engine(pool)
    families = [*request.app.state.http_metrics.families()]
    if engine is not None:  # the described model's engine; every model's: the model-labelled families
        families += _engine_families(engine)
    families += pool.metric_families()
    return Response(content=render(families), media_type="text/plain; version=0.0.4; charset=utf-8")


def _engine_families(engine: ServingEngine) -> list[Any]:
    """The unlabelled ``/metrics`` families of one engine."""
    from mlxrt.metrics import gauge

    stats = engine.stats()
    cache = stats["prompt_cache"]
    families = [
        engine.ttft.lines(), engine.latency.lines(),
        gauge("mlxrt_tokens_generated_total", "Tokens generated since start.", stats["tokens_generated"]),
        gauge("mlxrt_requests_served_total", "Generations finished since start.", stats["requests_served"]),
        gauge("mlxrt_requests_cancelled_total", "Generations cancelled (client left).", stats["requests_cancelled"]),
        gauge("mlxrt_requests_rejected_total", "Requests refused by the queue (429).", stats["requests_rejected"]),
        gauge("mlxrt_queue_depth", "Requests waiting for admission.", stats["queue_depth"]),
        gauge("mlxrt_running_rows", "Requests being generated.", stats["running_rows"]),
        gauge("mlxrt_reserved_tokens", "Prompt + max_tokens of the running requests.", stats["reserved_tokens"]),
        gauge("mlxrt_prompt_cache_lookups_total", "Prompt-cache lookups by outcome.", None,
              {("hit",): cache["hits"], ("partial",): cache["partial_hits"], ("miss",): cache["misses"]},
              ("outcome",)),
        gauge("mlxrt_prompt_cache_bytes", "Bytes held by the prompt cache.", cache["bytes"]),
        gauge("mlxrt_prompt_cache_entries", "Entries in the prompt cache.", cache["entries"]),
        gauge("mlxrt_prompt_cache_tokens_reused_total", "Prompt tokens served from the cache.",
              cache["tokens_reused"]),
    ]
    if stats.get("mlx_active_bytes") is not None:
        families.append(gauge("mlxrt_mlx_active_bytes", "MLX memory in use.", stats["mlx_active_bytes"]))
    return families


def _route_table(method_map: Mapping[str, Mapping[Any, Any]]) -> Iterable[tuple[str, list[str]]]:
    for path, handlers in method_map.items():
        if path.startswith("/schema"):
            continue
        methods = [m for m in handlers if m not in ("OPTIONS", "HEAD", "asgi", "websocket")]
        if methods:
            yield path, methods


CORE_ROUTES = (health, index, stats, metrics, *SCHEMA_ROUTES)


def _claims(item: Any) -> list[tuple[Any, str]]:
    """(method, path) pairs a contributed route object claims."""
    if isinstance(item, HTTPRouteHandler):
        return [(m, p) for p in item.paths for m in item.http_methods]
    if isinstance(item, Router):
        return [(m, p) for route in item.routes for p in [route.path]
                for m in getattr(route, "methods", ())]
    if inspect.isclass(item) and hasattr(item, "path"):
        claims: list[tuple[Any, str]] = []
        for value in vars(item).values():
            if isinstance(value, HTTPRouteHandler):
                base = item.path.rstrip("/")
                claims += [(m, (base + p) if p != "/" else base or "/") for p in value.paths for m in value.http_methods]
        return claims
    return []


def collect_routes(host: PluginHost) -> list[tuple[str, Any]]:
    """Every plugin's routes as ``(plugin, route)``, in plugin call order, minus conflicting
    ones (reported) and those of plugins whose ``mlxrt_routes`` raised (marked failed)."""
    taken: dict[tuple[str, str], str] = {
        (m, p): "mlxrt" for h in CORE_ROUTES for p in h.paths for m in h.http_methods
    }
    accepted: list[tuple[str, Any]] = []
    for plugin, item in host.collect_at_start("mlxrt_routes", host=host):
        claims = _claims(item)
        clash = next(((c, taken[c]) for c in claims if c in taken), None)
        if clash is not None:
            (method, path), owner = clash
            log.error("plugin %s: route %s %s conflicts with plugin %s; skipped", plugin, method, path, owner)
            host.route_conflicts.append(f"{plugin}: {method} {path} (taken by {owner})")
            continue
        taken.update({c: plugin for c in claims})
        accepted.append((plugin, item))
    return accepted


def claimed_fields(host: PluginHost, dialect: str) -> dict[str, type]:
    """Extra body fields plugins claim for ``dialect`` (``mlxrt_request_fields``) and their
    types (:meth:`mlxrt.host.PluginHost.request_fields`, collected once per host and dialect;
    two plugins claiming one field is a load error)."""
    return {name: claim.type for name, claim in host.request_fields(dialect).items()}


def create_app(host: PluginHost, models: ModelPool, *, cors_origins: list[str] | None = None,
               debug: bool = False) -> Litestar:
    """Build the HTTP app for ``host``'s plugins, serving the models of ``models``."""
    contributed = collect_routes(host)
    dialects = {getattr(r, "opt", {}).get("dialect") for _plugin, r in contributed}
    for dialect in sorted(d for d in dialects if isinstance(d, str)):
        claimed_fields(host, dialect)  # a conflicting claim fails here, at build time
    routes = [*CORE_ROUTES, *(r for _plugin, r in contributed)]
    # Who serves each (method, path): if that plugin fails at start, the edge guard answers 503.
    owners = {claim: plugin for plugin, r in contributed for claim in _claims(r)}

    async def startup() -> None:
        # A plugin that raises here is marked failed and its routes answer 503; the server
        # starts without it (MLXRT_STRICT_PLUGINS=1 makes it a start-up error instead).
        for plugin, result in host.collect_at_start("mlxrt_startup", host=host, model=models.primary.model):
            if inspect.isawaitable(result):
                try:
                    await result
                except Exception as exc:  # plugin boundary
                    host.fail_at_start(plugin, "mlxrt_startup", exc)

    async def shutdown() -> None:
        for plugin, result in host.collect_at_start("mlxrt_shutdown", host=host, model=models.primary.model):
            if inspect.isawaitable(result):
                try:
                    await result
                except Exception as exc:  # plugin boundary: the others still shut down
                    host.fail_at_start(plugin, "mlxrt_shutdown", exc)

    from mlxrt.api.auth import api_key_guard
    from mlxrt.api.edge import EdgePolicy, edge_guard, method_semantics
    from mlxrt.api.observe import HttpMetrics, observe
    from mlxrt.api.openapi import document

    document(routes)  # request and error bodies in /schema/openapi.json

    keys = list(host.options.get("api_keys") or ())
    policy = EdgePolicy.from_options({**host.options, "cors_origins": cors_origins})
    http_metrics = HttpMetrics()
    app: Litestar = lean_litestar()(
        route_handlers=routes,
        guards=[edge_guard(policy, host, owners), *([api_key_guard(keys)] if keys else [])],
        state=State({"host": host, "models": models, "http_metrics": http_metrics}),
        exception_handlers=exception_handlers(),
        cors_config=CORSConfig(allow_origins=cors_origins) if cors_origins else None,
        openapi_config=OpenAPIConfig(title="mlxrt", version=mlxrt.__version__, path="/schema",
                                     render_plugins=render_plugins()),  # offline: api/schema_ui.py
        on_startup=[startup],
        on_shutdown=[shutdown],
        request_max_body_size=host.options.get("max_body_bytes") or DEFAULT_MAX_BODY_BYTES,
        debug=debug,
        logging_config=None,  # mlxrt configures logging (request ids, text or JSON), not Litestar
    )
    # HEAD as GET without a body; Allow listing every method of a path (around routing)
    wrap_litestar_handler(app, lambda handler: method_semantics(handler, lambda: app.routes))
    # Outside routing, so unmatched paths and CORS preflights get an id and are counted too.
    wrap_litestar_handler(app, lambda handler: observe(handler, http_metrics))
    from mlxrt.model_pool import releasing_leases

    wrap_litestar_handler(app, releasing_leases)  # a request holds its model until its response is sent
    app.on_startup.append(models.open)
    app.on_shutdown.append(models.close)
    return app
