"""A generation answer's response headers: the decoder's own, what the prompt cache did, and
the ``max_tokens`` admission granted when it is less than the client asked for."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mlxrt.records import CacheReport, FinishEvent

__all__ = ["CACHE_HEADER", "MAX_TOKENS_HEADER", "FINISH_HEADER", "finish_headers", "response_headers"]

#: What the prompt cache did for the request (:meth:`mlxrt.records.CacheReport.header`).
CACHE_HEADER = "x-mlxrt-cache"
#: ``asked=32000; granted=7893``: the client's ``max_tokens`` (``max_output_tokens``,
#: ``max_completion_tokens``) was larger than what the context leaves after the prompt, and
#: was reduced to it (:func:`mlxrt.engine.admission.plan_max_tokens`).
MAX_TOKENS_HEADER = "x-mlxrt-max-tokens"
#: ``request_timeout``: a non-streamed answer's ``length`` came from ``--request-timeout``, not
#: from ``max_tokens`` or the window (a stream's headers are gone by then: the log says it).
FINISH_HEADER = "x-mlxrt-finish"


def finish_headers(headers: dict[str, str], finishes: Iterable[FinishEvent]) -> None:
    """Add :data:`FINISH_HEADER` to a non-streamed answer's ``headers`` when the request timeout
    ended one of its choices."""
    if any(finish.timed_out for finish in finishes):
        headers[FINISH_HEADER] = "request_timeout"


def response_headers(headers: Mapping[str, str], report: CacheReport, *, asked: int | None = None,
                     granted: int | None = None) -> dict[str, str]:
    """A completion's headers: the decoder's (``x-mlxrt-ignored`` ...), the cache report, and
    ``x-mlxrt-max-tokens`` when the ``asked`` limit was reduced to ``granted``."""
    out = {**headers, CACHE_HEADER: report.header()}
    if asked is not None and granted is not None and granted < asked:
        out[MAX_TOKENS_HEADER] = f"asked={asked}; granted={granted}"
    return out
