"""The curve designer's backend: one prompt sampled N times with a curve and N times with a plain
temperature/top-p/top-k/min-p recipe, side by side, plus the next-token distribution each makes
of the model's.

:func:`parse_design` validates a request body (pure Python, on the event loop: every bad input is
an :class:`InvalidRequest` before the engine is involved). :func:`run_design` is the MLX part; it
runs as one raw job on the model's thread (``ServedModel.call``), between decode steps and never
beside one, so batched requests neither slow it down nor see their random state disturbed
(every draw here re-seeds, as every seeded sampler of the engine does).

Both sides use the same seeds (``seed + i`` for sample ``i``), so where their texts differ it is
the sampler that differs, not the luck of the draw.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import attrs

from mlxrt.api.wire import FieldRule, check_fields, check_object
from mlxrt.errors import InvalidRequest
from mlxrt.plugins.curve.params import Curve, parse_curve
from mlxrt.records import LoadedModel

__all__ = ["Recipe", "DesignRequest", "Sample", "TokenRow", "DesignResult", "parse_design",
           "run_design", "MAX_N", "MAX_TOKENS", "MAX_TOP"]

#: Completions per side at most: the job holds the engine worker while it runs.
MAX_N = 32
#: Tokens per completion at most (the designer shows short continuations).
MAX_TOKENS = 128
#: Rows of the distribution table at most.
MAX_TOP = 100
#: Points of the plotted transfer curve (log-spaced over input probabilities).
PLOT_POINTS = 97
#: The plot's lowest input probability, in percent.
PLOT_FLOOR_PCT = 1e-4
_PREFILL_CHUNK = 2048

_FIELDS = ("prompt", "chat", "curve", "recipe", "n", "max_tokens", "seed", "top")
_RULES = (
    FieldRule("prompt", (str,), nullable=False),
    FieldRule("chat", (bool,), nullable=False),
    FieldRule("n", (int,), min=0, max=MAX_N, nullable=False),
    FieldRule("max_tokens", (int,), min=1, max=MAX_TOKENS, nullable=False),
    FieldRule("seed", (int,), min=0, max=2**63 - 1, nullable=False),
    FieldRule("top", (int,), min=1, max=MAX_TOP, nullable=False),
)
_RECIPE_FIELDS = ("temperature", "top_p", "top_k", "min_p")
_RECIPE_RULES = (
    FieldRule("recipe.temperature", (float, int), min=0, max=100, nullable=False),
    FieldRule("recipe.top_p", (float, int), min=0, max=1, nullable=False),
    FieldRule("recipe.top_k", (int,), min=0, nullable=False),
    FieldRule("recipe.min_p", (float, int), min=0, max=1, nullable=False),
)


@attrs.frozen
class Recipe:
    """A plain sampling recipe, applied as mlx-lm's ``make_sampler`` applies it (top-p, then
    min-p, then top-k on the log-probabilities; then temperature; 0 is greedy)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0


@attrs.frozen
class DesignRequest:
    """A validated designer request.

    :ivar prompt_ids: The prompt's tokens (chat-templated unless ``chat`` was false).
    :ivar curve: The curve side's spline.
    :ivar knots: The curve's control points as given, ``(x_pct, y_pct)``, sorted by ``x_pct``.
    :ivar recipe: The plain side's recipe.
    :ivar n: Completions per side (0: distributions only).
    :ivar max_tokens: Tokens per completion at most.
    :ivar seed: Sample ``i`` of either side draws with seed ``seed + i``.
    :ivar top: Rows of the distribution table.
    """

    prompt_ids: tuple[int, ...]
    curve: Curve
    knots: tuple[tuple[float, float], ...]
    recipe: Recipe
    n: int = 8
    max_tokens: int = 16
    seed: int = 0
    top: int = 20


@attrs.frozen
class Sample:
    text: str
    tokens: int
    finish_reason: str  # "stop" (an end-of-sequence token) or "length"


@attrs.frozen
class TokenRow:
    """One candidate next token and the probability each side gives it."""

    id: int
    text: str
    model: float
    curve: float
    recipe: float


@attrs.frozen
class DesignResult:
    distribution: tuple[TokenRow, ...]
    entropy: Mapping[str, float]  # bits, per side ("model", "curve", "recipe")
    plot: tuple[tuple[float, float], ...]  # the transfer curve, (x_pct, y_pct)
    curve_samples: tuple[Sample, ...]
    recipe_samples: tuple[Sample, ...]

    def as_dict(self, request: DesignRequest, model_id: str) -> dict[str, Any]:
        def samples(items: Sequence[Sample]) -> list[dict[str, Any]]:
            return [attrs.asdict(s) for s in items]

        return {
            "object": "curve.samples",
            "model": model_id,
            "prompt_tokens": len(request.prompt_ids),
            "n": request.n,
            "seed": request.seed,
            "entropy_bits": dict(self.entropy),
            "distribution": [attrs.asdict(r) for r in self.distribution],
            "curve": {"points": [{"x_pct": x, "y_pct": y} for x, y in request.knots],
                      "plot": [{"x_pct": x, "y_pct": y} for x, y in self.plot],
                      "samples": samples(self.curve_samples)},
            "recipe": {**attrs.asdict(request.recipe), "samples": samples(self.recipe_samples)},
        }


