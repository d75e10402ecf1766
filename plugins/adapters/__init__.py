"""The LoRA adapter endpoints: ``GET /v1/adapters``, ``GET /v1/adapters/available``,
``POST /v1/adapters`` and ``DELETE /v1/adapters/{id}``.

A built-in endpoint plugin, registered through the ``mlxrt`` entry point ``adapters`` like a
third-party one (``--disable-plugin adapters`` turns the endpoints off; requests may still
select adapters mounted with ``--adapter``). The route module imports Litestar, so it loads
only when the app is built. The adapters themselves live in :mod:`mlxrt.engine.adapters`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxrt import hookimpl
from mlxrt.host import PluginHost

MLXRT_PLUGIN_KIND = "endpoint"


@hookimpl
def mlxrt_routes(host: PluginHost) -> Sequence[Any]:
    from mlxrt.plugins.adapters.routes import ROUTES

    return list(ROUTES)
