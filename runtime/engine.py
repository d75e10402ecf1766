"""The engine: one worker thread owns MLX; the async HTTP side submits requests and awaits
events.

This is the seam the scheduler grows behind: ``Engine.generate(request)`` takes a
:class:`GenerationRequest` and returns an async iterator of :class:`TokenEvent` ending in one
:class:`FinishEvent`. Every MLX call happens on the worker (MLX streams are not for
sharing); requests run one at a time, in arrival order. A consumer that stops iterating
(a client that disconnected) cancels its request at the next token.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.detokenize import Detokenizer
from mlxrt.errors import EngineError, MlxrtError
from mlxrt.records import (
    FamilyProfile,
    FinishEvent,
    FinishReason,
    GenerationRequest,
    LoadedModel,
    TokenEvent,
)
from mlxrt.sampling import SeedSource, build_logits_processors, build_sampler
from mlxrt.stops import StopMatcher

if TYPE_CHECKING:
    from mlxrt.host import PluginHost

__all__ = ["Engine"]

log = logging.getLogger("mlxrt.engine")

Event = TokenEvent | FinishEvent


@attrs.define
class _Job:
    request: GenerationRequest
    emit: Callable[[Event | BaseException], None]
    cancelled: threading.Event = attrs.field(factory=threading.Event)


class Engine:
    """Owns the model on a worker thread and runs generations for the HTTP side.

    :param loaded: The model and tokenizer.
    :param profile: The family profile resolved at load.
    :param host: The plugin host (per-request sampler and processor hooks).
    """

    def __init__(self, loaded: LoadedModel, profile: FamilyProfile, host: PluginHost) -> None:
        self.loaded = loaded
        self.profile = profile
        self.host = host
        self.seeds = SeedSource()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.requests_served = 0

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def info(self):  # noqa: ANN201 - ModelInfo
        return self.profile.info

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mlxrt-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Run ``request``; yield its events. Stopping early cancels the request."""
        self.start()
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        job = _Job(request, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
        self._jobs.put(job)
        try:
            while True:
                event = await events.get()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if isinstance(event, FinishEvent):
                    return
        finally:
            job.cancelled.set()

    # -- worker thread -------------------------------------------------------------------------

    def _run(self) -> None:
        self._warm_up()
        while (job := self._jobs.get()) is not None:
            if job.cancelled.is_set():
                continue
            try:
                self._generate(job)
            except MlxrtError as exc:
                job.emit(exc)
            except Exception as exc:  # keep serving: one failed generation must not kill the worker
                log.exception("generation %s failed", job.request.request_id)
                job.emit(EngineError(f"generation failed: {type(exc).__name__}: {exc}"))

    def _warm_up(self) -> None:
        """Import the decode path and run one token, so the first request does not pay for it."""
        try:
            import mlx.core as mx
            from mlx_lm.generate import generate_step
            from mlx_lm.models.cache import make_prompt_cache

            first = self.loaded.tokenizer.eos_token_id or 0
            for _ in generate_step(mx.array([first]), self.loaded.model, max_tokens=1,
                                   prompt_cache=make_prompt_cache(self.loaded.model)):
                pass
        except Exception:  # a model that cannot warm up will fail its first request visibly
            log.warning("engine warm-up failed", exc_info=True)

    def _generate(self, job: _Job) -> None:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import make_prompt_cache

        request = job.request
        model, tokenizer = self.loaded.model, self.loaded.tokenizer
        sampler = build_sampler(self.host, request, self.info)
        processors = build_logits_processors(self.host, request, self.info)
        seed = request.sampling.seed if request.sampling.seed is not None else self.seeds.next()
        mx.random.seed(seed)

        eos = set(tokenizer.eos_token_ids or ())
        detok = Detokenizer(lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        stops = StopMatcher(request.stop)
        finish = FinishReason.LENGTH
        produced = 0
        steps = generate_step(
            mx.array(request.prompt_ids),
            model,
            max_tokens=request.max_tokens,
            sampler=sampler,
            logits_processors=processors or None,
            prompt_cache=make_prompt_cache(model),
        )
        for token, _logprobs in steps:
            token = int(token)
            produced += 1
            if token in eos:
                finish = FinishReason.STOP
                break
            text, stopped = stops.feed(detok.add(token))
            job.emit(TokenEvent(token=token, text=text))
            if stopped:
                finish = FinishReason.STOP
                break
            if job.cancelled.is_set():
                finish = FinishReason.CANCELLED
                break
        tail = ""
        if finish is not FinishReason.CANCELLED and not stops.stopped:
            tail, _ = stops.feed(detok.flush())
            tail += stops.flush()
        self.requests_served += 1
        job.emit(
            FinishEvent(
                finish_reason=finish,
                prompt_tokens=len(request.prompt_ids),
                completion_tokens=produced,
                text=tail,
            )
        )
