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
import os
import re
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

__all__ = ["RunBusy", "MemoryFolderBusy", "MemoryFolder", "MemoryService", "run_synthesis", "claim_folder",
           "private_dir"]

LOCK_FILE = "memory.lock"
#: Where the partitions of callers with an API key live (the key-less one is the folder itself).
CALLERS_DIR = "callers"
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600

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


def private_dir(path: Path) -> Path:
    """``path`` and the missing folders above it, created 0700 (an existing folder above is the
    user's and left as it is); ``path`` itself is tightened to 0700 when it exists."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=PRIVATE_DIR, exist_ok=True)
    os.chmod(path, PRIVATE_DIR)
    return path


def claim_folder(folder: Path) -> Any:
    """Lock ``folder`` for this process: the open lock file (closing it releases the lock).

    :raises MemoryFolderBusy: another server already uses the folder.
    """
    private_dir(folder)
    owner = os.fdopen(os.open(folder / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE), "a")
    try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner.close()
        raise MemoryFolderBusy(f"memory folder {folder} is in use by another mlxrt server (one server per "
                               "memory folder; stop it or pick another --memory-dir)") from None
    return owner


@attrs.define
class MemoryService:
    """One caller's memory: its store, its vault and its one-run lock (a partition of the
    server's :class:`MemoryFolder`)."""

    folder: Path
    store: MemoryStore
    vault: Vault
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    #: The latest events of the current (or last) run, for the status page.
    progress: list[dict[str, Any]] = attrs.field(factory=list)
    #: The running run's ``(task, stop flag)``, so shutdown can stop it and wait.
    active: Any = None

    @classmethod
    def open(cls, folder: Path) -> MemoryService:
        """Open (or create) the store and the vault in ``folder`` (0700, its files 0600); the
        caller holds the folder (:func:`claim_folder`)."""
        private_dir(folder)
        store = MemoryStore.open(folder)
        # A run still marked running was killed with its process: its finished items stay done.
        store.write(lambda c: c.execute("UPDATE runs SET status = 'interrupted' WHERE status = 'running'"))
        return cls(folder=folder, store=store, vault=Vault.open(folder))

    def close(self) -> None:
        self.store.close()

    def running(self) -> bool:
        return self.lock.locked()


class MemoryFolder:
    """The ``--memory-dir`` of one server: one partition (:class:`MemoryService`) per caller.

    A server without API keys has one caller, ``""``, whose partition is the folder itself; each
    API key's is ``callers/<first 32 hex digits of its digest>/`` (the key is never written).
    A caller's turns, runs, events and vault are its own: nothing of one partition is read for
    another. Partitions open on first use; the folder is locked for this process alone.
    """

    def __init__(self, root: Path, owner: Any) -> None:
        self.root = root
        self._owner = owner
        self._lock = threading.Lock()
        self._parts: dict[str, MemoryService] = {}

    @classmethod
    def open(cls, folder: Path) -> MemoryFolder:
        """Claim ``folder`` (:func:`claim_folder`) and open the key-less partition.

        :raises MemoryFolderBusy: another server already uses the folder.
        """
        root = folder.expanduser().resolve()
        owner = claim_folder(root)
        memory = cls(root, owner)
        try:
            memory.partition("")
        except BaseException:
            memory.close()
            raise
        return memory

    def folder_of(self, caller: str) -> Path:
        if not caller:
            return self.root
        if not re.fullmatch(r"[0-9a-f]{64}", caller):
            raise ValueError("a caller is the hex SHA-256 digest of an API key")
        return self.root / CALLERS_DIR / caller[:32]

    def partition(self, caller: str) -> MemoryService:
        """``caller``'s partition, opened (created 0700) on first use."""
        with self._lock:
            service = self._parts.get(caller)
            if service is None:
                if self._owner is None:
                    raise RuntimeError("the memory folder is closed (the server is stopping)")
                folder = self.folder_of(caller)
                if caller:
                    private_dir(self.root / CALLERS_DIR)
                service = self._parts[caller] = MemoryService.open(folder)
            return service

    def opened(self, caller: str) -> MemoryService | None:
        """``caller``'s partition if it is open already (no disk access)."""
        with self._lock:
            return self._parts.get(caller)

    def partitions(self) -> list[MemoryService]:
        with self._lock:
            return list(self._parts.values())

    def close(self) -> None:
        with self._lock:
            owner, self._owner = self._owner, None  # no partition opens from here on
        for service in self.partitions():
            service.close()
        if owner is not None:
            owner.close()  # releases the folder's lock


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

