"""Stream framing: a dialect's frames from engine events (:class:`FrameWriter`,
:func:`assembled_stream`), several choices' streams merged, and errors once a stream runs
(:func:`guarded`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import Any, Protocol

from mlxrt.assembly import ResponseAssembler
from mlxrt.errors import MlxrtError
from mlxrt.records import FinishEvent, FinishReason, PromptProgress, ToolCall

__all__ = ["FrameWriter", "assembled_stream", "guarded", "merged"]

async def guarded(frames: AsyncGenerator[bytes, None],
                  error_frame: Callable[[MlxrtError], bytes]) -> AsyncGenerator[bytes, None]:
    """Pass SSE frames through; an error mid-stream becomes the dialect's error frame.

    The headers are gone by then, so the error travels in the stream, which then closes
    without its normal end.
    """
    async with aclosing(frames):  # a client that leaves closes the inner stream (and cancels) now
        try:
            async for frame in frames:
                yield frame
        except MlxrtError as exc:
            yield error_frame(exc)


async def merged(streams: Sequence[AsyncGenerator[bytes, None]]) -> AsyncGenerator[bytes, None]:
    """The frames of several streams (the choices of one request) as each produces them, every
    stream's in its own order. The first error ends the merge and closes the other streams, as
    does closing the merge (the client left): each closes its engine request."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:
            async for frame in only:
                yield frame
        return
    import asyncio

    queue: asyncio.Queue[tuple[bytes | None, BaseException | None]] = asyncio.Queue()

    async def pump(stream: AsyncGenerator[bytes, None]) -> None:
        try:
            async with aclosing(stream):
                async for frame in stream:
                    queue.put_nowait((frame, None))
        except Exception as exc:  # handed to the reader, which raises it
            queue.put_nowait((None, exc))
            return
        queue.put_nowait((None, None))

    tasks = [asyncio.ensure_future(pump(stream)) for stream in streams]
    try:
        done = 0
        while done < len(tasks):
            got, error = await queue.get()
            if error is not None:
                raise error
            if got is None:
                done += 1
            else:
                yield got
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class FrameWriter(Protocol):
    """A dialect's stream grammar over assembled deltas (:func:`assembled_stream` drives it).

    A writer may also have ``observe(event) -> list[bytes]``, called with every engine event
    before it is assembled, :class:`~mlxrt.records.PromptProgress` reports included (they reach
    only a stream whose request asked for them: ``RequestOptions.progress``); its frames go out
    first. Without it, prefill reports are skipped.
    """

    def start(self) -> list[bytes]: ...

    def feed(self, *, reasoning: str = "", text: str = "") -> list[bytes]: ...

    def finish(self, calls: tuple[ToolCall, ...], reason: FinishReason, finish: FinishEvent) -> list[bytes]: ...


async def assembled_stream(gen: Any, assembler: ResponseAssembler, writer: FrameWriter, *,
                           single_call: bool = False) -> AsyncGenerator[bytes, None]:
    """Engine events → reasoning/text deltas (``assembler``) → the dialect's frames (``writer``).

    Tool calls are known at the end; ``single_call`` keeps only the first (a client that
    turned parallel calls off). Owns ``gen``: closing this stream (the client left) closes the
    engine request.
    """
    observe = getattr(writer, "observe", None)
    async with aclosing(gen):
        for frame in writer.start():
            yield frame
        async for event in gen:
            for frame in observe(event) if observe is not None else ():
                yield frame
            if isinstance(event, PromptProgress):
                continue
            if isinstance(event, FinishEvent):
                last, reason = assembler.finish(event)
                for frame in writer.feed(reasoning=last.reasoning, text=last.content):
                    yield frame
                calls = assembler.tool_calls[:1] if single_call else assembler.tool_calls
                for frame in writer.finish(calls, reason, event):
                    yield frame
                return
            delta = assembler.feed(event.text)
            for frame in writer.feed(reasoning=delta.reasoning, text=delta.content):
                yield frame
