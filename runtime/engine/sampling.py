"""The sampler chain of one request: built-in samplers and logits processors, and the hooks.

The built-in chain is mlx-lm's (``make_sampler``, ``make_logits_processors``), configured from
the request's :class:`SamplingParams`; where the mlxrt-qmv kernel is loaded its top-p filter is
the kernel's (:func:`mlxrt.engine.qmv.top_p_filter`: the same results, a quarter of the time). ``mlxrt_sampler`` replaces the sampler;
``mlxrt_logits_processors`` adds processors after the built-in ones. Hooks are called once per
request at admission (never per token); the returned callables run per token on the engine
thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import mlxrt.engine.qmv as qmv
from mlxrt.records import GenerationRequest, LogitsProcessor, ModelInfo, Sampler, SamplingParams

if TYPE_CHECKING:
    from mlxrt.registry import PluginHost

__all__ = ["build_sampler", "build_logits_processors", "resolve_sampling", "xtc_special_tokens", "SeedSource",
           "choice_seed", "seeded", "is_stateless", "processors_stateless",
           "LogitBias", "add_biases", "bias_only"]

_GOLDEN = 0x9E3779B9
_MASK = (1 << 63) - 1
#: Above this threshold at most one token can qualify, and XTC never removes the least likely
#: qualifying token, so XTC is a no-op there (mlx-lm raises mid-generation instead).
_XTC_MAX_USEFUL_THRESHOLD = 0.5
#: The attribute :func:`build_sampler` sets on the samplers it builds from the request's settings:
#: they keep no state between calls, so speculative decoding may run the draft's proposals
#: through them too (a plugin's sampler may count its calls, and carries no such mark).
_STATELESS = "mlxrt_stateless"


def _stateless(sampler: Sampler) -> Sampler:
    setattr(sampler, _STATELESS, True)
    return sampler


def is_stateless(sampler: Sampler | None) -> bool:
    """Whether ``sampler`` (or the one a :func:`seeded` sampler wraps) is one :func:`build_sampler`
    built from the request's settings, or mlx-lm's greedy sampler; ``None`` (greedy) too."""
    from mlx_lm.sample_utils import greedy_sampler

    inner = getattr(sampler, "inner", sampler)
    # greedy_sampler is one mlx-lm module function: told by identity, never marked
    return inner is None or inner is greedy_sampler or getattr(inner, _STATELESS, False) is True


class LogitBias:
    """A request's ``logit_bias`` (and ``ignore_eos``'s ban of the end-of-sequence ids): adds
    ``values`` to the logits of ``tokens``, as mlx-lm's logit-bias processor does (the same
    operation, ``logits.at[:, tokens].add(values)``, so the same bits). Its own type, so that the
    batch lane can add every row's bias in one scatter (:func:`add_biases`) and skip the history
    it never reads; it keeps no state and cannot fail (the tokens were checked against the
    vocabulary when the request was planned)."""

    mlxrt_stateless = True

    def __init__(self, bias: Mapping[int, float]) -> None:
        import mlx.core as mx

        self.tokens = tuple(int(t) for t in bias)
        self.values = tuple(float(v) for v in bias.values())
        self._tokens, self._values = mx.array(self.tokens), mx.array(self.values)

    def __call__(self, _history: Any, logits: Any) -> Any:
        return logits.at[:, self._tokens].add(self._values)


def add_biases(logits: Any, biases: Sequence[LogitBias | None]) -> Any:
    """``logits`` (one row per entry of ``biases``) with each row's :class:`LogitBias` added, in one
    scatter for every row: the same element-wise sums as each row's own processor."""
    import mlx.core as mx

    rows = [at for at, bias in enumerate(biases) for _ in (bias.tokens if bias is not None else ())]
    if not rows:
        return logits
    tokens = [t for bias in biases if bias is not None for t in bias.tokens]
    values = [v for bias in biases if bias is not None for v in bias.values]
    return logits.at[mx.array(rows), mx.array(tokens)].add(mx.array(values))


def bias_only(processors: Sequence[Any]) -> bool:
    """Whether ``processors`` are at most one :class:`LogitBias` (what a request without penalties,
    constraints or plugins brings): nothing reads the history."""
    return len(processors) <= 1 and all(isinstance(processor, LogitBias) for processor in processors)


def processors_stateless(processors: Sequence[LogitsProcessor]) -> bool:
    """Whether every one of ``processors`` is one of :func:`builtin_logits_processors` (logit
    bias, penalties): each a function of the history and the logits it is given, so a lone
    request with them may decode in the serial lane and join a batch later, which feeds its
    last token again (a tool_choice constraint or a plugin's processor may keep state: those
    rows decode in the batch lane from the start)."""
    return all(getattr(processor, _STATELESS, False) is True for processor in processors)


