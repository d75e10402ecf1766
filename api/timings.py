"""llama-server's telemetry objects on OpenAI-shaped answers (docs/dialects.md, "llama.cpp
and vLLM fields"): ``timings`` (how long the prompt and the answer took) and
``prompt_progress`` (how far the prefill has come, for ``return_progress``).

The final ``timings`` of an answer are the engine's clock (:class:`~mlxrt.records.FinishEvent`'s
``prompt_seconds`` and ``decode_seconds``); the running ones a stream sends per chunk
(``timings_per_token``) are measured here, when each event reaches the HTTP side. Token
counts are the served model's tokens, as everywhere.
"""

from __future__ import annotations

import time
from typing import Any

from mlxrt.records import CacheReport, FinishEvent, PromptProgress, TokenEvent

__all__ = ["timings", "progress_body", "StreamTimings"]


def _body(*, cached: int, prompt_n: int, prompt_s: float, predicted_n: int, predicted_s: float) -> dict[str, Any]:
    # llama-server's convention: the first token comes with the prompt's last batch, so the
    # per-token decode figures divide by the steps after it.
    steps = max(predicted_n - 1, 0)
    prompt_ms, predicted_ms = prompt_s * 1000.0, predicted_s * 1000.0
    return {
        "cache_n": cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / prompt_s if prompt_s > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
        "predicted_per_second": steps / predicted_s if predicted_s > 0 and steps else 0.0,
    }


def timings(finish: FinishEvent) -> dict[str, Any]:
    """A finished answer's ``timings``: ``cache_n`` prompt tokens reused from the prompt cache,
    ``prompt_n`` run (and their milliseconds and rate), ``predicted_n`` generated (and theirs)."""
    return _body(cached=finish.cached_tokens, prompt_n=finish.prompt_tokens - finish.cached_tokens,
                 prompt_s=finish.prompt_seconds, predicted_n=finish.completion_tokens,
                 predicted_s=finish.decode_seconds)


def progress_body(progress: PromptProgress) -> dict[str, Any]:
    """llama-server's ``prompt_progress``: ``total``, ``cache``, ``processed`` tokens and
    ``time_ms`` since the request started running."""
    return {"total": progress.total, "cache": progress.cache, "processed": progress.processed,
            "time_ms": progress.seconds * 1000.0}


class StreamTimings:
    """The running ``timings`` of one streamed answer (``timings_per_token``), measured as its
    events arrive: the prompt from the stream's start (the request was admitted) to the first
    token, the answer from the first token to the latest."""

    def __init__(self, report: CacheReport | None) -> None:
        self.start = time.monotonic()
        self.cached = report.cached_tokens if report is not None else 0
        self.prompt_tokens = report.prompt_tokens if report is not None else 0
        self.first: float | None = None
        self.tokens = 0

    def feed(self, event: object) -> None:
        """An engine event arrived (only token events count)."""
        if isinstance(event, TokenEvent):
            self.tokens += 1
            if self.first is None:
                self.first = time.monotonic()

    def now(self) -> dict[str, Any]:
        """The ``timings`` so far."""
        now = time.monotonic()
        first = self.first if self.first is not None else now
        return _body(cached=self.cached, prompt_n=self.prompt_tokens - self.cached, prompt_s=first - self.start,
                     predicted_n=self.tokens, predicted_s=now - first if self.first is not None else 0.0)
