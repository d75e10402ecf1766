"""The sampler chain of one request: plugin samplers and logits processors, else mlx-lm's.

Hooks are called once per request at admission (never per token); the returned callables
run per token on the engine thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mlxrt.records import GenerationRequest, LogitsProcessor, ModelInfo, Sampler, SamplingParams

if TYPE_CHECKING:
    from mlxrt.host import PluginHost

__all__ = ["build_sampler", "build_logits_processors", "resolve_sampling", "SeedSource"]

_GOLDEN = 0x9E3779B9
_MASK = (1 << 63) - 1


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


def build_sampler(host: PluginHost, request: GenerationRequest, info: ModelInfo) -> Sampler:
    """A plugin's sampler for the request (``mlxrt_sampler``), else ``make_sampler``."""
    _plugin, sampler = host.first_answer("mlxrt_sampler", request=request, info=info, host=host)
    if sampler is not None:
        return sampler
    from mlx_lm.sample_utils import make_sampler

    s = request.sampling
    return make_sampler(temp=s.temperature, top_p=s.top_p, min_p=s.min_p, top_k=s.top_k)


def build_logits_processors(
    host: PluginHost, request: GenerationRequest, info: ModelInfo
) -> list[LogitsProcessor]:
    """Every plugin's logits processors for the request, in plugin call order."""
    return [proc for _plugin, proc in host.collect("mlxrt_logits_processors", request=request, info=info, host=host)]


#: mlx_lm.server's defaults, the last link of the fallback chain.
_MLX_LM_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
#: Server option name for each sampling field (mlx_lm.server's flag names).
_OPTION_NAMES = {"temperature": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p"}


def resolve_sampling(
    requested: Mapping[str, Any], options: Mapping[str, Any], generation_config: Mapping[str, Any],
    seed: int | None = None,
) -> SamplingParams:
    """Each field: the request → the server flag, if given → generation_config.json →
    mlx_lm.server's default (temperature 0, top_p 1, top_k 0, min_p 0)."""
    values: dict[str, Any] = {}
    for field, fallback in _MLX_LM_DEFAULTS.items():
        for candidate in (requested.get(field), options.get(_OPTION_NAMES[field]), generation_config.get(field)):
            if isinstance(candidate, (int, float)) and not isinstance(candidate, bool):
                values[field] = type(fallback)(candidate)
                break
        else:
            values[field] = fallback
    return SamplingParams(seed=seed, **values)
