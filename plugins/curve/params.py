"""Curve sampler parameters: validation of a request's ``curve`` object and the monotone spline.

A curve is drawn as control points in percent probability (the Curve Designer's
``{"space": "logprob", "points": [{"x_pct", "y_pct"}, ...], "monotonic": true}``). Here the
points become knots in log-probability space and the spline's tangents are fixed once per
request, in plain Python; :mod:`mlxrt.plugins.curve.spline` evaluates it on device per token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxrt.api.wire import FieldRule, check_fields
from mlxrt.errors import InvalidRequest

__all__ = ["Curve", "parse_curve", "pchip_tangents", "MAX_POINTS", "MONOTONE_SLACK"]

#: Segments are evaluated per token on the whole vocabulary; a bound keeps that cheap.
MAX_POINTS = 64
#: A secant this close to 0 from below is rounding, not a falling segment.
MONOTONE_SLACK = 1e-12
#: Percentages are floored here before the log, so 0 % is a (very deep) valid knot.
_PCT_FLOOR = 1e-9
_FIELDS = ("space", "points", "monotonic")


@attrs.frozen
class Curve:
    """A monotone piecewise-cubic transfer ``y = f(u)`` on log-probabilities ``u``.

    :ivar x: Knot abscissas ``X_i = ln(x_pct/100)``, strictly increasing.
    :ivar y: Knot ordinates ``Y_i = ln(y_pct/100)``, non-decreasing.
    :ivar slopes: Tangent ``M_i`` at each knot (Fritsch–Carlson, see :func:`pchip_tangents`).
    """

    x: tuple[float, ...]
    y: tuple[float, ...]
    slopes: tuple[float, ...]

    @property
    def below_slope(self) -> float:
        """Slope of the line continuing the curve below the first knot: at least 1, so the deep
        tail is never lifted relative to its input."""
        return max(self.slopes[0], 1.0)


def pchip_tangents(x: Sequence[float], y: Sequence[float]) -> tuple[float, ...]:
    """Fritsch–Carlson tangents of the monotone cubic Hermite interpolant through ``(x, y)``.

    End tangents are the end secants; an interior tangent is 0 where the secants on either
    side differ in sign (or one is flat), else their weighted harmonic mean, which keeps
    every cubic segment within its knots and monotone.
    """
    h = [b - a for a, b in zip(x, x[1:], strict=False)]
    d = [(y[i + 1] - y[i]) / h[i] for i in range(len(h))]
    slopes = [d[0]]
    for i in range(1, len(d)):
        if d[i - 1] * d[i] <= 0:
            slopes.append(0.0)
        else:
            w1, w2 = 2 * h[i] + h[i - 1], h[i] + 2 * h[i - 1]
            slopes.append((w1 + w2) / (w1 / d[i - 1] + w2 / d[i]))
    slopes.append(d[-1])
    return tuple(slopes)


def _object(value: Any, where: str, allowed: Sequence[str], kind: str) -> Mapping[str, Any]:
    """``value`` as a JSON object holding only ``allowed`` fields, else a 400 naming them."""
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{where} must be {kind}", param="curve")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise InvalidRequest(f"{where} has unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}",
                             param="curve")
    return value


def _point(i: int, point: Any) -> tuple[float, float, float, float]:
    where = f"curve.points[{i}]"
    _object(point, where, ("x_pct", "y_pct"), "an object with x_pct and y_pct")
    for key in ("x_pct", "y_pct"):
        if point.get(key) is None:
            raise InvalidRequest(f"{where}.{key} is required", param="curve")
    check_fields({f"{where}.{k}": v for k, v in point.items()},
                 [FieldRule(f"{where}.{k}", (float, int), min=0, max=100) for k in ("x_pct", "y_pct")])
    xp, yp = float(point["x_pct"]), float(point["y_pct"])
    if math.isnan(xp) or math.isnan(yp):
        raise InvalidRequest(f"{where} must hold numbers, not NaN", param="curve")
    return xp, yp, math.log(max(xp, _PCT_FLOOR) / 100), math.log(max(yp, _PCT_FLOOR) / 100)


def parse_curve(value: Any) -> Curve:
    """Validate a request's ``curve`` object and build its spline.

    :raises InvalidRequest: with the reason: an unknown field, a bad point, two points at
        one ``x_pct``, or a segment that falls (the curve must be non-decreasing).
    """
    _object(value, "curve", _FIELDS, "of type dict")
    if value.get("space", "logprob") != "logprob":
        raise InvalidRequest(f"curve.space must be 'logprob', not {value['space']!r}", param="curve")
    if value.get("monotonic", True) is not True:
        raise InvalidRequest("curve.monotonic must be true: only monotone curves are supported",
                             param="curve")
    points = value.get("points")
    if not isinstance(points, list) or not 2 <= len(points) <= MAX_POINTS:
        raise InvalidRequest(f"curve.points must be an array of 2 to {MAX_POINTS} points", param="curve")
    knots = sorted((_point(i, p) for i, p in enumerate(points)), key=lambda k: k[2])
    for (xa, ya, ua, va), (xb, yb, ub, vb) in zip(knots, knots[1:], strict=False):
        if ub == ua:
            raise InvalidRequest(f"curve.points: two points share x_pct={xa:g}", param="curve")
        if (vb - va) / (ub - ua) < -MONOTONE_SLACK:
            raise InvalidRequest(
                "curve is not monotone — all segment slopes must be ≥ 0: the segment from "
                f"x_pct={xa:g} to x_pct={xb:g} falls from y_pct={ya:g} to y_pct={yb:g}",
                param="curve",
            )
    x = tuple(k[2] for k in knots)
    y = tuple(k[3] for k in knots)
    return Curve(x=x, y=y, slopes=pchip_tangents(x, y))
