"""Ollama's model routes: ``GET /api/tags`` (local models), ``POST /api/show`` (one model),
``GET /api/ps`` (resident models), ``GET /api/version`` and ``DELETE /api/delete``.

Names are Ollama's ``name:tag`` (:func:`mlxrt.plugins.ollama.wire.ollama_name`): the ids mlxrt
answers with, tagged ``:latest``. The models listed are the ones ``/v1/models`` lists: those
the model pool knows (the served one, ``--preload``, aliases' targets, loaded since) and every
servable repo of the local Hugging Face cache, described from their files (nothing loads).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from litestar import Request, Response, get, post
from litestar import delete as delete_route

from mlxrt.api.models import pool_of
from mlxrt.api.wire import parse_json_object
from mlxrt.capabilities import capabilities
from mlxrt.errors import InvalidRequest, ModelLoadError, NotFound
from mlxrt.loading.library import parameter_size
from mlxrt.plugins.ollama.schemas import NAMED, opt
from mlxrt.plugins.ollama.wire import VERSION, created_at, ollama_name, pool_name

if TYPE_CHECKING:
    from mlxrt.model_pool import ModelPool
    from mlxrt.registry import PluginHost

__all__ = ["list_tags", "show", "running", "version", "delete"]

#: ``expires_at`` of a model nothing unloads (Ollama writes a far-future time too).
NEVER = "2318-11-26T00:00:00Z"


def _digest(key: str) -> str:
    """A stable id per model (Ollama's digests are SHA-256 of a manifest; mlxrt has none)."""
    return hashlib.sha256(key.encode()).hexdigest()


def _details(row: Any) -> dict[str, Any]:
    """Ollama's ``details`` from a library row (:class:`mlxrt.loading.library.LocalModel`)."""
    family = row.model_type or ""
    quant = f"Q{row.quant_bits}" if row.quant_bits else "F16"
    return {"parent_model": "", "format": "safetensors", "family": family, "families": [family] if family else None,
            "parameter_size": parameter_size(row.params), "quantization_level": quant}


def _describe(model_id: str, path: Path, host: Any) -> Any:
    from mlxrt.loading.library import describe_snapshot

    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file()) if path.is_dir() else 0
    return describe_snapshot(model_id, path, host, revision=None, size_bytes=size, revisions=1)


def _tag(row: Any) -> dict[str, Any]:
    name = ollama_name(row.repo_id)
    modified = row.path.stat().st_mtime if row.path is not None and row.path.exists() else time.time()
    return {"name": name, "model": name, "modified_at": created_at(modified),
            "size": row.weight_bytes or row.size_bytes, "digest": _digest(str(row.path)), "details": _details(row)}


def _tag_rows(host: PluginHost, pool: ModelPool) -> list[dict[str, Any]]:
    """Known models first (the served one leads), then the cache's servable repos (blocking)."""
    from mlxrt.loading.library import scan_library

    rows, seen = [], set()
    for slot in pool.known():
        if slot.model_id not in seen:
            seen.add(slot.model_id)
            rows.append(_tag(_describe(slot.model_id, slot.source.path, host)))
    for row in scan_library(host).models:
        if row.servable and row.repo_id not in seen:
            seen.add(row.repo_id)
            rows.append(_tag(row))
    return rows


@get("/api/tags", opt=opt(), summary="List local models (Ollama)", tags=["ollama"])
async def list_tags(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"models": await anyio.to_thread.run_sync(_tag_rows, request.app.state.host, pool_of(request))}


def _slot_for(pool: Any, name: str) -> Any:
    """The pool's slot a name answers to without loading it (id, alias, start-up spelling), or ``None``."""
    wanted = pool_name(name) or ""
    names = {"": pool.primary, "default": pool.primary}
    for slot in pool.known():
        names.setdefault(slot.model_id, slot)
        names.setdefault(slot.key, slot)
    for alias, model_id in pool.names().items():
        names.setdefault(alias, next(s for s in pool.known() if s.model_id == model_id))
    return names.get(wanted)


def _show_body(host: Any, model_id: str, path: Path, profile: Any, template: str | None) -> dict[str, Any]:
    row = _describe(model_id, path, host)
    caps = ["completion"]
    context = None
    if profile is not None:
        info = profile.info
        context = info.context_window
        found = capabilities(host, profile)
        caps = ["embedding"] if found.embeddings else ["completion"]
        caps += [c for c, on in (("tools", profile.tool_parser is not None),
                                 ("thinking", profile.thinking_format is not None), ("vision", found.vision)) if on]
    arch = row.model_type or "unknown"
    model_info: dict[str, Any] = {"general.architecture": arch, "general.basename": model_id,
                                  "general.parameter_count": row.params or 0}
    if context:
        model_info[f"{arch}.context_length"] = context
    return {"modelfile": f"# served by mlxrt\nFROM {path}\n", "parameters": "", "template": template or "",
            "details": _details(row), "model_info": model_info, "capabilities": caps,
            "modified_at": created_at(path.stat().st_mtime if path.exists() else None)}


