"""HLG sampler settings: server defaults from ``mlxrt serve`` flags, per-request overrides.

Pure Python (no MLX), so requests are validated before anything reaches the engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from mlxrt.api.wire import FieldRule, check_object
from mlxrt.errors import InvalidRequest

__all__ = ["HlgSettings", "KNOBS", "KNOB_MAX", "server_settings", "request_overrides", "resolve"]

#: The tone-curve knobs, all in nats, each accepted in ``[0, KNOB_MAX]``.
KNOBS = ("width", "shoulder", "toe", "pivot_offset")
KNOB_MAX = 100.0
_FIELDS = ("enabled", *KNOBS)
_RULES = (
    FieldRule("hlg.enabled", (bool,)),
    *(FieldRule(f"hlg.{knob}", (float, int), min=0, max=KNOB_MAX) for knob in KNOBS),
)


@attrs.frozen
class HlgSettings:
    """The HLG tone curve of one request (see docs/samplers.md for the maths).

    :ivar enabled: Whether HLG replaces the default sampler.
    :ivar width: Half-width ``w`` of the linear mid region around the pivot.
    :ivar shoulder: ``β_h``, softness of the log knee above the mid region (0: no knee).
    :ivar toe: ``β_t``, softness of the log knee below the mid region (0: no knee).
    :ivar pivot_offset: How far below the top log-probability the pivot sits.
    """

    enabled: bool = False
    width: float = 4.0
    shoulder: float = 4.0
    toe: float = 6.0
    pivot_offset: float = 6.0


def server_settings(options: Mapping[str, Any]) -> HlgSettings:
    """The server's defaults: ``--hlg-sampling`` and the ``--hlg-*`` knobs in ``host.options``.

    Options the host does not carry (an app built in-process without the CLI) fall back to
    the built-in defaults.
    """
    base = HlgSettings()
    knobs = {k: float(options[f"hlg_{k}"]) for k in KNOBS if options.get(f"hlg_{k}") is not None}
    return attrs.evolve(base, enabled=options.get("hlg_sampling") == "on", **knobs)


def request_overrides(value: Any) -> dict[str, Any]:
    """Validate a request's ``hlg`` object; return the fields it sets (nulls mean "unset").

    :raises InvalidRequest: for an unknown field, a wrong type, a number out of range or NaN.
    """
    value = check_object(value, "hlg", _FIELDS, _RULES)
    for knob in KNOBS:
        number = value.get(knob)
        if isinstance(number, float) and math.isnan(number):
            raise InvalidRequest(f"hlg.{knob} must be a number, not NaN", param=f"hlg.{knob}")
    return {k: (float(v) if k in KNOBS else v) for k, v in value.items() if v is not None}


def resolve(options: Mapping[str, Any], requested: Any | None) -> HlgSettings:
    """The request's settings: its ``hlg`` fields, field by field, over the server's defaults."""
    server = server_settings(options)
    if requested is None:
        return server
    return attrs.evolve(server, **request_overrides(requested))
