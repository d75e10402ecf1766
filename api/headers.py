"""A generation answer's response headers: the decoder's own, what the prompt cache did, and
the ``max_tokens`` admission granted when it is less than the client asked for."""

from __future__ import annotations

from collections.abc import Mapping

from mlxrt.records import CacheReport

__all__ = ["CACHE_HEADER", "MAX_TOKENS_HEADER", "response_headers"]

#: What the prompt cache did for the request (:meth:`mlxrt.records.CacheReport.header`).
CACHE_HEADER = "x-mlxrt-cache"
#: ``asked=32000; granted=7893``: the client's ``max_tokens`` (``max_output_tokens``,
#: ``max_completion_tokens``) was larger than what the context leaves after the prompt, and
#: was reduced to it (:func:`mlxrt.engine.admission.plan_max_tokens`).
MAX_TOKENS_HEADER = "x-mlxrt-max-tokens"


def response_headers(headers: Mapping[str, str], report: CacheReport, *, asked: int | None = None,
                     granted: int | None = None) -> dict[str, str]:
    """A completion's headers: the decoder's (``x-mlxrt-ignored`` ...), the cache report, and
    ``x-mlxrt-max-tokens`` when the ``asked`` limit was reduced to ``granted``."""
    out = {**headers, CACHE_HEADER: report.header()}
    if asked is not None and granted is not None and granted < asked:
        out[MAX_TOKENS_HEADER] = f"asked={asked}; granted={granted}"
    return out
