"""The HLG tone curve on device: log-probabilities → shaped logits, and its sampler.

Runs per token on the engine thread, so it is a handful of elementwise MLX ops on the
``[batch, vocab]`` log-probabilities; nothing here reads the request.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from mlxrt.plugins.hlg.settings import HlgSettings

__all__ = ["tone_curve", "make_hlg_sampler"]

#: Floor of the knees' log arguments: the branch ``where`` discards must not produce NaN.
_LOG_FLOOR = 1e-9
#: Smallest knee softness used: below it float32 underflows (``0·∞``). A knee this hard is
#: already flat to within 2e-5 nats, so rounding a softer one up changes nothing visible.
_MIN_SOFTNESS = 1e-6


def _knee(x: mx.array, beta: float) -> mx.array:
    """``β·ln(1 + x/β)`` for ``x ≥ 0``: slope 1 at 0, then logarithmic."""
    beta = max(beta, _MIN_SOFTNESS)
    return beta * mx.log(mx.maximum(1.0 + x / beta, _LOG_FLOOR))


def tone_curve(logprobs: mx.array, settings: HlgSettings, temperature: float) -> mx.array:
    """Map log-probabilities through the HLG curve; the result is a logit vector.

    ``z = ℓ − (max ℓ − pivot_offset)``; the curve is ``m·z`` on ``|z| ≤ width`` (``m = 1/T``)
    and logarithmic knees beyond, continuous with a continuous slope, and non-decreasing,
    so the ranking of tokens (and argmax) is preserved and ``−inf`` stays ``−inf``. A knee
    whose softness is 0 is left out: that side stays linear.
    """
    gain = 1.0 / temperature
    w = settings.width
    z = logprobs - (mx.max(logprobs, axis=-1, keepdims=True) - settings.pivot_offset)
    out = z
    if settings.shoulder > 0:
        out = mx.where(z > w, w + _knee(z - w, settings.shoulder), out)
    if settings.toe > 0:
        out = mx.where(z < -w, -w - _knee(-z - w, settings.toe), out)
    return gain * out


def make_hlg_sampler(settings: HlgSettings, temperature: float) -> Callable[[mx.array], mx.array]:
    """A ``(logprobs) -> tokens`` sampler drawing from ``softmax(tone_curve(logprobs))``."""

    def sample(logprobs: mx.array) -> mx.array:
        return mx.random.categorical(tone_curve(logprobs, settings, temperature))

    return sample