@post("/api/show", status_code=200, opt=opt(NAMED), summary="Show a model (Ollama)", tags=["ollama"])
async def show(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """A model's details, capabilities and chat template, from its files (nothing loads). A
    name nothing here serves is the served model's, as in a chat request, unless the server
    does not fall back (then 404)."""
    host = request.app.state.host
    body = parse_json_object(await request.body())
    name = body.get("model", body.get("name"))  # older clients send "name"
    if not isinstance(name, str) or not name:
        raise InvalidRequest("model is required", param="model")
    pool = pool_of(request)
    slot = _slot_for(pool, name)
    if slot is None:
        from mlxrt.loading.resolve import resolve_model

        try:
            source = None if pool.settings.strict else await anyio.to_thread.run_sync(
                lambda: resolve_model(pool_name(name), allow_download=False))
        except (ModelLoadError, OSError, ValueError):  # no such local model
            source = None
        if source is not None:
            return await anyio.to_thread.run_sync(_show_body, host, source.model_id, source.path, None, None)
        if not pool.settings.fallback:
            raise NotFound(f"model '{name}' not found", param="model", code="model_not_found")
        from mlxrt.model_pool import FALLBACK_KEY

        # an ASGI scope carries extensions' keys; Litestar's TypedDict names the spec's only
        request.scope[FALLBACK_KEY] = name  # type: ignore[literal-required]
        slot = pool.primary
    model = slot.model
    template = getattr(model.tokenizer, "chat_template", None) if model is not None else None
    return await anyio.to_thread.run_sync(_show_body, host, slot.model_id, slot.source.path, slot.profile,
                                          template if isinstance(template, str) else None)


@get("/api/ps", opt=opt(), summary="Resident models (Ollama)", tags=["ollama"])
async def running(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Resident models: ``size`` is what the model holds in memory (its weights), ``expires_at``
    when it unloads if unused (``keep_alive``, else ``--idle-unload``; never: a far-future
    time); mlxrt adds ``lane`` (``serial`` or ``batch``) and ``in_use`` (requests holding it)."""
    pool = pool_of(request)
    out = []
    for slot in pool.resident():
        served = slot.model
        if served is None:  # unloaded since resident() listed it
            continue
        memory = served.memory
        size = memory.weights if memory is not None else 0
        expires = pool.expires_at(slot)
        name = ollama_name(slot.model_id)
        profile = slot.profile
        out.append({"name": name, "model": name, "size": size, "size_vram": 0, "digest": _digest(slot.key),
                    "details": {"parent_model": "", "format": "safetensors",
                                "family": profile.info.model_type if profile is not None else "",
                                "families": None, "parameter_size": "", "quantization_level": ""},
                    "expires_at": NEVER if expires is None else created_at(expires),
                    "context_length": served.context_ceiling or 0,
                    "lane": slot.lane, "in_use": slot.leases})
    return {"models": out}


@get("/api/version", opt=opt(), summary="Ollama API version", tags=["ollama"])
async def version() -> dict[str, str]:
    return {"version": VERSION}


@delete_route("/api/delete", status_code=200, opt=opt(NAMED), summary="Delete a model (Ollama)", tags=["ollama"])
async def delete(request: Request[Any, Any, Any]) -> Response[Any]:
    """Delete a model's repo from the Hugging Face cache (``mlxrt rm``); a resident model is
    refused (400): unload it first (``mlxrt stop``)."""
    from mlxrt.loading.library import delete_repo

    body = parse_json_object(await request.body())
    name = pool_name(body.get("model", body.get("name")))
    if not name:
        raise InvalidRequest("model is required", param="model")
    if pool_of(request).is_loaded(name):
        raise InvalidRequest(f"model '{name}' is loaded: unload it first (mlxrt stop {name})", param="model")
    from huggingface_hub.errors import CacheNotFound

    try:
        await anyio.to_thread.run_sync(delete_repo, name)
    except (ModelLoadError, CacheNotFound):  # not in the cache, or no cache at all
        raise NotFound(f"model '{name}' not found", param="model", code="model_not_found") from None
    return Response(content=None, status_code=200)
