"""The host that serves a request's ``model``: what a dialect route asks before it renders.

Routes call :func:`host_for` with the body's ``model``; the returned host's ``engine`` is that
model's (loaded on demand by :class:`mlxrt.model_pool.ModelPool`), and every hook the route
runs with it sees that engine. Typed errors (404 ``model_not_found``, 503, 429) render in the
route's dialect.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

__all__ = ["host_for"]


async def host_for(request: Request, model: Any) -> Any:
    """The plugin host whose ``engine`` answers ``model`` (``None``/``default``: the served
    model). The model is held (never evicted) until the response has been sent."""
    host = request.app.state.host
    pool = host.models
    if pool is None:  # an app built around a bare engine (tests of single pieces)
        return host
    return await pool.host_for(model if isinstance(model, str) else None, request.scope)
