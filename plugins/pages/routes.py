"""Route handlers of the pages plugin: the two pages, their static assets, the status JSON the
status panel reads besides ``/stats``, and the curve designer's sampling endpoint.

The pages and assets are public (no API key: a browser must be able to load the page that asks
for the key); the JSON endpoints go through the server's key guard like every other route.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from importlib import resources
from typing import Any

import anyio
from litestar import Request, Response, get, post

from mlxrt.api.models import model_for
from mlxrt.api.wire import parse_json_object
from mlxrt.errors import InvalidRequest, NotFound
from mlxrt.records import LoadedModel
from mlxrt.serving import ServedModel

__all__ = ["ROUTES", "ASSETS"]

_STATIC = resources.files("mlxrt.plugins.pages")
#: Every asset the pages load, by file name → media type (nothing else is served).
ASSETS = {
    "pages.css": "text/css",
    "common.js": "text/javascript",
    "chat.js": "text/javascript",
    "status.js": "text/javascript",
    "curves.js": "text/javascript",
}
_PAGE_OPT = {"public": True}
_NO_CACHE = {"Cache-Control": "no-cache"}


def _html(name: str) -> Response[Any]:
    return Response(content=(_STATIC / name).read_bytes(), media_type="text/html",
                    headers=_NO_CACHE)


@get("/", summary="Chat and status page", tags=["pages"], include_in_schema=False, opt=_PAGE_OPT)
async def index_page() -> Response[Any]:
    return _html("index.html")


@get("/curves", summary="Curve designer page", tags=["pages"], include_in_schema=False, opt=_PAGE_OPT)
async def curves_page() -> Response[Any]:
    return _html("curves.html")


@get("/pages/assets/{name:str}", summary="A page asset", tags=["pages"], include_in_schema=False,
     opt=_PAGE_OPT)
async def asset(request: Request[Any, Any, Any]) -> Response[Any]:
    name = str(request.path_params["name"])
    media = ASSETS.get(name)
    if media is None:
        raise NotFound(f"no page asset named {name!r}")
    return Response(content=(_STATIC / name).read_bytes(), media_type=media, headers=_NO_CACHE)


@get("/pages/status", summary="Model capabilities, plugins and server settings", tags=["pages"])
async def status(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """What the status panel shows beside ``/stats``: the served model's capabilities, every
    plugin the host saw (loaded, failed or disabled, with its kind and hooks), and the sampling
    settings the server was started with."""
    host = request.app.state.host
    model = await model_for(request, None)  # the served model
    info, profile = model.info, model.profile
    caps = model.capabilities
    options = host.options
    return {
        "model": {
            "id": info.model_id, "model_type": info.model_type, "source": info.source,
            "family": profile.family, "tier": profile.tier,
            "context_window": info.context_window, "context_ceiling": model.context_ceiling,
            "capabilities": {
                "reasoning": profile.thinking_format is not None,
                "tools": profile.tool_parser is not None,
                "vision": caps.vision,
                "structured_outputs": caps.structured_outputs,
                "embeddings": caps.embeddings,
                "chat_template": getattr(model.tokenizer, "chat_template", None) is not None,
            },
            "self_test": dict(profile.self_test),
            "provenance": dict(profile.provenance),
        },
        "plugins": [
            {"name": r.name, "status": r.status, "kind": r.kind, "dist": r.dist, "version": r.version,
             "builtin": r.builtin, "hooks": list(r.hooks), "error": r.error}
            for r in host.records.values()
        ],
        "route_conflicts": list(host.route_conflicts),
        "sampling_options": {k: options.get(k) for k in ("temp", "top_p", "top_k", "min_p", "max_tokens")},
    }


def _tokenizer(model: ServedModel) -> Callable[[str, bool], list[int]]:
    def tokenize(prompt: str, chat: bool) -> list[int]:
        if not chat:
            return list(model.tokenizer.encode(prompt, add_special_tokens=True))
        from mlxrt.records import ChatInput

        return list(model.render(ChatInput(messages=({"role": "user", "content": prompt},))).ids)

    return tokenize


@post("/v1/curves/sample", status_code=200, summary="Sample a prompt with a curve and with a recipe",
      tags=["pages"])
async def curve_sample(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """N completions of one prompt under a curve and under a plain recipe, side by side, and
    the next-token distribution of the model, the curve and the recipe (docs/pages.md).

    Runs as one raw job on the engine worker, between decode steps (never beside one)."""
    from mlxrt.plugins.pages.designer import DesignResult, parse_design, run_design

    model = await model_for(request, None)  # the served model
    if model.kind != "autoregressive":
        raise InvalidRequest(f"the curve designer needs an autoregressive model; {model.info.model_id} "
                             f"is served by the {model.kind} engine")
    body = parse_json_object(await request.body())
    tokenize = _tokenizer(model)
    design = await anyio.to_thread.run_sync(parse_design, body, tokenize)
    ceiling = model.context_ceiling
    if ceiling is not None and len(design.prompt_ids) + design.max_tokens > ceiling:
        raise InvalidRequest(f"prompt ({len(design.prompt_ids)} tokens) + max_tokens ({design.max_tokens}) is "
                             f"over the {ceiling}-token context this server allows", param="prompt",
                             code="context_length_exceeded")
    adapters = model.adapters

    def job(loaded: LoadedModel) -> DesignResult:
        # The base model: no adapter rows (a batch step's selection must not leak in here).
        with adapters.select(()) if adapters is not None else contextlib.nullcontext():
            return run_design(loaded, design)

    result: DesignResult = await model.call(job)
    return result.as_dict(design, model.info.model_id)


ROUTES = (index_page, curves_page, asset, status, curve_sample)
