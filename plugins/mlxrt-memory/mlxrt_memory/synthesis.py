"""One synthesis run: the stages in order, reported as events, one run at a time.

A run executes on a worker thread (SQLite, git and the model calls block) and reports
``{"type": "stage"|"log"|"done", "stage", "message"}`` events, then one ``summary`` (or one
``error``). Stopping (the client left) takes effect at the next stage boundary, so the store
and the vault only ever see whole stages; once wikify has written the vault, commit runs too,
so a stopped run never leaves the vault with uncommitted articles.
"""

from __future__ import annotations

import fcntl
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from mlxrt.errors import MlxrtError
from mlxrt_memory.editor import Editor
from mlxrt_memory.stages import STAGES, StageContext
from mlxrt_memory.store import MemoryStore
from mlxrt_memory.vault import Vault

__all__ = ["RunBusy", "MemoryFolderBusy", "MemoryService", "run_synthesis"]

LOCK_FILE = "memory.lock"

Emit = Callable[[dict[str, Any]], None]


class RunBusy(MlxrtError):
    """A synthesis run is already going (409)."""

    status = 409
    type = "conflict"

    def __init__(self) -> None:
        super().__init__("a memory synthesis run is already in progress; retry when it ends",
                         code="synthesis_running")


class MemoryFolderBusy(RuntimeError):
    """Another process holds the memory folder."""


@attrs.define
class MemoryService:
    """What the plugin keeps per server: the store, the vault and the one-run lock."""

    folder: Path
    store: MemoryStore
    vault: Vault
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    #: The latest events of the current (or last) run, for the status page.
    progress: list[dict[str, Any]] = attrs.field(factory=list)
    #: The running run's ``(task, stop flag)``, so shutdown can stop it and wait.
    active: Any = None

    #: The open lock file that makes this process the folder's only user.
    owner: Any = None

    @classmethod
    def open(cls, folder: Path) -> MemoryService:
        """Open (or create) the store and the vault in ``folder``, for this process alone.

        :raises MemoryFolderBusy: another server already uses the folder.
        """
        folder = folder.expanduser().resolve()
        folder.mkdir(parents=True, exist_ok=True)
        owner = (folder / LOCK_FILE).open("a")
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner.close()
            raise MemoryFolderBusy(f"{folder} is in use by another mlxrt server (one server per memory folder)") from None
        store = MemoryStore.open(folder)
        # A run still marked running was killed with its process: its finished items stay done.
        store.write(lambda c: c.execute("UPDATE runs SET status = 'interrupted' WHERE status = 'running'"))
        return cls(folder=folder, store=store, vault=Vault.open(folder), owner=owner)

    def close(self) -> None:
        self.store.close()
        if self.owner is not None:
            self.owner.close()  # releases the folder's lock
            self.owner = None

    def running(self) -> bool:
        return self.lock.locked()


def _event(type_: str, stage: str | None, message: str) -> dict[str, Any]:
    return {"type": type_, "stage": stage, "message": message}


def run_synthesis(service: MemoryService, editor: Editor, *, dry: bool, emit: Emit,
                  stopped: Callable[[], bool]) -> dict[str, Any]:
    """Run (or, ``dry``, plan) every stage; the caller holds ``service.lock``.

    Returns the summary event. A stage that raises ends the run: the exception propagates
    after the run is recorded as failed (its finished stages stay done).
    """
    store = service.store
    report: list[dict[str, Any]] = []
    if dry:
        for stage in STAGES:
            pending = int(store.scalar(stage.pending))
            emit(_event("stage", stage.name, f"planned: {pending} {stage.unit if pending != 1 else stage.unit.rstrip('s')} pending"))
            report.append({"stage": stage.name, "status": "planned", "pending": pending})
        return {"type": "summary", "implemented": True, "dry": True, "run": None, "stages": report,
                "commit": None, "note": "dry run: nothing was written"}

    run_id = store.write(lambda c: c.execute("INSERT INTO runs (started_at, status) VALUES (?, 'running')",
                                             (time.time(),)).lastrowid)
    ctx = StageContext(store=store, vault=service.vault, editor=editor, run_id=run_id,
                       log=lambda message: emit(_event("log", current, message)))
    status, current = "done", ""
    try:
        for stage in STAGES:
            current = stage.name
            if stopped() and not (stage.name == "commit" and report and report[-1]["stage"] == "wikify"):
                status = "stopped"
                break
            emit(_event("stage", stage.name, "running"))
            started = time.perf_counter()
            count = stage.run(ctx)
            took = time.perf_counter() - started
            emit(_event("done", stage.name, f"{count} {stage.unit} in {took:.2f} s"))
            report.append({"stage": stage.name, "status": "done", "count": count, "seconds": round(took, 3)})
    except BaseException as exc:
        status = "failed"
        _finish(store, run_id, status, {"stages": report, "error": f"{current}: {exc}"})
        raise
    head = store.scalar("SELECT commit_hash FROM runs WHERE id = ?", run_id)
    summary = {"type": "summary", "implemented": True, "dry": False, "run": run_id, "status": status,
               "stages": report, "commit": head, "counts": store.counts(),
               "note": "stopped at a stage boundary" if status == "stopped" else f"vault: {service.vault.root}"}
    _finish(store, run_id, status, summary)
    return summary


def _finish(store: MemoryStore, run_id: int, status: str, summary: dict[str, Any]) -> None:
    store.write(lambda c: c.execute("UPDATE runs SET finished_at = ?, status = ?, summary = ? WHERE id = ?",
                                    (time.time(), status, json.dumps(summary, default=str), run_id)))

