"""Tying engine work to the client's connection: a client that leaves cancels its request.

A streaming response notices a departed client when Litestar's stream stops (it listens for
``http.disconnect`` while sending). A non-streaming handler sends nothing until the end, so it
listens itself: :func:`until_disconnect` runs an awaitable beside a task that awaits the ASGI
``receive`` until ``http.disconnect`` arrives, and cancels the awaitable then. Uvicorn (h11
and httptools alike) answers ``receive`` after the body was read only when the connection is
lost (or the response is complete), so the watcher costs nothing while the client waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from litestar import Request
from litestar.types import Receive

from mlxrt.assembly import drain
from mlxrt.errors import MlxrtError
from mlxrt.records import CacheReport, FinishEvent, GenerationRequest, TokenEvent

if TYPE_CHECKING:
    from mlxrt.engine.bridge import Generation
    from mlxrt.serving import ServedModel

__all__ = ["ClientDisconnected", "until_disconnect", "off_loop", "start_generation", "start_choices",
           "closing_on_error", "drain_until_disconnect", "drain_choices", "closing_choices"]

T = TypeVar("T")


class ClientDisconnected(MlxrtError):
    """The client closed the connection before the response was ready (nginx's 499).

    Raised by :func:`until_disconnect`; the response rendered from it goes nowhere (the
    server drops writes to a closed connection), and under 500 it is not logged as a failure.
    """

    status = 499
    type = "client_closed_request"

    def __init__(self, message: str = "the client disconnected") -> None:
        super().__init__(message, code="client_disconnected")


async def _watch(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass  # a body message (the handler read the body already, so none is expected)
    scope.cancel()


async def until_disconnect(request: Request[Any, Any, Any], awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``; cancel it and raise :class:`ClientDisconnected` if the client leaves.

    Call it after the request body has been read: the watcher consumes ``receive`` messages.
    The cancellation is confined to a cancel scope, so a disconnect that lands just as the
    awaitable finishes never leaks into the rest of the handler.
    """
    with anyio.CancelScope() as scope:
        # A bare task rather than a task group: a task group would wrap the awaitable's own
        # errors (QueueFull, PluginError ...) in an ExceptionGroup the error handlers do not know.
        watcher = asyncio.create_task(_watch(request.receive, scope))
        try:
            return await awaitable
        finally:
            watcher.cancel()
    raise ClientDisconnected()  # reached only when the watcher cancelled the scope


async def off_loop(request: Request[Any, Any, Any], fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a worker thread (templating, tokenizing), abandoned when the client
    leaves: the handler stops at once with :class:`ClientDisconnected` and nothing is queued;
    the thread's result, when it comes, is dropped."""
    return await until_disconnect(request, anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True))


@asynccontextmanager
async def closing_on_error(gen: Any) -> AsyncIterator[None]:
    """Close the engine request ``gen`` if the block fails (a request nobody will read)."""
    try:
        yield
    except BaseException:
        await gen.aclose()
        raise


async def start_generation(request: Request[Any, Any, Any], model: ServedModel, generation: GenerationRequest
                           ) -> tuple[Generation, CacheReport]:
    """Submit ``generation`` and wait until it is admitted (its prompt-cache lookup done).

    Returns the engine's ``Generation`` handle and its :class:`~mlxrt.records.CacheReport`.
    Errors before the first token (``QueueFull``, ``PluginError``, ``OverBudget`` ...) are
    raised here, while the response status can still say so; the handle is closed on any
    failure and when the client leaves while the request waits, so nothing is left queued.
    From here the caller owns the handle: a stream closes it when it ends or is closed,
    :func:`drain_until_disconnect` when it returns.
    """
    gen = model.generate(generation)
    async with closing_on_error(gen):
        return gen, await until_disconnect(request, gen.started())


async def start_choices(request: Request[Any, Any, Any], model: ServedModel, generations: Sequence[GenerationRequest]
                        ) -> tuple[list[Generation], CacheReport]:
    """:func:`start_generation` for the choices of one request (OpenAI's ``n``): all submitted
    at once, so they run side by side where the lane has rows; waits until the first is
    admitted and returns its report. The others may wait behind it (the serial lane runs one
    at a time), so an error that keeps one of them out arrives in its events. If one is
    refused at submission (``QueueFull``), the first fails before its first token, or the
    client leaves, every one is closed and the error raised."""
    gens: list[Generation] = []
    try:
        for generation in generations:
            gens.append(model.generate(generation))
        report = await until_disconnect(request, gens[0].started())
    except BaseException:
        for gen in gens:
            await gen.aclose()
        raise
    return gens, report


async def closing_choices(frames: AsyncGenerator[bytes, None], gens: Sequence[Generation]) -> AsyncGenerator[bytes, None]:
    """The stream of a request's choices (``frames``, which owns ``gens``), and, however it
    ends (the client left, an error, the end), every one of ``gens`` closed at once.

    The dialect's stream closes each choice's request itself, but only once that choice's own
    stream got that far: a choice still waiting for admission when the client left was never
    closed (of an abandoned ``n: 24`` stream, 16 kept generating). Closing here does not
    depend on it. ``Generation.aclose`` never suspends, so the loop below runs to its end even
    inside a cancelled scope (Litestar cancels the stream's task when the client leaves; an
    await that suspends there is cancelled again at once).
    """
    try:
        async for frame in frames:
            yield frame
    finally:
        for gen in gens:
            await gen.aclose()
        await frames.aclose()


async def drain_until_disconnect(request: Request[Any, Any, Any], gen: Any,
                                 on_text: Callable[[str], Any]) -> tuple[FinishEvent, list[TokenEvent]]:
    """The non-streaming path: :func:`mlxrt.assembly.drain` the whole generation, cancelled
    (and ``gen`` closed, freeing its batch row) when the client leaves; ``gen`` is closed on return."""
    async with aclosing(gen):
        return await until_disconnect(request, drain(gen, on_text))


async def drain_choices(request: Request[Any, Any, Any], gens: Sequence[Any], on_texts: Sequence[Callable[[str], Any]]
                        ) -> list[tuple[FinishEvent, list[TokenEvent]]]:
    """:func:`drain_until_disconnect` for the choices of one request, drained side by side
    (each choice's text to its own ``on_texts`` callable). The client leaving, or one choice
    failing, closes every one; all are closed on return."""
    async def drained(gen: Any, on_text: Callable[[str], Any]) -> tuple[FinishEvent, list[TokenEvent]]:
        async with aclosing(gen):
            return await drain(gen, on_text)

    tasks = [asyncio.ensure_future(drained(gen, on_text)) for gen, on_text in zip(gens, on_texts, strict=True)]
    try:
        return list(await until_disconnect(request, asyncio.gather(*tasks)))
    except BaseException:
        for task in tasks:  # every choice, whichever failed or was cancelled first
            task.cancel()
        for gen in gens:
            await gen.aclose()
        raise
