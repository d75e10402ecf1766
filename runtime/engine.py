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
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.detokenize import Detokenizer
from mlxrt.errors import EngineError, MlxrtError
from mlxrt.loading import load_model
from mlxrt.records import (
    FamilyProfile,
    FinishEvent,
    FinishReason,
    GenerationRequest,
    LoadedModel,
    ModelInfo,
    TokenEvent,
    TokenLogprob,
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


@attrs.define
class _Call:
    """A raw forward (embeddings, the curve designer) run exclusively on the worker."""

    fn: Callable[[LoadedModel], Any]
    done: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop


class Engine:
    """Owns the model on a worker thread and runs generations for the HTTP side.

    :param host: The plugin host (family hooks at load, sampler and processor hooks per request).

    The model is loaded on the worker thread by :meth:`load`: MLX arrays a model creates at
    load belong to that thread's stream, so loading anywhere else breaks some models.
    """

    def __init__(self, host: PluginHost) -> None:
        self.host = host
        self.loaded: LoadedModel | None = None
        self.profile: FamilyProfile | None = None
        self.seeds = SeedSource()
        self._jobs: queue.Queue[_Job | _Call | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.requests_served = 0
        self.requests_cancelled = 0

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def info(self):  # noqa: ANN201 - ModelInfo
        return self.profile.info

    def load(self, info: ModelInfo) -> None:
        """Start the worker, load ``info`` on it (MLX state stays on that thread), and warm up.

        Blocks until the model is ready; a load error is raised here.
        """
        if self._thread is not None:
            raise EngineError("the engine already has a model")
        ready: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(info, ready), name="mlxrt-engine", daemon=True)
        self._thread.start()
        try:
            ready.result()
        except BaseException:
            self._thread.join(timeout=5)
            self._thread = None
            raise

    def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Run ``request``; yield its events. Stopping early cancels the request."""
        if self._thread is None:
            raise EngineError("the engine has no model loaded")
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

    async def call(self, fn: Callable[[LoadedModel], Any]) -> Any:
        """Run ``fn(loaded_model)`` on the worker, between generations, and return its result.

        For raw forwards (embeddings, next-token distributions): they are serialized with
        generation, never run beside it. Exceptions raised by ``fn`` are re-raised here.
        """
        if self._thread is None:
            raise EngineError("the engine has no model loaded")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._jobs.put(_Call(fn, done, loop))
        return await done

    # -- worker thread -------------------------------------------------------------------------

    def _run(self, info: ModelInfo, ready: Future[None]) -> None:
        try:
            self.loaded, self.profile = load_model(info, self.host)
        except BaseException as exc:  # handed to the caller of load()
            ready.set_exception(exc)
            return
        self._warm_up()
        ready.set_result(None)
        while (job := self._jobs.get()) is not None:
            if isinstance(job, _Call):
                self._run_call(job)
                continue
            if job.cancelled.is_set():
                continue
            try:
                self._generate(job)
            except MlxrtError as exc:
                job.emit(exc)
            except Exception as exc:  # keep serving: one failed generation must not kill the worker
                log.exception("generation %s failed", job.request.request_id)
                job.emit(EngineError(f"generation failed: {type(exc).__name__}: {exc}"))

    def _run_call(self, call: _Call) -> None:
        def settle(setter: Callable[[Any], None], value: Any) -> None:
            if not call.done.done():
                setter(value)

        try:
            result = call.fn(self.loaded)
        except BaseException as exc:  # handed back to the awaiting request
            call.loop.call_soon_threadsafe(settle, call.done.set_exception, exc)
        else:
            call.loop.call_soon_threadsafe(settle, call.done.set_result, result)

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
        sampler = build_sampler(self.host, request, self.info, tokenizer)
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
        for token, logprobs in steps:
            token = int(token)
            produced += 1
            if token in eos:
                finish = FinishReason.STOP
                break
            if request.logprobs is None:
                text, stopped = stops.feed(detok.add(token))
                job.emit(TokenEvent(token=token, text=text))
            else:
                logprob, top = _describe(logprobs, token, request.logprobs, detok)
                piece = detok.add(token)
                text, stopped = stops.feed(piece)
                job.emit(TokenEvent(token=token, text=text, logprob=logprob, top_logprobs=top, piece=piece))
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
        self.requests_cancelled += finish is FinishReason.CANCELLED
        job.emit(
            FinishEvent(
                finish_reason=finish,
                prompt_tokens=len(request.prompt_ids),
                completion_tokens=produced,
                text=tail,
            )
        )


def _describe(logprobs: Any, token: int, k: int, detok: Detokenizer) -> tuple[float, tuple[TokenLogprob, ...]]:
    """The emitted token's log-probability and the ``k`` best alternatives, best first.

    ``logprobs`` is what mlx-lm's ``generate_step`` yields with the token: the log-softmax
    after logits processors, before temperature and filters. Top-k uses argpartition (no full
    sort of the vocabulary); only the ``k`` winners are sorted. Called only when asked for.
    """
    import mlx.core as mx

    chosen = float(logprobs[token].item())
    if k <= 0:
        return chosen, ()
    ids = mx.argpartition(-logprobs, kth=k - 1)[:k]
    values = logprobs[ids].tolist()
    ranked = sorted(zip(ids.tolist(), values, strict=True), key=lambda pair: -pair[1])
    texts = detok.preview([i for i, _ in ranked])
    return chosen, tuple(TokenLogprob(id=i, logprob=float(v), text=t) for (i, v), t in zip(ranked, texts, strict=True))
