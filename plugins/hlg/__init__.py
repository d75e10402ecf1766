"""The HLG tone-curve sampler, as a plugin (built-in, through the public hooks only).

Server defaults come from ``mlxrt serve --hlg-sampling on`` and the ``--hlg-*`` knobs; a
request's ``hlg`` object overrides them field by field. When HLG is on for a request with a
temperature above 0, it replaces the default sampler (top_p, top_k and min_p do not apply;
logits processors still do). The maths is in docs/samplers.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mlxrt import GenerationRequest, Sampler, hookimpl
from mlxrt.host import PluginHost
from mlxrt.records import RequestField

MLXRT_PLUGIN_KIND = "sampler"
_DIALECTS = frozenset({"openai"})


@hookimpl
def mlxrt_serve_options() -> Sequence[Any]:
    import click

    from mlxrt.plugins.hlg.settings import KNOB_MAX

    knob = click.FloatRange(0, KNOB_MAX)
    return [
        click.Option(["--hlg-sampling"], type=click.Choice(["on", "off"]), default="off",
                     help="HLG tone-curve sampling by default (a request's `hlg` overrides it)."),
        click.Option(["--hlg-width"], type=knob, default=4.0, help="HLG: half-width of the linear mid region (nats)."),
        click.Option(["--hlg-shoulder"], type=knob, default=4.0, help="HLG: shoulder knee softness (nats; 0 = none)."),
        click.Option(["--hlg-toe"], type=knob, default=6.0, help="HLG: toe knee softness (nats; 0 = none)."),
        click.Option(["--hlg-pivot-offset"], type=knob, default=6.0,
                     help="HLG: pivot distance below the top log-probability (nats)."),
    ]


def _check(value: Any) -> None:
    from mlxrt.plugins.hlg.settings import request_overrides

    request_overrides(value)


@hookimpl
def mlxrt_request_fields(dialect: str) -> Mapping[str, RequestField] | None:
    # The check runs while the request is planned, before a response starts: a bad `hlg`
    # object is a 400 even for a streamed request (at admission the stream would be open).
    return {"hlg": RequestField(dict, validate=_check)} if dialect in _DIALECTS else None


# trylast: HLG only replaces the *default* sampler. Any other sampler plugin answering for the
# request (the curve sampler, a third party's) wins over it.
@hookimpl(trylast=True)
def mlxrt_sampler(request: GenerationRequest, host: PluginHost) -> Sampler | None:
    from mlxrt.plugins.hlg.settings import resolve

    settings = resolve(host.options, request.extra.get("hlg"))
    temperature = request.sampling.temperature
    if not settings.enabled or temperature <= 0:
        return None  # greedy is unchanged by a monotone curve: leave it to the default
    from mlxrt.plugins.hlg.tone import make_hlg_sampler

    return make_hlg_sampler(settings, temperature)
