"""The serial lane of a denoising model (``LoadedModel.engine == "denoising"``).

A denoising model (DiffusionGemma) does not decode token by token: its family's
:class:`~mlxrt.records.Denoiser` yields *settled blocks* of ids. This lane takes the engine's
serial slot (one request at a time, on the worker thread) and does for each block what the
autoregressive serial lane does per token: count it against ``max_tokens``, end at an
end-of-sequence id, detokenize, match stop strings, and emit the stable text — one
:class:`TokenEvent` per block (its ``token`` is the block's last id kept), so a stream
carries one text delta per settled block. Between blocks, and inside the generator between
model passes, a client that left or a request past ``--request-timeout`` ends it.

There is no prompt cache (a request's encoder cache is its own, dropped at the end) and no
batching; the request shapes that need token-by-token control are refused with a 400 before
anything runs: log-probabilities, structured outputs, enforced ``tool_choice`` and adapters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mlxrt.engine.lanes import Done, RequestTimeout, Row
from mlxrt.errors import InvalidRequest, MlxrtError, ModelLoadError
from mlxrt.records import Denoiser, FinishReason, GenerationRequest, TokenEvent

__all__ = ["DenoisingLane"]


class DenoisingLane:
    """Runs requests one at a time through a :class:`~mlxrt.records.Denoiser`."""

    name = "serial"

    def __init__(self, denoiser: Denoiser, *, done: Done, tick: Callable[[int], None]) -> None:
        if not callable(getattr(denoiser, "generate", None)):
            raise ModelLoadError("the model's family declared engine='denoising' but gave no denoiser "
                                 "(LoadedModel.denoiser with generate(prompt, request, should_cancel))")
        self.denoiser = denoiser
        self.done = done
        self.tick = tick
        self.served = 0

    @staticmethod
    def refuse(request: GenerationRequest) -> MlxrtError | None:
        """Why this lane cannot run ``request`` (a 400), or None."""
        if request.logprobs is not None:
            return InvalidRequest("logprobs are not available for a denoising model: its tokens are not "
                                  "generated one after another", param="logprobs")
        if request.structured is not None:
            return InvalidRequest("structured outputs are not available for a denoising model",
                                  param=request.structured.param)
        if request.forced_prefixes:
            return InvalidRequest("tool_choice 'required' or a named function cannot be enforced on a "
                                  "denoising model", param="tool_choice")
        if request.adapters:
            return InvalidRequest("adapters are not available for a denoising model", param="adapter")
        return None

    def run(self, row: Row, prompt: Any = None) -> None:
        """Generate ``row``'s request to its end; ``prompt``: a spliced image prompt, if any
        (default: the request's ``vision``, when the request record has one)."""
        job = row.job
        reason = FinishReason.LENGTH

        def should_cancel() -> bool:
            return job.cancelled.is_set() or (job.deadline is not None and time.monotonic() > job.deadline)

        if prompt is None:  # an image prompt rides on the request (``GenerationRequest.vision``)
            prompt = getattr(row.request, "vision", None)
        blocks = self.denoiser.generate(prompt if prompt is not None else row.request.prompt_ids,
                                        row.request, should_cancel)
        try:
            for block in blocks:
                ended = self._emit(row, [int(t) for t in block])
                if ended is not None:
                    reason = ended
                    break
                if job.cancelled.is_set():
                    reason = FinishReason.CANCELLED
                    break
            else:
                if should_cancel():
                    reason = FinishReason.CANCELLED
            if reason is FinishReason.CANCELLED and not job.cancelled.is_set():
                row.error = RequestTimeout(row.timeout or 0.0)
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()  # releases the generator's arrays on every path
        self.served += 1
        self.done(row, reason, None, ())

    def _emit(self, row: Row, block: list[int]) -> FinishReason | None:
        """Account for one block and deliver its stable text; the reason to stop, if any."""
        if not block:
            return None
        if row.first_token_at is None:
            row.first_token_at = time.monotonic()
        text: list[str] = []
        ended: FinishReason | None = None
        last = block[-1]
        for token in block:
            row.produced += 1
            row.generated.append(token)
            last = token
            if token in row.eos:
                ended = FinishReason.STOP
                break
            piece, stopped = row.stops.feed(row.detok.add(token))
            text.append(piece)
            if stopped:
                ended = FinishReason.STOP
                break
        self.tick(len(block))
        row.job.deliver(TokenEvent(token=last, text="".join(text)))
        return ended
