"""The curve sampler on device: log-probabilities → ``curve(log p)`` logits, and its sampler.

Branch-free: every segment's cubic is evaluated on the whole ``[batch, vocab]`` array and
``where`` keeps the right one, so a curve of n knots costs O(n) elementwise ops per token.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from mlxrt.plugins.curve.params import Curve

__all__ = ["apply_curve", "make_curve_sampler"]


def _segment(curve: Curve, i: int, u: mx.array) -> mx.array:
    """The cubic Hermite piece on ``[X_i, X_{i+1}]``, in Horner form in ``t = (u − X_i)/h``."""
    x0, x1 = curve.x[i], curve.x[i + 1]
    y0, y1 = curve.y[i], curve.y[i + 1]
    h = x1 - x0
    m0, m1 = h * curve.slopes[i], h * curve.slopes[i + 1]
    c2 = 3 * (y1 - y0) - 2 * m0 - m1
    c3 = 2 * (y0 - y1) + m0 + m1
    t = (u - x0) / h
    return ((c3 * t + c2) * t + m0) * t + y0


def apply_curve(logprobs: mx.array, curve: Curve) -> mx.array:
    """``curve(ℓ)`` elementwise: linear beyond the end knots, the spline between; ``−inf``
    stays ``−inf`` (the line below the first knot has a positive slope)."""
    u = logprobs
    out = curve.y[-1] + curve.slopes[-1] * (u - curve.x[-1])
    for i in reversed(range(len(curve.x) - 1)):
        out = mx.where(u < curve.x[i + 1], _segment(curve, i, u), out)
    below = curve.y[0] + curve.below_slope * (u - curve.x[0])
    return mx.where(u < curve.x[0], below, out)


def make_curve_sampler(curve: Curve) -> Callable[[mx.array], mx.array]:
    """A ``(logprobs) -> tokens`` sampler drawing from ``softmax(curve(logprobs))``."""

    def sample(logprobs: mx.array) -> mx.array:
        return mx.random.categorical(apply_curve(logprobs, curve))

    return sample
