"""The memory store: one SQLite file (WAL) holding captured turns and every stage's output.

One writer: all writes run on the store's own thread, one transaction each, in the order they
were submitted (capture from the event loop, a synthesis run from its worker thread), so two
writers never race for SQLite's lock. Reads open their own connection and never wait for the
writer (WAL). Each stage records its outputs and marks its inputs done in the same
transaction: a run killed at any point leaves every item either fully done or untouched, and
the next run picks up exactly what is left.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # imported where a connection opens: registering the routes does not load sqlite3
    import sqlite3

__all__ = ["MemoryStore", "STORE_FILE", "SCHEMA"]

T = TypeVar("T")

STORE_FILE = "memory.sqlite3"

SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY, captured_at REAL NOT NULL, dialect TEXT NOT NULL,
    request_id TEXT NOT NULL UNIQUE, model TEXT NOT NULL, messages TEXT NOT NULL,
    content TEXT NOT NULL, reasoning TEXT NOT NULL);
-- ingest: the new text of one turn (its last user message and the answer)
CREATE TABLE IF NOT EXISTS documents (
    turn_id INTEGER PRIMARY KEY REFERENCES turns(id), text TEXT NOT NULL,
    segmented INTEGER NOT NULL DEFAULT 0);
-- segment
CREATE TABLE IF NOT EXISTS segments (
    id INTEGER PRIMARY KEY, turn_id INTEGER NOT NULL REFERENCES documents(turn_id),
    idx INTEGER NOT NULL, text TEXT NOT NULL, extracted INTEGER NOT NULL DEFAULT 0,
    UNIQUE (turn_id, idx));
-- extract (entity, kind, fact); route (slug, action); section-route (section); patch (patched)
CREATE TABLE IF NOT EXISTS facts (
    id INTEGER PRIMARY KEY, segment_id INTEGER NOT NULL REFERENCES segments(id),
    entity TEXT NOT NULL, kind TEXT NOT NULL, fact TEXT NOT NULL,
    slug TEXT, action TEXT, section TEXT, patched INTEGER NOT NULL DEFAULT 0,
    UNIQUE (segment_id, entity, fact));
-- create
CREATE TABLE IF NOT EXISTS articles (
    slug TEXT PRIMARY KEY, title TEXT NOT NULL, kind TEXT NOT NULL, summary TEXT NOT NULL,
    created_run INTEGER);
CREATE TABLE IF NOT EXISTS sections (
    slug TEXT NOT NULL REFERENCES articles(slug), heading TEXT NOT NULL, position INTEGER NOT NULL,
    body TEXT NOT NULL DEFAULT '', PRIMARY KEY (slug, heading));
-- link
CREATE TABLE IF NOT EXISTS links (src TEXT NOT NULL, dst TEXT NOT NULL, PRIMARY KEY (src, dst));
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, started_at REAL NOT NULL, finished_at REAL, status TEXT NOT NULL,
    commit_hash TEXT, summary TEXT);
"""


class MemoryStore:
    """The SQLite store under a memory folder; :meth:`open` starts its writer thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._jobs: queue.Queue[tuple[Callable[[sqlite3.Connection], Any], Future[Any]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    @classmethod
    def open(cls, folder: Path) -> MemoryStore:
        folder.mkdir(parents=True, exist_ok=True)
        store = cls(folder / STORE_FILE)
        # Everything said to the server is in this file: 0600 before SQLite first writes it
        # (its -wal and -shm files take the database's mode), tightened if it exists.
        os.close(os.open(store.path, os.O_RDWR | os.O_CREAT, 0o600))
        os.chmod(store.path, 0o600)
        for extra in ("-wal", "-shm"):
            if (side := store.path.with_name(store.path.name + extra)).exists():
                os.chmod(side, 0o600)
        import sqlite3

        with closing(sqlite3.connect(store.path)) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(SCHEMA)
        store._thread = threading.Thread(target=store._writer, name="mlxrt-memory-writer", daemon=True)
        store._thread.start()
        return store

    def close(self) -> None:
        """Finish the queued writes, then stop the writer."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    # -- writes ---------------------------------------------------------------------------------

    def _writer(self) -> None:
        import sqlite3

        conn = sqlite3.connect(self.path, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA foreign_keys=ON")
        try:
            while (job := self._jobs.get()) is not None:
                fn, done = job
                try:
                    with conn:  # one transaction: committed on return, rolled back on error
                        result = fn(conn)
                except BaseException as exc:
                    done.set_exception(exc)
                else:
                    done.set_result(result)
        finally:
            conn.close()

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Queue ``fn(conn)`` to run in one transaction on the writer thread."""
        if self._thread is None:
            raise RuntimeError("the memory store is closed")
        done: Future[T] = Future()
        self._jobs.put((fn, done))
        return done

    def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` in one transaction on the writer thread and wait for it."""
        return self.submit(fn).result()

    def capture(self, *, dialect: str, request_id: str, model: str, messages: Any, content: str,
                reasoning: str) -> Future[Any]:
        """Queue one finished turn (a request id seen before is ignored)."""
        row = (time.time(), dialect, request_id, model, json.dumps(messages, ensure_ascii=False, default=str),
               content, reasoning)
        return self.submit(lambda conn: conn.execute(
            "INSERT OR IGNORE INTO turns (captured_at, dialect, request_id, model, messages, content, reasoning)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)", row))

    # -- reads ----------------------------------------------------------------------------------

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """A read-only connection (WAL: it never waits for the writer)."""
        import sqlite3

        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()

    def rows(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        with self.reading() as conn:
            return conn.execute(sql, args).fetchall()

    def scalar(self, sql: str, *args: Any) -> Any:
        with self.reading() as conn:
            row = conn.execute(sql, args).fetchone()
        return None if row is None else row[0]

    def counts(self) -> dict[str, int]:
        """How much the store holds, and how much of it a synthesis run has not used yet."""
        q = {
            "turns": "SELECT COUNT(*) FROM turns",
            "turns_pending": "SELECT COUNT(*) FROM turns WHERE id NOT IN (SELECT turn_id FROM documents)",
            "segments": "SELECT COUNT(*) FROM segments",
            "facts": "SELECT COUNT(*) FROM facts",
            "facts_pending": "SELECT COUNT(*) FROM facts WHERE patched = 0",
            "articles": "SELECT COUNT(*) FROM articles",
            "links": "SELECT COUNT(*) FROM links",
            "runs": "SELECT COUNT(*) FROM runs",
        }
        return {name: int(self.scalar(sql)) for name, sql in q.items()}
