"""Ollama's API as a dialect (``/api/chat``, ``/api/generate``, ``/api/tags``, ``/api/show``,
``/api/ps``, ``/api/embed``, ``/api/embeddings``, ``/api/version``, ``/api/pull``,
``/api/delete``) on the same port as the other dialects.

Registered through the ``mlxrt`` entry point ``ollama`` like any third-party dialect: the chat
and generate routes are :func:`mlxrt.api.pipeline.serve_chat` (``serve_text`` for ``raw``
prompts) with Ollama's wire shapes, so the prompt cache, batching, cancellation, keys and
limits behave as on every API (docs/dialects.md, "Ollama"). Route modules import Litestar, so
they load only when the app is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxrt import hookimpl
from mlxrt.host import PluginHost

MLXRT_PLUGIN_KIND = "dialect"


@hookimpl
def mlxrt_routes(host: PluginHost) -> Sequence[Any]:
    from mlxrt.plugins.ollama.routes import ROUTES

    return list(ROUTES)
