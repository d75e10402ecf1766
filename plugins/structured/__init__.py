"""Built-in plugin: structured outputs, enforced by a grammar while decoding.

The dialects turn ``response_format`` (OpenAI), ``text.format`` (Responses) and a forced
tool's ``input_schema`` (Anthropic) into :attr:`mlxrt.records.GenerationRequest.structured`.
This plugin compiles the constraint off the engine thread (``mlxrt_prepare_request``, cached
per canonical schema) and masks each row's logits with it (``mlxrt_logits_processors``), so
a constrained request runs in the batch lane like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxrt import hookimpl
from mlxrt.records import GenerationRequest, LogitsProcessor, ModelInfo

__all__ = ["mlxrt_prepare_request", "mlxrt_logits_processors"]

#: One grammar cache per served tokenizer (one model per server; the key keeps a test that
#: builds several servers in one process from mixing tokenizers).
_GRAMMARS: dict[int, Any] = {}


def _grammars(host: Any) -> Any:
    from mlxrt.plugins.structured.grammar import Grammars

    tokenizer = host.engine.tokenizer
    found = _GRAMMARS.get(id(tokenizer))
    if found is None or found[0] is not tokenizer:
        found = _GRAMMARS[id(tokenizer)] = (tokenizer, Grammars(tokenizer))
    return found[1]


@hookimpl
def mlxrt_prepare_request(request: GenerationRequest, host: Any) -> None:
    """Compile (or find cached) the request's grammar: its errors are the client's 400."""
    if request.structured is not None:
        _grammars(host).matcher(request.structured)


@hookimpl
def mlxrt_logits_processors(request: GenerationRequest, info: ModelInfo, host: Any) -> Sequence[LogitsProcessor]:
    if request.structured is None:
        return []
    from mlxrt.plugins.structured.grammar import GrammarProcessor

    grammars = _grammars(host)
    return [GrammarProcessor(grammars.matcher(request.structured), grammars.tokenizer.vocab_size)]
