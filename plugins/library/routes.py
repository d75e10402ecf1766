"""Route handlers of the library plugin.

``/fit`` and ``/library`` assess with the served engine's own settings (``--memory-budget``,
``--prompt-cache-bytes``, ``--batch``, ``--dtype``, ``--max-models``, ``--distributed``) unless
the query gives a budget (or, for ``/fit``, a dtype); without any budget they assume
:func:`mlxrt.loading.sizes.machine_budget`. The served dtype is decided on this server's own
device and BLAS. File reads run off the event loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from litestar import Request, get
from litestar.params import Parameter

from mlxrt.api.models import pool_of
from mlxrt.errors import InvalidRequest, ModelLoadError, NotFound
from mlxrt.loading import blas
from mlxrt.loading.dtype_choice import DTYPES, machine_facts
from mlxrt.loading.fit import FitReport, assess
from mlxrt.loading.sizes import DEFAULT_CONTEXT

if TYPE_CHECKING:
    from mlxrt.model_pool import ModelPool
    from mlxrt.registry import PluginHost
    from mlxrt.serving import ServedModel

__all__ = ["ROUTES", "fit", "library", "downloads"]


def _current(pool: ModelPool) -> ServedModel | None:
    """The model the server describes (:meth:`mlxrt.model_pool.ModelPool.current`; none loads)."""
    slot = pool.current()
    return slot.model if slot is not None else None


def _settings(host: PluginHost, pool: ModelPool, budget_gb: float | None, dtype: str | None = None) -> dict[str, Any]:
    model = _current(pool)
    cfg = model.settings if model is not None else None
    if dtype is not None and dtype not in DTYPES:
        raise InvalidRequest(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}", param="dtype")
    budget: int | None
    if budget_gb is not None:
        if not 0 < budget_gb <= 1e6:  # also NaN
            raise InvalidRequest("memory_budget must be a number of GB above 0", param="memory_budget")
        budget, source = int(budget_gb * 1e9), "query"
    else:
        budget = getattr(cfg, "memory_budget", None)
        source = "server" if budget is not None else "machine"
    options = host.options
    return {"budget": budget, "budget_source": source,
            "prompt_cache_bytes": getattr(cfg, "prompt_cache_bytes", None),
            "rows": getattr(cfg, "batch", 1) or 1,
            "dtype": dtype or options.get("dtype") or "auto", "machine": machine_facts(blas.current()),
            "models": int(options.get("max_models") or 1), "lazy": bool(options.get("distributed"))}


def _served(pool: ModelPool) -> tuple[str, Path] | None:
    model = _current(pool)
    return (model.info.model_id, Path(model.info.path)) if model is not None else None


def _resolve(host: PluginHost, pool: ModelPool, query: str | None) -> tuple[str, Path]:
    from mlxrt.loading.paths import local_repo_ids, match_local_repo
    from mlxrt.loading.resolve import resolve_model

    served = _served(pool)
    if not query or (served is not None and query == served[0]):
        if served is None:
            raise InvalidRequest("no model is being served; name one with ?model=", param="model")
        return served
    if pool.settings.strict:  # only what it serves: nothing from the disk
        source = pool.known_source(query)
        if source is None:
            raise NotFound(f"model {query!r} is not served here; this server serves: "
                           f"{', '.join(pool.usable_names())}", param="model", code="model_not_found")
        return source.model_id, source.path
    try:
        repo = match_local_repo(query, local_repo_ids())
    except ModelLoadError as exc:
        raise InvalidRequest(exc.message, param="model", code=exc.code) from None
    if repo is None:
        raise NotFound(f"model {query!r} is neither the served model nor (part of) the id of a model in "
                       "the local Hugging Face cache", param="model", code="model_not_found")
    try:
        source = resolve_model(repo, allow_download=False)
    except ModelLoadError as exc:
        raise InvalidRequest(exc.message, param="model", code="model_unreadable") from None
    return source.model_id, source.path


def _assess(model: str, path: Path, ctx: int, settings: dict[str, Any]) -> FitReport:
    try:
        return assess(path, ctx=ctx, model=model, **settings)
    except ModelLoadError as exc:
        raise InvalidRequest(exc.message, param="model", code="model_unreadable") from None


@get("/fit", summary="Memory fit of a model at a context", tags=["library"])
async def fit(
    request: Request[Any, Any, Any],
    model: Annotated[str | None, Parameter(description="Served model id (default) or part of a local repo id")]
    = None,
    ctx: Annotated[int, Parameter(ge=1, le=1 << 31, description="Tokens of context")] = DEFAULT_CONTEXT,
    memory_budget: Annotated[float | None, Parameter(gt=0, le=1e6, description="Budget in GB (10^9 bytes)")]
    = None,
    dtype: Annotated[str | None, Parameter(description="Dtype to assess, as serve's --dtype: "
                                           + "|".join(DTYPES) + " (default: this server's)",
                                           # documented, checked by _settings (its 400 names the param)
                                           schema_extra={"enum": list(DTYPES)})] = None,
) -> dict[str, Any]:
    """The static memory contract (``mlxrt fit``) in the dtype this server would serve the model
    in; for the served model also the engine's measured plan (``measured``)."""
    host, pool = request.app.state.host, pool_of(request)
    name, path = await anyio.to_thread.run_sync(_resolve, host, pool, model)
    report = await anyio.to_thread.run_sync(_assess, name, path, ctx, _settings(host, pool, memory_budget, dtype))
    body = report.describe()
    served = _served(pool)
    current = _current(pool)
    plan = current.memory if current is not None else None
    if served is not None and served[1] == path and plan is not None:
        body["measured"] = plan.describe()
    return body


