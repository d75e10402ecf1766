"""The curve sampler (v2), as a plugin (built-in, through the public hooks only).

A request's ``curve`` object draws a monotone transfer curve on log-probabilities; the
sampler draws from ``p_out ∝ exp(curve(log p_in))``. It replaces temperature, top_p, top_k
and min_p for that request (and samples even at temperature 0); logits processors still
apply. The maths is in docs/samplers.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlxrt import GenerationRequest, Sampler, hookimpl
from mlxrt.records import RequestField

MLXRT_PLUGIN_KIND = "sampler"
_DIALECTS = frozenset({"openai"})


def _check(value: Any) -> None:
    from mlxrt.plugins.curve.params import parse_curve

    parse_curve(value)


@hookimpl
def mlxrt_request_fields(dialect: str) -> Mapping[str, RequestField] | None:
    # The check runs while the request is planned, before a response starts: a bad curve is a
    # 400 even for a streamed request (at admission the stream would already be open).
    return {"curve": RequestField(dict, validate=_check)} if dialect in _DIALECTS else None


@hookimpl
def mlxrt_sampler(request: GenerationRequest) -> Sampler | None:
    if "curve" not in request.extra:
        return None
    from mlxrt.plugins.curve.params import parse_curve
    from mlxrt.plugins.curve.spline import make_curve_sampler

    return make_curve_sampler(parse_curve(request.extra["curve"]))
