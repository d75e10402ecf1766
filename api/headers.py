"""A generation answer's response headers: the decoder's own and what the prompt cache did."""

from __future__ import annotations

from collections.abc import Mapping

from mlxrt.records import CacheReport

__all__ = ["CACHE_HEADER", "response_headers"]

#: What the prompt cache did for the request (:meth:`mlxrt.records.CacheReport.header`).
CACHE_HEADER = "x-mlxrt-cache"


def response_headers(headers: Mapping[str, str], report: CacheReport) -> dict[str, str]:
    """A completion's headers: the decoder's (``x-mlxrt-ignored`` ...) plus the cache report."""
    return {**headers, CACHE_HEADER: report.header()}
