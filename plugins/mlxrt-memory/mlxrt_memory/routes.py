"""HTTP routes: ``POST /v1/memory/synthesize`` (SSE; ``GET`` for the server's own pages) and ``GET /v1/memory/status``.

The run goes on a worker thread of its own task, not the response's: a client that leaves
only sets the stop flag, and the run ends at its next stage boundary, releasing the one-run
lock itself (so a new run cannot start while the old one still writes).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
from litestar import Request, get, route
from litestar.response import Stream

from mlxrt.api.auth import caller_of
from mlxrt.api.models import model_for
from mlxrt.api.sse import sse_data, sse_response
from mlxrt.errors import InvalidRequest, NotFound
from mlxrt_memory.editor import EngineEditor
from mlxrt_memory.synthesis import MemoryFolder, MemoryService, RunBusy, run_synthesis

__all__ = ["ROUTES", "service_of"]

#: How many events of the current run ``/v1/memory/status`` keeps for the status page.
PROGRESS_KEPT = 50
_FLAGS = {"1": True, "true": True, "0": False, "false": False}


def service_of(request: Request) -> MemoryService:
    """The memory of the caller (:func:`mlxrt.api.auth.caller_of`): its own turns, runs and vault."""
    memory: MemoryFolder | None = request.app.state.host.plugin_states.get("memory")
    if memory is None:
        raise NotFound("memory is off: start the server with --memory-dir DIR to capture turns and synthesize")
    return memory.partition(caller_of(request))


# POST for clients; GET too, because EventSource can only GET. Marked state-changing: on a
# key-less server a page of another origin cannot start a run, and the GET is served only to
# a request that proves it comes from the server's own page (mlxrt.api.edge).
@route("/v1/memory/synthesize", http_method=["GET", "POST"], status_code=200,
       summary="Run the memory-synthesis stages, streamed as server-sent events", tags=["memory"],
       opt={"state_changing": True})
async def synthesize(request: Request) -> Stream:
    raw = request.query_params.get("dry", "0")
    if raw.lower() not in _FLAGS:
        raise InvalidRequest(f"dry must be 0 or 1, got {raw!r}", param="dry")
    dry = _FLAGS[raw.lower()]
    model = await model_for(request, None)  # the served model edits (held until the stream ends)
    service = await anyio.to_thread.run_sync(service_of, request)  # a first use opens SQLite and git
    if not service.lock.acquire(blocking=False):
        raise RunBusy()
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    stop = threading.Event()
    service.progress.clear()
    stage: list[str | None] = [None]

    def record(event: dict[str, Any]) -> None:  # worker thread, holding the run's lock
        if event.get("stage"):
            stage[0] = event["stage"]
        service.progress[:] = [*service.progress[-(PROGRESS_KEPT - 1):], event]

    def emit(event: dict[str, Any]) -> None:
        record(event)
        loop.call_soon_threadsafe(events.put_nowait, event)

    def job() -> None:
        final: dict[str, Any] | None = None
        try:
            final = run_synthesis(service, EngineEditor(model), dry=dry, emit=emit, stopped=stop.is_set)
        except Exception as exc:
            final = {"type": "error", "stage": stage[0], "message": f"{type(exc).__name__}: {exc}"}
        finally:
            if final is not None:
                record(final)
            # Released before the client hears the end: a status read after the last event
            # says the run is over (it said "running: true" when it raced the release).
            service.lock.release()
            if final is not None:
                loop.call_soon_threadsafe(events.put_nowait, final)
            loop.call_soon_threadsafe(events.put_nowait, None)

    async def drive() -> None:
        await anyio.to_thread.run_sync(job)

    service.active = (asyncio.create_task(drive()), stop)

    async def frames() -> AsyncIterator[bytes]:
        try:
            while (event := await events.get()) is not None:
                yield sse_data(event)
                if event["type"] == "error":
                    return
            yield sse_data("[DONE]")
        finally:
            stop.set()  # the client left (or the stream ended): stop at the next stage boundary

    return sse_response(frames())


@get("/v1/memory/status", summary="What the memory store holds and the current synthesis run's progress",
     tags=["memory"])
async def memory_status(request: Request) -> dict[str, Any]:
    service = await anyio.to_thread.run_sync(service_of, request)
    counts = await anyio.to_thread.run_sync(service.store.counts)
    return {"folder": str(service.folder), "vault": str(service.vault.root), "running": service.running(),
            "counts": counts, "progress": list(service.progress)}


ROUTES = [synthesize, memory_status]
