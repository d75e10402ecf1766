"""The model an Ollama request names, chosen through the model pool with the client's
``keep_alive`` applied to it, and timed (``load_duration``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from litestar import Request

from mlxrt.api.models import model_for, pool_of

if TYPE_CHECKING:
    from mlxrt.serving import ServedModel

__all__ = ["chosen"]


async def chosen(request: Request[Any, Any, Any], model: str | None, keep_alive: float | None
                 ) -> tuple[ServedModel, int]:
    """The model serving ``model`` (:func:`mlxrt.api.models.model_for`) and the nanoseconds it
    took (a load, when it was not resident); the client's ``keep_alive`` applies to that model
    from now on (``None``: the pool's rule, ``--idle-unload``, as Ollama's own default applies
    to a request that sends none)."""
    started = time.monotonic_ns()
    served = await model_for(request, model)
    loaded = time.monotonic_ns() - started
    pool_of(request).keep_alive(served, keep_alive)
    return served, loaded
