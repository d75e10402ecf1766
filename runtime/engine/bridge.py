"""The bridge between the engine's worker thread and the asyncio side.

The HTTP side holds a :class:`Generation` per submitted request and awaits its events; the
worker hands events to it through an :class:`Outbox` (one event-loop wake-up per burst) and
runs raw forwards queued as :class:`Call`\\ s. Nothing here touches MLX.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

import attrs

from mlxrt.records import CacheReport, FinishEvent, LoadedModel, PromptProgress, TokenEvent

__all__ = ["Event", "Generation", "Call", "Outbox", "WAKE"]

#: What a generation yields; :class:`PromptProgress` only for a request that asked for it
#: (``GenerationRequest.progress``), before its first token.
Event = TokenEvent | FinishEvent | PromptProgress


class Generation:
    """The HTTP side's handle on one submitted request (an async iterator of events).

    Items arrive from the worker through the event loop (``call_soon_threadsafe``), in order:
    the :class:`CacheReport` (resolving :meth:`started`), then (when the request asked for
    them) prefill progress events, then token events, then one finish event, or an exception
    at any point.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, cancel: Callable[[], None]) -> None:
        self._events: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        self._started: asyncio.Future[CacheReport] = loop.create_future()
        # An error before admission is raised from started() and from iteration; whichever
        # the caller uses, the other must not warn that the exception went unretrieved.
        self._started.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._cancel = cancel
        self._finished = False
        self._held: BaseException | None = None

    def _deliver(self, item: Any) -> None:  # on the event loop
        if isinstance(item, CacheReport):
            if not self._started.done():
                self._started.set_result(item)
            return
        if isinstance(item, BaseException) and not self._started.done():
            self._started.set_exception(item)
        self._events.put_nowait(item)

    async def started(self) -> CacheReport:
        """Wait until the request is admitted; its prompt-cache report.

        Raises what kept it out: ``QueueFull`` (waited past the timeout), a plugin's error
        from building its sampler chain, ``EngineError``.
        """
        return await asyncio.shield(self._started)

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> Event:
        if self._finished:
            raise StopAsyncIteration
        item = self._held if self._held is not None else await self._events.get()
        self._held = None
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        if isinstance(item, FinishEvent):
            self._finished = True
        return item

    async def batches(self) -> AsyncIterator[list[Event]]:
        """The events in runs: each run is one event plus every event that is already
        waiting behind it. A stream that writes one frame per run sends fewer, fuller frames
        when it falls behind the engine (and one frame per token when it keeps up)."""
        while not self._finished:
            run = [await self.__anext__()]
            while not self._finished and not self._events.empty():
                item = self._events.get_nowait()
                if isinstance(item, BaseException):
                    self._held = item  # raised by the next call, after this run is handled
                    break
                run.append(item)
                if isinstance(item, FinishEvent):
                    self._finished = True
            yield run

    async def aclose(self) -> None:
        """Cancel the request if it has not finished (idempotent)."""
        if not self._finished:
            self._finished = True
            self._cancel()


@attrs.define(eq=False)
class Call:
    """A raw forward (embeddings, the curve designer) run exclusively on the worker."""

    fn: Callable[[LoadedModel], Any]
    done: asyncio.Future[Any] | Future[Any]
    loop: asyncio.AbstractEventLoop | None  # None: ``done`` is a thread-safe Future


WAKE = object()


class Outbox:
    """Hands items from the worker to handles on one event loop, one wake-up per burst.

    ``call_soon_threadsafe`` writes to the loop's self-pipe on every call; a decode step of
    a batch produces an event per row, so items are queued here and a single drain is
    scheduled until the loop has run it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: list[tuple[Generation, Any]] = []
        self._lock = threading.Lock()
        self._scheduled = False

    def put(self, handle: Generation, item: Any) -> None:  # worker thread
        with self._lock:
            self._items.append((handle, item))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _drain(self) -> None:  # event loop
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for handle, item in items:
            handle._deliver(item)
