"""The host that serves a request's ``model``: what a dialect route asks before it renders.

Routes call :func:`host_for` with the body's ``model``; the returned host's ``model`` (a
:class:`~mlxrt.serving.ServedModel`) is that model (loaded on demand by
:class:`mlxrt.model_pool.ModelPool`), and every hook the route runs with it sees that model.
Typed errors (404 ``model_not_found``, 503, 429) render in the route's dialect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar import Request

if TYPE_CHECKING:
    from mlxrt.host import PluginHost
    from mlxrt.model_pool import ModelHost

__all__ = ["host_for"]


async def host_for(request: Request, model: Any) -> PluginHost | ModelHost:
    """The plugin host whose ``model`` answers ``model`` (a body's ``model``, any JSON value:
    ``None``/``default``/not a string: the served model). The model is held (never evicted)
    until the response has been sent."""
    host: PluginHost = request.app.state.host
    pool = host.models
    if pool is None:  # an app built around a bare engine (tests of single pieces)
        return host
    return await pool.host_for(model if isinstance(model, str) else None, request.scope)
