"""mlxrt-memory: opt-in capture of finished chat turns and the memory-synthesis endpoint.

Off unless ``mlxrt serve --memory-dir DIR``: then every finished chat turn is stored in
``DIR/memory.sqlite3`` and ``POST /v1/memory/synthesize`` turns the store into a git-tracked
Markdown wiki in ``DIR/vault`` (docs/memory.md). Built only on public hooks. This module
stays light: the store, the stages and the routes are imported when first used.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxrt import hookimpl

if TYPE_CHECKING:
    from mlxrt.host import PluginHost

log = logging.getLogger("mlxrt.memory")

#: How long shutdown waits for a run to reach its next stage boundary.
SHUTDOWN_WAIT_S = 30


@hookimpl
def mlxrt_serve_options() -> list[Any]:
    import click

    return [click.Option(["--memory-dir"], type=click.Path(file_okay=False), default=None,
                         callback=_free_folder,
                         help="Capture finished chat turns into this folder's SQLite store and serve "
                              "POST /v1/memory/synthesize, which writes a git-tracked Markdown wiki there "
                              "(mlxrt-memory plugin). Off when not given.")]


def _free_folder(ctx: Any, param: Any, value: str | None) -> str | None:
    """``--memory-dir`` another server holds is a usage error, before any model loads (the
    folder is claimed for good at start-up, :func:`mlxrt_startup`)."""
    if value:
        import click

        from mlxrt_memory.synthesis import MemoryFolderBusy, claim_folder

        try:
            claim_folder(Path(value).expanduser().resolve()).close()
        except MemoryFolderBusy as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
        except OSError as exc:
            raise click.BadParameter(f"cannot use {value}: {exc.strerror}", ctx=ctx, param=param) from None
    return value


@hookimpl
def mlxrt_startup(host: PluginHost) -> None:
    folder = host.options.get("memory_dir")
    if not folder:
        return
    from mlxrt_memory.synthesis import MemoryFolder

    memory = host.plugin_state("memory", lambda: MemoryFolder.open(Path(folder)))
    log.info("memory capture on: %s", memory.root)


@hookimpl
async def mlxrt_shutdown(host: PluginHost) -> None:
    memory = host.plugin_states.get("memory")
    if memory is None:
        return
    for service in memory.partitions():
        if service.active is not None:
            task, stop = service.active
            stop.set()
            try:
                await asyncio.wait_for(asyncio.shield(task), SHUTDOWN_WAIT_S)
            except (TimeoutError, Exception):
                log.warning("memory: the synthesis run did not stop in %d s", SHUTDOWN_WAIT_S)
    memory.close()


@hookimpl
def mlxrt_turn_finished(turn: Any, host: PluginHost) -> None:
    memory = host.plugin_states.get("memory")
    if memory is None:  # no --memory-dir: nothing is ever stored
        return
    if not getattr(turn, "store", True):  # the client said not to keep it (Responses' store: false)
        return
    caller = getattr(turn, "caller", "")  # each API key's turns go to its own partition
    service = memory.opened(caller)
    if service is None:  # a caller's first turn: opening its SQLite and git is not for the event loop
        threading.Thread(target=_capture_first, args=(memory, caller, turn), name="mlxrt-memory-open",
                         daemon=True).start()
        return
    _capture(service, turn).add_done_callback(_report_failure)


def _capture(service: Any, turn: Any) -> Any:
    return service.store.capture(dialect=turn.dialect, request_id=turn.request_id, model=turn.model,
                                 messages=list(turn.messages), content=turn.content, reasoning=turn.reasoning)


def _capture_first(memory: Any, caller: str, turn: Any) -> None:
    try:
        _capture(memory.partition(caller), turn).result()
    except Exception as exc:
        log.error("memory: a turn was not captured: %s", exc)


def _report_failure(done: Any) -> None:
    if done.exception() is not None:
        log.error("memory: a turn was not captured: %s", done.exception())


@hookimpl
def mlxrt_routes(host: PluginHost) -> list[Any]:
    from mlxrt_memory.routes import ROUTES

    return list(ROUTES)


@hookimpl
def mlxrt_register_commands(cli: Any) -> None:
    from mlxrt_memory.cli import register

    register(cli)
