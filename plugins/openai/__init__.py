"""The OpenAI dialect: chat and text completions, embeddings and models, as a plugin.

Registered through the ``mlxrt`` entry point ``openai`` like any third-party dialect; its
routes arrive through :func:`mlxrt_routes`. Route modules import Litestar, so they load only
when the app is built, not when ``mlxrt plugins`` lists plugins.
"""

from __future__ import annotations

from mlxrt import hookimpl

MLXRT_PLUGIN_KIND = "dialect"


@hookimpl
def mlxrt_routes(host):  # noqa: ANN001, ANN201 - hook signature documented in mlxrt.hookspecs
    from mlxrt.plugins.openai.routes import ROUTES

    return list(ROUTES)
