"""The model library endpoints: ``GET /library``, ``GET /fit`` and ``GET /downloads``.

A built-in endpoint plugin, registered through the ``mlxrt`` entry point ``library`` like a
third-party one (``--disable-plugin library`` turns the endpoints off). The route module
imports Litestar, so it loads only when the app is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxrt import hookimpl
from mlxrt.host import PluginHost

MLXRT_PLUGIN_KIND = "endpoint"


@hookimpl
def mlxrt_routes(host: PluginHost) -> Sequence[Any]:
    from mlxrt.plugins.library.routes import ROUTES

    return list(ROUTES)
