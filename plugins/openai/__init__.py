"""The OpenAI dialect: chat and text completions, embeddings and models, as a plugin.

Registered through the ``mlxrt`` entry point ``openai`` like any third-party dialect; its
routes arrive through :func:`mlxrt_routes`. Route modules import Litestar, so they load only
when the app is built, not when ``mlxrt plugins`` lists plugins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxrt import hookimpl
from mlxrt.host import PluginHost

MLXRT_PLUGIN_KIND = "dialect"


@hookimpl
def mlxrt_routes(host: PluginHost) -> Sequence[Any]:
    from mlxrt.plugins.openai.routes import ROUTES

    return list(ROUTES)
