"""OpenAI model routes: ``GET /v1/models`` and ``GET /v1/models/{id}``."""

from __future__ import annotations

import time
from typing import Any

from litestar import Request, get

from mlxrt.api.errors import openai_error_body
from mlxrt.errors import NotFound

__all__ = ["OPT", "list_models", "get_model"]

#: Route options every OpenAI handler carries: errors render as OpenAI error objects.
OPT = {"dialect": "openai", "render_error": openai_error_body}


def _model_rows(request: Request) -> list[dict[str, Any]]:
    host = request.app.state.host
    engine = host.engine
    info = engine.info
    return [{
        "id": info.model_id,
        "object": "model",
        "created": int(host.options.get("started_at") or time.time()),
        "owned_by": "mlxrt",
        "context_window": info.context_window,
        "reasoning": engine.profile.thinking_format is not None,
        "vision": engine.profile.vision is not None,
    }]


@get(["/v1/models", "/models"], opt=OPT, summary="List models", tags=["openai"])
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": _model_rows(request)}


@get(["/v1/models/{model_id:path}"], opt=OPT, summary="Retrieve a model", tags=["openai"])
async def get_model(request: Request) -> dict[str, Any]:
    wanted = str(request.path_params["model_id"]).lstrip("/")
    for row in _model_rows(request):
        if row["id"] == wanted:
            return row
    raise NotFound(f"model {wanted!r} is not served here", param="model", code="model_not_found")
