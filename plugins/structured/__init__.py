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

__all__ = ["mlxrt_capabilities", "mlxrt_prepare_request", "mlxrt_logits_processors"]

def _grammars(host: Any) -> Any:
    """The grammar cache of the model ``host.engine`` serves (kept by the host, one per engine:
    a server may serve several models, and an unloaded model's grammars go with its engine)."""
    from weakref import WeakKeyDictionary

    from mlxrt.plugins.structured.grammar import Grammars

    engine = host.engine
    per_engine = host.plugin_state("structured", WeakKeyDictionary)
    grammars = per_engine.get(engine)
    if grammars is None:
        grammars = per_engine[engine] = Grammars(engine.tokenizer)
    return grammars


@hookimpl
def mlxrt_capabilities() -> list[str]:
    """Output constraints are this plugin's to enforce (:mod:`mlxrt.capabilities`)."""
    from mlxrt.capabilities import STRUCTURED_OUTPUTS

    return [STRUCTURED_OUTPUTS]


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
    return [GrammarProcessor(grammars.matcher(request.structured), grammars.tokenizer.vocab_size,
                             thinking=_thinking_window(request, host))]


def _thinking_window(request: GenerationRequest, host: Any) -> Any:
    """The think block the prompt left open, free of the grammar until it closes (``None``: no
    open block, or a whole-answer grammar such as a forced tool call, which closes it itself).
    An answer that would open its own block (Qwen3) is held to the format from its first token:
    letting it open one would let a model that never closes it escape the format."""
    from mlxrt.plugins.structured.grammar import ThinkingWindow
    from mlxrt.text.tool_calls import reasoning_lead

    engine = host.engine
    fmt = engine.profile.thinking_format
    if fmt is None or request.structured.kind == "lark" or not fmt.close:
        return None
    tokenizer = engine.tokenizer
    if not reasoning_lead(engine.profile, tokenizer, request.prompt_ids):
        return None
    return ThinkingWindow(close_ids=tuple(tokenizer.encode(fmt.close, add_special_tokens=False)))
