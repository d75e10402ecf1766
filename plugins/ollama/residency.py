"""The model an Ollama request names, chosen through the model pool with the client's
``keep_alive`` applied to it, and timed (``load_duration``)."""

from __future__ import annotations

import time
from typing import Any

from litestar import Request

from mlxrt.api.models import host_for

__all__ = ["chosen"]


async def chosen(request: Request, model: str | None, keep_alive: float | None) -> tuple[Any, int]:
    """The host serving ``model`` and the nanoseconds it took (a load, when it was not resident);
    the client's ``keep_alive`` applies to that model from now on (``None``: the pool's rule,
    ``--idle-unload``, as Ollama's own default applies to a request that sends none)."""
    started = time.monotonic_ns()
    host = await host_for(request, model)
    loaded = time.monotonic_ns() - started
    pool = request.app.state.host.models
    if pool is not None:
        pool.keep_alive(host, keep_alive)
    return host, loaded