def _recipe(value: Any) -> Recipe:
    if value is None:
        return Recipe()
    value = check_object(value, "recipe", _RECIPE_FIELDS, _RECIPE_RULES)
    fields = {k: value[k] for k in _RECIPE_FIELDS if k in value}
    if any(isinstance(v, float) and not math.isfinite(v) for v in fields.values()):
        raise InvalidRequest("recipe values must be finite numbers", param="recipe")
    numbers: dict[str, Any] = {k: (int(v) if k == "top_k" else float(v)) for k, v in fields.items()}
    return Recipe(**numbers)


def parse_design(body: Mapping[str, Any], tokenize: Any) -> DesignRequest:
    """Validate a ``POST /v1/curves/sample`` body.

    :param body: The decoded JSON object.
    :param tokenize: ``(prompt, chat) -> token ids`` (the route renders the chat template).
    :raises InvalidRequest: naming the field and the reason (for a curve: parse_curve's, e.g.
        which segment falls).
    """
    unknown = sorted(set(body) - set(_FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]!r}; allowed: {', '.join(_FIELDS)}", param=unknown[0])
    if not body.get("prompt"):
        raise InvalidRequest("prompt is required (a non-empty string)", param="prompt")
    if "curve" not in body:
        raise InvalidRequest("curve is required", param="curve")
    check_fields(body, _RULES)
    curve = parse_curve(body["curve"])
    knots = tuple(sorted((float(p["x_pct"]), float(p["y_pct"])) for p in body["curve"]["points"]))
    recipe = _recipe(body.get("recipe"))
    ids = tuple(int(i) for i in tokenize(body["prompt"], body.get("chat", True)))
    if not ids:
        raise InvalidRequest("prompt encodes to no tokens", param="prompt")
    return DesignRequest(prompt_ids=ids, curve=curve, knots=knots, recipe=recipe,
                         n=body.get("n", 8), max_tokens=body.get("max_tokens", 16),
                         seed=body.get("seed", 0), top=body.get("top", 20))


# -- on the engine worker --------------------------------------------------------------------


