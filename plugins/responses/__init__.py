"""The OpenAI Responses dialect (``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``).

Registered through the ``mlxrt`` entry point ``responses``. Codex runs against it
(docs/dialects.md). Stored responses live in a per-app :class:`ResponseStore` (TTL and a byte
cap, ``--response-store-ttl`` / ``--response-store-bytes``), which ``previous_response_id``
resumes from. Route modules import Litestar, so they load only when the app is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxrt import hookimpl
from mlxrt.host import PluginHost

MLXRT_PLUGIN_KIND = "dialect"


@hookimpl
def mlxrt_routes(host: PluginHost) -> Sequence[Any]:
    from mlxrt.plugins.responses.routes import ROUTES

    return list(ROUTES)


@hookimpl
def mlxrt_serve_options() -> Sequence[Any]:
    import click

    return [
        click.Option(["--response-store-ttl"], type=click.FloatRange(min=1), default=3600.0, show_default=True,
                     help="Responses API: seconds a stored response stays resumable (previous_response_id)."),
        click.Option(["--response-store-bytes"], type=click.IntRange(min=1), default=32 * 1024 * 1024,
                     show_default=True, help="Responses API: byte cap of the response store, per API key (LRU beyond it)."),
    ]
