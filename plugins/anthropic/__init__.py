"""The Anthropic Messages dialect (``POST /v1/messages``, ``/v1/messages/count_tokens``).

Registered through the ``mlxrt`` entry point ``anthropic`` like any third-party dialect.
Claude Code runs against it with ``ANTHROPIC_BASE_URL`` (docs/dialects.md). Its
``mlxrt_prompt_canonicalize`` strips Claude Code's per-request billing header line so an
agent loop keeps hitting the prompt cache. Route modules import Litestar, so they load only
when the app is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mlxrt import GenerationRequest, hookimpl
from mlxrt.host import PluginHost

if TYPE_CHECKING:
    from mlxrt.serving import ServedModel

MLXRT_PLUGIN_KIND = "dialect"


@hookimpl
def mlxrt_routes(host: PluginHost) -> Sequence[Any]:
    from mlxrt.plugins.anthropic.routes import ROUTES

    return list(ROUTES)


@hookimpl
def mlxrt_prompt_canonicalize(request: GenerationRequest, dialect: str, model: ServedModel) -> GenerationRequest | None:
    if dialect != "anthropic":
        return None
    from mlxrt.plugins.anthropic.canonical import canonical_request

    return canonical_request(request, model.tokenizer)