def _filtered(logprobs: Any, recipe: Recipe) -> Any:
    """The recipe's filters, in make_sampler's order and with its conditions."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    if 0 < recipe.top_p < 1.0:
        logprobs = apply_top_p(logprobs, recipe.top_p)
    if recipe.min_p != 0.0:
        logprobs = apply_min_p(logprobs, recipe.min_p, 1)
    if recipe.top_k > 0:
        logprobs = apply_top_k(logprobs, recipe.top_k)
    return logprobs


def _recipe_probs(logprobs: Any, recipe: Recipe) -> Any:
    import mlx.core as mx

    if recipe.temperature == 0:
        return (mx.arange(logprobs.shape[-1]) == mx.argmax(logprobs, axis=-1, keepdims=True)).astype(mx.float32)
    return mx.softmax(_filtered(logprobs, recipe) / recipe.temperature, axis=-1)


def _entropy_bits(probs: Any) -> float:
    import mlx.core as mx

    p = probs.astype(mx.float32)
    return float(-mx.sum(mx.where(p > 0, p * mx.log2(mx.maximum(p, 1e-30)), 0.0)))


def _plot(curve: Curve) -> tuple[tuple[float, float], ...]:
    import mlx.core as mx

    from mlxrt.plugins.curve.spline import apply_curve

    lo = math.log(PLOT_FLOOR_PCT / 100)
    u = [lo + (0 - lo) * i / (PLOT_POINTS - 1) for i in range(PLOT_POINTS)]
    # mlx types tolist() as any nesting; a 1-D array's is a flat list
    y = cast("list[float]", apply_curve(mx.array(u, dtype=mx.float32), curve).tolist())
    return tuple((100 * math.exp(a), 100 * math.exp(min(b, 50.0))) for a, b in zip(u, y, strict=True))


class _Decoder:
    """Short continuations that share one prefilled prompt cache, decoded by the engine's own
    token loop (:func:`mlxrt.engine.steps.token_steps`).

    The prompt minus its last token is prefilled once; every completion feeds the last prompt
    token and its own tokens, then the cache is trimmed back to the prefix (or, for a cache that
    cannot be trimmed, rebuilt).
    """

    def __init__(self, loaded: LoadedModel, prompt: Sequence[int]) -> None:
        import mlx.core as mx
        from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.prompt = list(prompt)
        self.eos = frozenset(getattr(loaded.tokenizer, "eos_token_ids", None) or ())
        self.stream = mx.default_stream(mx.default_device())  # the worker's, as the job runs on it
        self._make: Callable[[], list[Any]] = lambda: make_prompt_cache(self.model)
        self.cache = self._prefill()
        self.trimmable = can_trim_prompt_cache(self.cache)

    def _prefill(self) -> list[Any]:
        import mlx.core as mx

        cache = self._make()
        prefix = self.prompt[:-1]
        for start in range(0, len(prefix), _PREFILL_CHUNK):
            self.model(mx.array([prefix[start:start + _PREFILL_CHUNK]]), cache=cache)
            mx.eval([c.state for c in cache])
        return cache

    def _reset(self, fed: int) -> None:
        from mlx_lm.models.cache import trim_prompt_cache

        if self.trimmable:
            trim_prompt_cache(self.cache, fed)
        else:
            self.cache = self._prefill()

    def _steps(self, sampler: Any, max_tokens: int) -> Any:
        """The loop from the last prompt token; logits in float32 before the log-softmax."""
        import mlx.core as mx

        from mlxrt.engine.steps import token_steps

        return token_steps(mx.array([self.prompt[-1]]), self.model, cache=self.cache, stream=self.stream,
                           max_tokens=max_tokens, sampler=sampler,
                           processors=[lambda _history, logits: logits.astype(mx.float32)])

    def next_logprobs(self) -> Any:
        """The model's next-token log-probabilities after the prompt, shape ``[1, vocab]``."""
        import mlx.core as mx

        with contextlib.closing(self._steps(None, 1)) as steps:
            _token, logprobs = next(steps)
        mx.eval(logprobs)
        self._reset(2)  # the prompt's last token and the one the loop queued after it
        return logprobs[None]

    def complete(self, sampler: Any, max_tokens: int) -> Sample:
        tokens: list[int] = []
        reason, handed = "length", 0
        with contextlib.closing(self._steps(sampler, max_tokens)) as steps:
            for token, _logprobs in steps:
                handed += 1
                if token in self.eos:
                    reason = "stop"
                    break
                tokens.append(token)
        # fed: the last prompt token, then each handed-out token (the loop queues the next
        # step before it hands a token out)
        self._reset(1 + handed)
        return Sample(text=self.tokenizer.decode(tokens), tokens=len(tokens), finish_reason=reason)


def run_design(loaded: LoadedModel, request: DesignRequest) -> DesignResult:
    """Sample both sides and measure both distributions (MLX: run on the engine worker)."""
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    from mlxrt.engine.sampling import seeded
    from mlxrt.plugins.curve.spline import apply_curve, make_curve_sampler

    decoder = _Decoder(loaded, request.prompt_ids)
    logprobs = decoder.next_logprobs()
    if request.recipe.top_k >= logprobs.shape[-1]:  # keeps every token: no filter (mlx-lm's would fail)
        request = attrs.evolve(request, recipe=attrs.evolve(request.recipe, top_k=0))
    model_p = mx.exp(logprobs)[0]
    curve_p = mx.softmax(apply_curve(logprobs, request.curve), axis=-1)[0]
    recipe_p = _recipe_probs(logprobs, request.recipe)[0]
    mx.eval(model_p, curve_p, recipe_p)

    k = min(request.top, model_p.shape[-1])
    rows: set[int] = set()
    for p in (model_p, curve_p, recipe_p):
        rows.update(int(i) for i in cast("list[int]", mx.argsort(-p)[:k].tolist()))  # 1-D: flat
    ids = sorted(rows, key=lambda i: -float(model_p[i]))
    # Each column of the union: what the model, the curve and the recipe give it.
    table = cast("list[list[float]]", mx.stack([model_p, curve_p, recipe_p])[:, mx.array(ids)].tolist())  # 2-D
    distribution = tuple(
        TokenRow(id=i, text=loaded.tokenizer.decode([i]), model=m, curve=c, recipe=r)
        for i, m, c, r in zip(ids, *table, strict=True)
    )
    entropy = {"model": _entropy_bits(model_p), "curve": _entropy_bits(curve_p),
               "recipe": _entropy_bits(recipe_p)}

    r = request.recipe
    plain = make_sampler(temp=r.temperature, top_p=r.top_p, min_p=r.min_p, top_k=r.top_k)
    curved = make_curve_sampler(request.curve)
    curve_samples = tuple(decoder.complete(seeded(curved, request.seed + i), request.max_tokens)
                          for i in range(request.n))
    recipe_samples = tuple(decoder.complete(seeded(plain, request.seed + i), request.max_tokens)
                           for i in range(request.n))
    return DesignResult(distribution=distribution, entropy=entropy, plot=_plot(request.curve),
                        curve_samples=curve_samples, recipe_samples=recipe_samples)
