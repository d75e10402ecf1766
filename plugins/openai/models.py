"""OpenAI model routes: ``GET /v1/models`` and ``GET /v1/models/{id}``.

The list is the served model first (with mlxrt's ``context_window``, Anthropic's Models API fields
``max_input_tokens``/``max_tokens``/``display_name``/``created_at``, the ``reasoning`` flag, its
capabilities as :func:`mlxrt.capabilities.capabilities` states them — ``vision``,
``structured_outputs``, ``embeddings`` —, the ``family`` plugin and ``tier`` — ``family`` or
``generic`` — and the load-time ``self_test`` result per capability), then one row per servable model repo in the local Hugging Face cache: a
model repo whose ``refs/main`` snapshot has a ``config.json`` with a ``model_type`` and
safetensors weights, i.e. what ``mlxrt serve ORG/NAME`` would load without a download.
Listing never downloads; a missing or unreadable cache lists the served model alone.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
from litestar import Request, get

from mlxrt.api.models import pool_of
from mlxrt.capabilities import capabilities
from mlxrt.errors import EngineError, NotFound
from mlxrt.loading.paths import hf_cache_dir
from mlxrt.plugins.openai.encode import ROUTE_OPT
from mlxrt.records import ModelInfo
from mlxrt.serving import ServedModel

__all__ = ["list_models", "get_model", "codex_catalog", "cached_model_rows"]

log = logging.getLogger("mlxrt.openai")

#: Route options every OpenAI handler carries: errors render as OpenAI error objects.


def _servable(snapshot: Path) -> dict[str, Any] | None:
    """The snapshot's config when it is a model mlxrt can load (config + safetensors)."""
    try:
        config = json.loads((snapshot / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        return None
    if not any(snapshot.glob("*.safetensors")):
        return None
    return config


def cached_model_rows(cache_dir: Path | None = None) -> list[dict[str, Any]]:
    """One OpenAI model row per servable repo in the HF cache (its ``refs/main`` snapshot), by id."""
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(cache_dir or hf_cache_dir())
    except Exception as exc:  # no cache, not a folder, unreadable: nothing to list
        log.debug("no Hugging Face cache to list: %s", exc)
        return []
    rows = []
    for repo in info.repos:
        main = repo.refs.get("main") if repo.repo_type == "model" else None
        if main is None:
            continue
        config = _servable(main.snapshot_path)
        if config is None:
            continue
        row: dict[str, Any] = {"id": repo.repo_id, "object": "model", "created": int(main.last_modified),
                               "owned_by": repo.repo_id.split("/")[0] if "/" in repo.repo_id else "huggingface"}
        window = config.get("max_position_embeddings") or (config.get("text_config") or {}).get(
            "max_position_embeddings")
        if isinstance(window, int):
            row["context_window"] = window
        rows.append(row)
    return sorted(rows, key=lambda r: r["id"])


def _served_row(request: Request[Any, Any, Any]) -> dict[str, Any]:
    host = request.app.state.host
    pool = pool_of(request)
    # The served model's row, also while another model is swapped in (its profile outlives its engine).
    profile = pool.primary.profile
    if profile is None:  # loaded at start (ModelPool.load_at_start): never the case while serving
        raise EngineError("the served model was never loaded")
    info = profile.info
    caps = capabilities(host, profile)
    model = pool.primary.model
    created = int(host.options.get("started_at") or time.time())
    return {
        "id": info.model_id,
        "object": "model",
        "created": created,
        "owned_by": "mlxrt",
        "context_window": info.context_window,
        **_limits(model, info, host.options, created),
        "reasoning": profile.thinking_format is not None,
        "vision": caps.vision,
        "structured_outputs": caps.structured_outputs,
        "embeddings": caps.embeddings,
        "tools": profile.tool_parser is not None,
        "family": profile.family,
        "tier": profile.tier,
        "self_test": dict(profile.self_test),
    }


def _limits(model: ServedModel | None, info: ModelInfo, options: Mapping[str, Any], created: int) -> dict[str, Any]:
    """What clients read to size their prompts and answers (docs/dialects.md, "What clients learn
    about the model"): Anthropic's Models API fields (``type``, ``display_name``, ``created_at``,
    ``max_input_tokens`` — the context a request may fill, the window capped by the memory
    budget —, ``max_tokens`` — the most one answer may generate: ``--max-tokens`` when set,
    within that context)."""
    ceiling = model.context_ceiling if model is not None else info.context_window
    cap = options.get("max_tokens")
    output = min(cap, ceiling) if isinstance(cap, int) and cap > 0 and ceiling else (cap or ceiling)
    return {"type": "model", "display_name": info.model_id,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
            "max_input_tokens": ceiling, "max_tokens": output}


def _pool_rows(request: Request[Any, Any, Any], served: dict[str, Any]) -> list[dict[str, Any]]:
    """The served model's ``loaded`` flag set; rows for the other models the server knows
    (resident, ``--preload``, ``--model-alias`` targets) and one per alias name."""
    pool = pool_of(request)
    served["loaded"] = pool.is_loaded(served["id"])
    rows: list[dict[str, Any]] = []
    created = served["created"]
    for slot in pool.known():
        if slot.model_id == served["id"]:
            continue
        row = {"id": slot.model_id, "object": "model", "created": created, "owned_by": "mlxrt",
               "loaded": slot.state == "ready"}
        if slot.profile is not None:  # loaded at least once
            row["context_window"] = slot.profile.info.context_window
            row["family"] = slot.profile.family
        rows.append(row)
    for alias, model_id in pool.names().items():
        rows.append({"id": alias, "object": "model", "created": created, "owned_by": "mlxrt",
                     "alias_of": model_id, "loaded": pool.is_loaded(model_id)})
    return rows


async def _model_rows(request: Request[Any, Any, Any]) -> list[dict[str, Any]]:
    served = _served_row(request)
    known = _pool_rows(request, served)
    pool = pool_of(request)
    if pool.settings.strict:
        cached = []  # a strict server names nothing from the disk: only what it serves
    else:
        cached = await anyio.to_thread.run_sync(cached_model_rows)  # stats every cached file: off the loop
    listed = {served["id"], *(row["id"] for row in known)}
    return [served, *known, *({**row, "loaded": False} for row in cached if row["id"] not in listed)]


@get(["/v1/models", "/models"], opt=ROUTE_OPT, summary="List models", tags=["openai"])
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"object": "list", "data": await _model_rows(request)}


@get(["/v1/models/{model_id:path}"], opt=ROUTE_OPT, summary="Retrieve a model", tags=["openai"])
async def get_model(request: Request[Any, Any, Any]) -> dict[str, Any]:
    wanted = str(request.path_params["model_id"]).lstrip("/")
    served = _served_row(request)
    if served["id"] == wanted:  # no cache scan for the common case
        _pool_rows(request, served)
        return served
    for row in await _model_rows(request):
        if row["id"] == wanted:
            return row
    if pool_of(request).settings.fallback:
        # The served model answers this name in a request (docs/dialects.md, "Model names"):
        # its row, and the header that names what was asked for. Nothing is loaded here.
        from mlxrt.model_pool import FALLBACK_KEY

        # an ASGI scope carries extensions' keys; Litestar's TypedDict names the spec's only
        request.scope[FALLBACK_KEY] = wanted  # type: ignore[literal-required]
        _pool_rows(request, served)
        return served
    raise NotFound(f"model {wanted!r} not found: it is neither the served model nor a servable model "
                   f"in the local Hugging Face cache", param="model", code="model_not_found")


#: The instructions Codex sends as the system prompt for a model of a ``model_catalog_json``
#: (the catalog must carry some). Short: Codex's own run to thousands of tokens, more than a small
#: local model's whole context (the embedded SmolLM2 has 8,192).
CODEX_INSTRUCTIONS = ("You are a coding agent running in the Codex CLI on the user's computer. Use the shell "
                      "tool to inspect and change files; keep answers short.")


@get(["/codex/model-catalog"], opt=ROUTE_OPT, summary="The served model as a Codex model catalog",
     tags=["openai"])
async def codex_catalog(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """A file for Codex's ``model_catalog_json`` (docs/dialects.md, "Codex"): Codex reads model
    metadata (context window, tools, instructions) from its built-in catalog or that file, never
    from the server, and warns "Model metadata for `default` not found" for any other name. One
    entry per name that reaches the served model: ``default``, its id and the aliases of it."""
    served = _served_row(request)
    names = ["default", served["id"], *(a for a, m in pool_of(request).names().items() if m == served["id"])]
    window = served["max_input_tokens"]
    entry = {"display_name": served["id"], "description": f"{served['id']} served by mlxrt",
             **({"context_window": window, "max_context_window": window} if window else {}),
             "supported_reasoning_levels": [], "shell_type": "shell_command", "visibility": "list",
             "supported_in_api": True, "priority": 1, "support_verbosity": False,
             # a tool's output Codex keeps in the prompt: an eighth of the context
             "truncation_policy": {"mode": "tokens", "limit": max(window // 8, 256) if window else 10_000},
             "experimental_supported_tools": [], "input_modalities": ["text", "image"] if served["vision"] else
             ["text"], "supports_parallel_tool_calls": False, "base_instructions": CODEX_INSTRUCTIONS}
    return {"models": [{"slug": name, **entry} for name in dict.fromkeys(names)]}
