"""Model downloads through huggingface-hub, with progress every mlxrt process can see.

huggingface-hub does the work (``snapshot_download``: the standard cache layout, partial
files resumed from their ``.incomplete`` blobs, etags checked); mlxrt passes it a progress
bar class that also records the download's state in ``$MLXRT_HOME/downloads/<repo>.json``.
So ``GET /downloads`` of a running server shows a download that ``mlxrt get`` is doing in
another terminal, and one cut short shows as ``interrupted``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from mlxrt.errors import ModelLoadError
from mlxrt.loading.paths import MODEL_FILE_PATTERNS, hf_cache_dir, mlxrt_home

__all__ = ["DownloadStatus", "download", "recent_downloads", "downloads_dir"]

#: Downloads ``GET /downloads`` lists at most (the newest first).
RECENT = 5
#: Seconds between status-file writes while bytes arrive.
_WRITE_EVERY = 0.5


def downloads_dir() -> Path:
    return mlxrt_home() / "downloads"


@attrs.define
class DownloadStatus:
    """One download. ``state``: ``active``, ``done``, ``error`` or ``interrupted`` (its process
    ended without finishing). Times are unix seconds; ``bytes_per_sec`` is the average so far."""

    repo_id: str
    started_at: float
    pid: int
    state: str = "active"
    revision: str | None = None
    received_bytes: int = 0
    total_bytes: int = 0
    files_done: int = 0
    files_total: int = 0
    bytes_per_sec: float = 0.0
    finished_at: float | None = None
    path: str | None = None
    error: str | None = None

    @property
    def file(self) -> Path:
        return downloads_dir() / (self.repo_id.replace("/", "--") + ".json")

    def save(self) -> None:
        folder = downloads_dir()
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{self.file.name}.{self.pid}.tmp"
        tmp.write_text(json.dumps(attrs.asdict(self)), encoding="utf-8")
        os.replace(tmp, self.file)  # readers never see half a file


class _Tracker:
    """Counts what huggingface-hub's progress bars report and saves it, at most every
    :data:`_WRITE_EVERY` seconds. Counts are kept here: a disabled bar does not count."""

    def __init__(self, status: DownloadStatus) -> None:
        self.status = status
        self.bars: dict[int, tuple[str, Any]] = {}
        self.counts: dict[int, float] = {}
        self.last_write = 0.0

    def opened(self, bar: Any, kind: str, initial: float) -> None:
        self.bars[id(bar)] = (kind, bar)
        self.counts[id(bar)] = initial
        self.changed(force=True)

    def advanced(self, bar: Any, n: float) -> None:
        self.counts[id(bar)] = self.counts.get(id(bar), 0) + (n or 0)
        self.changed()

    def changed(self, force: bool = False) -> None:
        st = self.status
        for key, (kind, bar) in self.bars.items():
            if kind == "bytes":
                st.received_bytes, st.total_bytes = int(self.counts[key]), int(bar.total or 0)
            elif kind == "files":
                st.files_done, st.files_total = int(self.counts[key]), int(bar.total or 0)
        elapsed = time.time() - st.started_at
        st.bytes_per_sec = round(st.received_bytes / elapsed, 1) if elapsed > 0 else 0.0
        now = time.monotonic()
        if force or now - self.last_write >= _WRITE_EVERY:
            self.last_write = now
            st.save()

    def progress_class(self) -> type:
        from huggingface_hub.utils import tqdm as hf_tqdm

        tracker = self

        class Progress(hf_tqdm):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                desc = str(kwargs.get("desc") or "")
                if kwargs.get("unit") != "B":
                    kind = "files"
                elif desc.startswith("Downloading bytes"):  # xet network transfer: not file bytes
                    kind = "transfer"
                else:
                    kind = "bytes"
                tracker.opened(self, kind, kwargs.get("initial") or 0)

            def update(self, n: float | None = 1) -> bool | None:
                tracker.advanced(self, n or 0)
                return super().update(n)

        return Progress


def download(repo_id: str, *, revision: str | None = None, all_files: bool = False,
             fetch: Callable[..., Any] | None = None) -> Path:
    """Download (or finish downloading) ``repo_id`` into the HF cache; returns the snapshot.

    :param all_files: Every file of the repo, not just what a model needs
        (:data:`mlxrt.loading.paths.MODEL_FILE_PATTERNS`).
    :param fetch: ``snapshot_download`` or a stand-in with its signature (tests).
    :raises ModelLoadError: Offline, unknown repo, no access, network failure — the message
        says which and what to do.
    """
    if fetch is None:
        from huggingface_hub import snapshot_download as fetch
    status = DownloadStatus(repo_id=repo_id, started_at=time.time(), pid=os.getpid(), revision=revision)
    tracker = _Tracker(status)
    status.save()
    try:
        path = fetch(repo_id, revision=revision, allow_patterns=None if all_files else MODEL_FILE_PATTERNS,
                     cache_dir=hf_cache_dir(), tqdm_class=tracker.progress_class())
    except KeyboardInterrupt:
        _finish(tracker, "interrupted", error="interrupted; run the same command again to resume")
        raise
    except Exception as exc:
        message = _explain(repo_id, exc)
        _finish(tracker, "error", error=message)
        raise ModelLoadError(message, code="download_failed") from exc
    _finish(tracker, "done", path=str(path))
    return Path(path)


def _finish(tracker: _Tracker, state: str, **fields: Any) -> None:
    tracker.changed(force=False)
    st = tracker.status
    st.state, st.finished_at = state, time.time()
    for key, value in fields.items():
        setattr(st, key, value)
    st.save()


def _explain(repo_id: str, exc: Exception) -> str:
    from huggingface_hub import errors

    name = type(exc).__name__
    if isinstance(exc, (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError)):
        return (f"cannot download {repo_id}: offline (HF_HUB_OFFLINE is set, or the hub is unreachable) and "
                f"it is not complete in the local cache ({name}: {exc})")
    if isinstance(exc, errors.GatedRepoError):
        return f"cannot download {repo_id}: the repo is gated; accept its terms on huggingface.co and log in ({exc})"
    if isinstance(exc, errors.RepositoryNotFoundError):
        return f"cannot download {repo_id}: no such repo on the hub, or it is private ({exc})"
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"cannot download {repo_id}: no such revision ({exc})"
    if isinstance(exc, errors.HFValidationError):
        return f"{repo_id!r} is not a valid Hugging Face repo id ({exc})"
    return (f"cannot download {repo_id} ({name}: {exc}); what arrived is kept and the same command "
            "resumes it")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recent_downloads(limit: int = RECENT) -> list[DownloadStatus]:
    """The newest downloads any mlxrt process recorded; an ``active`` one whose process is gone
    is ``interrupted``."""
    out = []
    try:
        files = list(downloads_dir().glob("*.json"))
    except OSError:
        return []
    for path in files:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            status = DownloadStatus(**{f.name: data[f.name] for f in attrs.fields(DownloadStatus) if f.name in data})
        except (OSError, ValueError, TypeError):
            continue
        if status.state == "active" and not _alive(status.pid):
            status.state = "interrupted"
        out.append(status)
    out.sort(key=lambda s: s.started_at, reverse=True)
    return out[:limit]
