"""The pages people look at: the chat + status page (``/``) and the curve designer (``/curves``).

A built-in endpoint plugin (entry point ``pages``; ``--disable-plugin pages`` removes the pages
and the designer's endpoint). The pages are static HTML, CSS and plain JavaScript shipped in the
package (package data beside this module): no CDN, no framework, no build step. They talk to the server's own JSON
endpoints (``/v1/chat/completions``, ``/stats``, ``/v1/models``, ``/pages/status``,
``/v1/curves/sample``); docs/pages.md describes them. The route module imports Litestar, so it
loads only when the app is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxrt import hookimpl
from mlxrt.host import PluginHost

MLXRT_PLUGIN_KIND = "endpoint"


@hookimpl
def mlxrt_routes(host: PluginHost) -> Sequence[Any]:
    from mlxrt.plugins.pages.routes import ROUTES

    return list(ROUTES)