def _library_rows(host: PluginHost, pool: ModelPool, ctx: int, settings: dict[str, Any]) -> list[dict[str, Any]]:
    from mlxrt.loading.library import describe_snapshot, scan_library

    served = _served(pool)
    models = scan_library(host).models
    # a GGUF's row has the file as its path, the served model its converted folder: same name
    if served is not None and not any(m.path == served[1] or m.repo_id == served[0] for m in models):
        # served from a folder, a .gguf or the embedded wheel: listed too, first
        models.insert(0, describe_snapshot(served[0], served[1], host, revision=None, size_bytes=_du(served[1]),
                                           revisions=1))
    rows = []
    resident = {Path(s.source.path) for s in pool.resident()}  # with several models, each resident one serves
    for m in models:
        row = m.describe()
        row["serving"] = (served is not None and (m.path == served[1] or m.repo_id == served[0])) or m.path in resident
        row["assessment"] = None
        if m.servable and m.path is not None:
            try:
                report = assess(m.path, ctx=ctx, model=m.repo_id, **settings)
                row["assessment"] = {k: report.describe()[k] for k in (
                    "ctx", "fits", "max_safe_context", "weight_bytes", "kv_bytes_per_token",
                    "fixed_bytes_per_request", "budget_bytes", "budget_source", "dtype")}
            except ModelLoadError:
                pass
        rows.append(row)
    return rows


def _du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@get("/library", summary="Local models with support tier and fit", tags=["library"])
async def library(
    request: Request[Any, Any, Any],
    ctx: Annotated[int, Parameter(ge=1, le=1 << 31, description="Context the assessment uses")] = DEFAULT_CONTEXT,
) -> dict[str, Any]:
    """Every model of the local Hugging Face cache (and the served one), with its support
    tier, a fit assessment at ``ctx`` and whether it is the one being served."""
    host, pool = request.app.state.host, pool_of(request)
    rows = await anyio.to_thread.run_sync(_library_rows, host, pool, ctx, _settings(host, pool, None))
    served = _served(pool)
    return {"serving": served[0] if served else None, "models": rows}


@get("/downloads", summary="Active and recent model downloads", tags=["library"])
async def downloads() -> dict[str, Any]:
    """The newest downloads of any mlxrt process on this machine (``mlxrt get``, serve-time)."""
    import attrs

    from mlxrt.loading.downloads import recent_downloads

    found = await anyio.to_thread.run_sync(recent_downloads)
    return {"downloads": [attrs.asdict(d) for d in found]}


ROUTES = (fit, library, downloads)
