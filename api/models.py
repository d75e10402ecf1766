"""The model that serves a request: the one function every route asks before it renders.

Routes call :func:`model_for` with the body's ``model``; the answer is that model (a
:class:`~mlxrt.serving.ServedModel`, loaded on demand by :class:`mlxrt.model_pool.ModelPool`),
held until the response has been sent. Hooks the route runs through it are given it as their
``model``. Typed errors (404 ``model_not_found``, 400 ``ambiguous_model``, 503, 429) render in
the route's dialect.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from litestar import Request

if TYPE_CHECKING:
    from mlxrt.model_pool import ModelPool
    from mlxrt.serving import ServedModel

__all__ = ["model_for", "pool_of"]


def pool_of(request: Request[Any, Any, Any]) -> ModelPool:
    """The app's model pool (``create_app(host, models)``)."""
    pool: ModelPool = request.app.state.models
    return pool


async def model_for(request: Request[Any, Any, Any], name: Any) -> ServedModel:
    """The model that answers ``name`` (a body's ``model``, any JSON value: ``None``,
    ``default`` or not a string: the served model), loaded if it is not resident. The model is
    held (never evicted) until the response has been sent."""
    scope: MutableMapping[str, Any] = request.scope  # type: ignore[assignment]  # an ASGI scope: extensions' keys too
    return await pool_of(request).model_for(name if isinstance(name, str) else None, scope)
