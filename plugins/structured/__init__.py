"""Built-in plugin: structured outputs, enforced by a grammar while decoding.

The dialects turn ``response_format`` (OpenAI), ``text.format`` (Responses) and a forced
tool's ``input_schema`` (Anthropic) into :attr:`mlxrt.records.GenerationRequest.structured`.
This plugin compiles the constraint off the engine thread (``mlxrt_prepare_request``, within
the limits of :mod:`.limits`, cached per canonical schema under a byte budget: :mod:`.cache`)
and masks each row's logits with it (``mlxrt_logits_processors``), so a constrained request
runs in the batch lane like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mlxrt import hookimpl
from mlxrt.records import GenerationRequest, LogitsProcessor, ModelInfo, StructuredOutput

if TYPE_CHECKING:
    from mlxrt.registry import PluginHost
    from mlxrt.serving import ServedModel

__all__ = ["mlxrt_capabilities", "mlxrt_serve_options", "mlxrt_prepare_request", "mlxrt_logits_processors",
           "GrammarState"]


class GrammarState:
    """What the plugin keeps for the server's life (``host.plugin_state("structured")``): the
    compiled-grammar cache, one byte budget for every model, each loaded tokenizer's
    :class:`~.grammar.Grammars` (an unloaded model's go with its tokenizer), and the matchers
    prepared for requests not yet admitted (so admission, on the engine thread, never compiles
    one again should the cache have dropped its grammar meanwhile)."""

    #: Prepared matchers kept for requests not admitted yet (a request that never is, its
    #: client gone, is forgotten past it, oldest first).
    PREPARED_KEPT = 256

    def __init__(self, budget_mb: int) -> None:
        import threading
        from collections import OrderedDict
        from weakref import WeakKeyDictionary

        from mlxrt.plugins.structured.cache import GrammarCache

        self.cache = GrammarCache(budget_mb * 2**20)
        self.per_tokenizer: WeakKeyDictionary[Any, Any] = WeakKeyDictionary()
        self._prepared: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def keep_prepared(self, request_id: str, matcher: Any) -> None:
        with self._lock:
            self._prepared[request_id] = matcher
            while len(self._prepared) > self.PREPARED_KEPT:
                self._prepared.popitem(last=False)

    def take_prepared(self, request_id: str) -> Any:
        """The matcher prepared for ``request_id`` (``None``: none, or forgotten)."""
        with self._lock:
            return self._prepared.pop(request_id, None)

    def stats(self) -> dict[str, int]:
        """``/stats``' ``grammars``: the cache's entries, bytes, budget and evictions."""
        return self.cache.stats()


def _state(host: PluginHost) -> GrammarState:
    from mlxrt.plugins.structured.cache import DEFAULT_BUDGET_MB

    state: GrammarState = host.plugin_state("structured", lambda: GrammarState(
        int(host.options.get("grammar_cache_mb") or DEFAULT_BUDGET_MB)))
    return state


def _grammars(host: PluginHost, model: ServedModel) -> Any:
    """The grammars of ``model`` (one set per tokenizer: models that share one share them)."""
    from mlxrt.plugins.structured.grammar import Grammars

    state = _state(host)
    tokenizer = model.tokenizer
    grammars = state.per_tokenizer.get(tokenizer)
    if grammars is None:
        grammars = state.per_tokenizer[tokenizer] = Grammars(tokenizer, state.cache)
    return grammars


@hookimpl
def mlxrt_capabilities() -> list[str]:
    """Output constraints are this plugin's to enforce (:mod:`mlxrt.capabilities`)."""
    from mlxrt.capabilities import STRUCTURED_OUTPUTS

    return [STRUCTURED_OUTPUTS]


@hookimpl
def mlxrt_serve_options() -> Sequence[Any]:
    import click

    from mlxrt.plugins.structured.cache import DEFAULT_BUDGET_MB

    return [click.Option(["--grammar-cache-mb"], type=click.IntRange(min=1), default=DEFAULT_BUDGET_MB,
                         show_default=True, help="Structured outputs: memory budget of compiled grammars, "
                         "all models together (least recently used out beyond it; /stats: grammars).")]


@hookimpl
def mlxrt_prepare_request(request: GenerationRequest, host: PluginHost, model: ServedModel) -> None:
    """Compile (or find cached) the request's grammar: its errors are the client's 400. The
    matcher is kept for the request's admission (:func:`mlxrt_logits_processors`)."""
    if request.structured is not None:
        _state(host).keep_prepared(request.request_id, _grammars(host, model).matcher(request.structured))


@hookimpl
def mlxrt_logits_processors(request: GenerationRequest, info: ModelInfo, host: PluginHost,
                            model: ServedModel | None) -> Sequence[LogitsProcessor]:
    if request.structured is None:
        return []
    if model is None:  # an engine run without a served model (unit tests): nothing to compile for
        raise RuntimeError("structured outputs need the served model")
    from mlxrt.plugins.structured.grammar import GrammarProcessor

    grammars = _grammars(host, model)
    matcher = _state(host).take_prepared(request.request_id)
    if matcher is None:  # another choice of the request, or forgotten: a copy from the cache
        matcher = grammars.matcher(request.structured)
    return [GrammarProcessor(matcher, grammars.tokenizer.vocab_size,
                             thinking=_thinking_window(request, request.structured, model))]


def _thinking_window(request: GenerationRequest, structured: StructuredOutput, model: ServedModel) -> Any:
    """The think block the prompt left open, free of the grammar until it closes (``None``: no
    open block, or a whole-answer grammar such as a forced tool call, which closes it itself).
    An answer that would open its own block (Qwen3) is held to the format from its first token:
    letting it open one would let a model that never closes it escape the format."""
    from mlxrt.plugins.structured.grammar import ThinkingWindow
    from mlxrt.text.tool_calls import reasoning_lead

    fmt = model.profile.thinking_format
    if fmt is None or structured.kind == "lark" or not fmt.close:
        return None
    tokenizer = model.tokenizer
    if not reasoning_lead(model.profile, tokenizer, request.prompt_ids):
        return None
    return ThinkingWindow(close_ids=tuple(tokenizer.encode(fmt.close, add_special_tokens=False)))
