"""Route handlers of the adapters plugin.

Mount and unmount run on the engine's worker between decode steps (``ServedModel.call``), so no
array is changed or freed under a running step. Folder scans run off the event loop. An
adapter belongs to the caller that mounted it (:func:`mlxrt.api.auth.caller_of`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from litestar import Request, delete, get, post
from litestar.params import PathParameter

from mlxrt.api.auth import caller_of
from mlxrt.api.models import model_for
from mlxrt.errors import EngineError, InvalidRequest
from mlxrt.serving import ServedModel

if TYPE_CHECKING:
    from mlxrt.engine.adapters import AdapterRegistry

__all__ = ["ROUTES", "list_adapters", "available_adapters", "mount_adapter", "unmount_adapter"]


async def _served(request: Request[Any, Any, Any]) -> tuple[ServedModel, AdapterRegistry]:
    """The served model (:func:`mlxrt.api.models.model_for`: loaded again if it was unloaded)
    and its adapters, which are mounted on it."""
    model = await model_for(request, None)
    adapters = model.adapters
    if adapters is None:
        raise EngineError(f"model {model.info.model_id!r} cannot mount adapters")
    return model, adapters


@get("/v1/adapters", summary="Mounted LoRA adapters", tags=["adapters"])
async def list_adapters(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Every adapter the caller may use (its own mounts and the server's: id, path, rank, scale,
    layers) and the server's default."""
    _, adapters = await _served(request)
    return {"adapters": [a.describe() for a in adapters.list(caller_of(request))],
            "default": "+".join(adapters.default) or None}


@get("/v1/adapters/available", summary="Adapter folders found on disk", tags=["adapters"])
async def available_adapters(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Adapter folders (adapter_config.json + adapters.safetensors) directly under the
    ``--adapter-dir`` folders and beside the ``--adapter`` folder; ``mounted`` is the id a
    folder is mounted under, ``error`` why it cannot be mounted."""
    _, adapters = await _served(request)
    found = await anyio.to_thread.run_sync(adapters.available, caller_of(request))
    return {"adapters": found}


@post("/v1/adapters", summary="Mount a LoRA adapter", tags=["adapters"], status_code=200)
async def mount_adapter(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Mount ``{"id", "path"}`` (an mlx-lm adapter folder); the base model never reloads."""
    model, _ = await _served(request)
    try:
        body = json.loads(await request.body())
    except (ValueError, RecursionError):  # RecursionError: nested too deeply for the parser
        raise InvalidRequest("invalid JSON body") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object {\"id\", \"path\"}")
    path = body.get("path")
    if not isinstance(path, str) or not path:
        raise InvalidRequest("path (an adapter folder, a string) is required", param="path")
    adapter_id = body.get("id")
    if adapter_id is None:
        from mlxrt.engine.adapters import adapter_id_for

        adapter_id = adapter_id_for(path)
    if not isinstance(adapter_id, str):
        raise InvalidRequest("id must be a string", param="id")
    return await model.mount_adapter(adapter_id, path, caller_of(request))


@delete("/v1/adapters/{adapter_id:str}", summary="Unmount a LoRA adapter", tags=["adapters"], status_code=200)
async def unmount_adapter(request: Request[Any, Any, Any], adapter_id: Annotated[str, PathParameter()]) -> dict[str, Any]:
    """Unmount the caller's own adapter; requests already running with it finish with it. 404
    if the caller has none mounted under that id."""
    model, _ = await _served(request)
    return await model.unmount_adapter(adapter_id, caller_of(request))


ROUTES = (list_adapters, available_adapters, mount_adapter, unmount_adapter)