class SeedSource:
    """Default seeds that differ per request even within one millisecond.

    The time is mixed with a per-instance counter times the golden-ratio constant (as mlx-bun
    does); an explicit request seed always wins and is used as given.
    """

    def __init__(self) -> None:
        self._count = 0

    def next(self) -> int:
        import time

        self._count += 1
        return (time.time_ns() // 1_000_000 ^ (self._count * _GOLDEN)) & _MASK


def _mix(value: int) -> int:
    """splitmix64's finalizer: nearby inputs give unrelated outputs."""
    value = (value + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (value ^ (value >> 31)) & _MASK


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice ``index`` of a request that asked for several (OpenAI's ``n``).

    Choice 0 runs on the request's seed itself (so it answers what ``n: 1`` would); each other
    choice on a seed derived from it, so the choices differ and the same request gives the same
    choices again. Without a request seed every choice draws its own default seed.
    """
    if seed is None or index == 0:
        return seed
    return _mix((seed & _MASK) ^ (index * _GOLDEN))


def seeded(sampler: Sampler, seed: int) -> Sampler:
    """``sampler`` with its own random stream: draw ``t`` uses a key derived from
    ``(seed, t)`` only.

    MLX has one global random state; rows of a batch sample one after another, so each row
    re-seeds it right before its own draw. The text of a seeded request therefore depends on
    its seed and its logits, not on which other requests share the batch, nor on the lane.
    """
    import mlx.core as mx

    base = _mix(seed & _MASK)
    step = 0

    def sample(logprobs: Any) -> Any:
        nonlocal step
        mx.random.seed(_mix(base ^ step))
        step += 1
        return sampler(logprobs)

    def rewind(n: int) -> None:
        """Forget the last ``n`` draws (a lane that discards sampled tokens redraws them)."""
        nonlocal step
        step -= n

    sample.inner = sampler  # type: ignore[attr-defined]  # what it wraps (speculative decoding asks)
    sample.rewind = rewind  # type: ignore[attr-defined]
    return sample


def xtc_special_tokens(tokenizer: Any) -> list[int]:
    """Ids XTC never removes: every EOS id and the newline's ids (encoded without specials),
    so XTC cannot stop a model from ending its answer or its line (mlx-bun's set)."""
    eos = list(getattr(tokenizer, "eos_token_ids", None) or ())
    newline = list(tokenizer.encode("\n", add_special_tokens=False))
    return sorted(set(eos) | set(newline))


def build_sampler(host: PluginHost, request: GenerationRequest, info: ModelInfo,
                  tokenizer: Any = None, *, model: object = None) -> Sampler:
    """A plugin's sampler for the request (``mlxrt_sampler``), else mlx-lm's ``make_sampler``.

    ``tokenizer`` supplies XTC's exempt ids; without one, XTC exempts nothing.
    """
    _plugin, sampler = host.first_answer("mlxrt_sampler", request=request, info=info, host=host, model=model)
    if sampler is not None:
        return sampler
    from mlx_lm.sample_utils import greedy_sampler, make_sampler

    s = request.sampling
    xtc = s.xtc_probability if s.xtc_threshold <= _XTC_MAX_USEFUL_THRESHOLD else 0.0
    # top_k at or past the vocabulary keeps every token (mlx-lm's sampler raises there)
    vocab = info.config_int("vocab_size")
    top_k = 0 if vocab is not None and s.top_k >= vocab else s.top_k
    # top_p 0 keeps only the most likely token: greedy, as OpenAI's API (mlx-lm reads 0 as "off")
    temperature = 0.0 if s.top_p <= 0 else s.temperature
    nucleus = temperature != 0 and 0 < s.top_p < 1
    apply_top_p = qmv.top_p_filter() if nucleus else None
    sampler = make_sampler(
        temp=temperature, top_p=0.0 if apply_top_p else s.top_p, min_p=s.min_p, top_k=top_k,
        xtc_probability=xtc, xtc_threshold=s.xtc_threshold,
        xtc_special_tokens=xtc_special_tokens(tokenizer) if xtc > 0 and tokenizer is not None else [],
    )
    if apply_top_p is None:
        # make_sampler's chain is a fresh closure for each call, unless greedy (told by identity)
        return _stateless(sampler) if sampler is not greedy_sampler else sampler
    # mlx-lm's chain filters by top-p first: the same chain with that filter the kernel's
    # (the same results, ~6 ms a token less over a 49K vocabulary on the CPU)
    top_p = s.top_p

    def nucleus_sampler(logprobs: Any) -> Any:
        return sampler(apply_top_p(logprobs, top_p))

    return _stateless(nucleus_sampler)


def builtin_logits_processors(s: SamplingParams) -> list[LogitsProcessor]:
    """logit_bias, then repetition, presence and frequency penalties (mlx-lm's order).

    A context size of 0 means the whole history (prompt and generated tokens): mlx-lm's
    processors slice ``tokens[-n:]``, and ``tokens[-0:]`` is every token.
    """
    from mlx_lm.sample_utils import make_logits_processors

    # each a fresh closure over the request's settings that reads only its arguments
    bias: list[LogitsProcessor] = [LogitBias(s.logit_bias)] if s.logit_bias else []
    return bias + [_stateless(processor) for processor in make_logits_processors(
        logit_bias=None,
        # 1.0 multiplies by one: skip it rather than pay for it per token.
        repetition_penalty=s.repetition_penalty if s.repetition_penalty != 1.0 else None,
        repetition_context_size=s.repetition_context_size,
        presence_penalty=s.presence_penalty,
        presence_context_size=s.presence_context_size,
        frequency_penalty=s.frequency_penalty,
        frequency_context_size=s.frequency_context_size,
    )]


def build_logits_processors(
    host: PluginHost, request: GenerationRequest, info: ModelInfo, *, model: object = None
) -> list[LogitsProcessor]:
    """The built-in processors for the request's settings, the ``tool_choice`` constraint,
    then every plugin's, in call order."""
    from mlxrt.text.tool_calls import tool_choice_processors

    plugins = [proc for _plugin, proc in host.collect("mlxrt_logits_processors", request=request, info=info,
                                                      host=host, model=model)]
    # tool_choice "required" / a named function (forced_prefixes), for every family alike.
    return builtin_logits_processors(request.sampling) + tool_choice_processors(request) + plugins


#: Each field resolved through the fallback chain: (mlx_lm.server's default, server option
#: name or None, generation_config.json key or None).
_CHAIN: Mapping[str, tuple[float | int, str | None, str | None]] = {
    "temperature": (0.0, "temp", "temperature"),
    "top_p": (1.0, "top_p", "top_p"),
    "top_k": (0, "top_k", "top_k"),
    "min_p": (0.0, "min_p", "min_p"),
    "repetition_penalty": (0.0, None, "repetition_penalty"),
    "repetition_context_size": (20, None, None),
    "presence_penalty": (0.0, None, None),
    "presence_context_size": (20, None, None),
    "frequency_penalty": (0.0, None, None),
    "frequency_context_size": (20, None, None),
    "xtc_probability": (0.0, None, None),
    "xtc_threshold": (0.1, None, None),
}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: The largest count that reaches MLX as a size or slice index (its indices are 32-bit: a
#: larger one raises inside the decode step, where it would end every row of the batch).
MAX_COUNT = 2**31 - 1
_COUNTS = ("top_k", "repetition_context_size", "presence_context_size", "frequency_context_size")


def _check_ranges(values: Mapping[str, Any]) -> None:
    """Refuse, while the request is decoded, numbers the decode step cannot take."""
    import math

    from mlxrt.errors import InvalidRequest

    for field, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(f"{field} must be a finite number", param=field)
        if field in _COUNTS and not 0 <= value <= MAX_COUNT:
            raise InvalidRequest(f"{field} must be between 0 and {MAX_COUNT}", param=field)


def resolve_sampling(
    requested: Mapping[str, Any], options: Mapping[str, Any], generation_config: Mapping[str, Any],
    seed: int | None = None, logit_bias: Mapping[int, float] | None = None,
) -> SamplingParams:
    """Each field: the request → the server flag, if given → generation_config.json →
    mlx_lm.server's default (temperature 0, top_p 1, top_k 0, min_p 0, penalties off,
    context sizes 20, XTC off with threshold 0.1).

    :raises InvalidRequest: a count (``top_k``, the context sizes) outside 0 to
        :data:`MAX_COUNT`, or a non-finite number, naming the field."""
    values: dict[str, Any] = {}
    for field, (fallback, option, gen_key) in _CHAIN.items():
        candidates: Sequence[Any] = (
            requested.get(field),
            options.get(option) if option else None,
            generation_config.get(gen_key) if gen_key else None,
        )
        chosen = next((c for c in candidates if _number(c)), fallback)
        values[field] = type(fallback)(chosen)
    _check_ranges(values)
    return SamplingParams(seed=seed, logit_bias=dict(logit_bias or {}), **values)
