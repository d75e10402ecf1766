"""The prompt cache on disk: prefix KV entries that survive a restart (``--prompt-cache-dir``).

:class:`PersistentPromptCache` is the in-memory :class:`~mlxrt.cache.prompt_cache.PromptCache` with
a second tier under ``DIR/<fingerprint>/``:

* **What is written.** Every entry the memory cache stores is also written, as one
  safetensors file in mlx-lm's prompt-cache layout (``mlx_lm.models.cache.load_prompt_cache``
  reads it), with the token ids, the adapter set and the model fingerprint in its metadata.
  An entry whose tokens another file of the same key already covers is not written again; a
  new file that covers older ones replaces them.
* **Off the decode path.** The worker copies the cache arrays to host memory when the entry
  is stored (after the request's last event went out) and a writer thread writes them:
  a temporary file, ``fsync``, then ``os.replace`` (a reader never sees half a file).
* **Keys.** The folder name is the model fingerprint: ``config.json`` and sampled bytes of
  every weight file (names, sizes, three 1 MiB samples), the ``--dtype`` cast, the KV
  quantization and the draft model (its own fingerprint). Within it each file carries the
  adapter set: the adapter ids and the same fingerprint of each adapter's folder, so an id
  that now names other weights never gets the old KV; and the partition (the caller's API-key
  digest, ``""`` without keys), so after a restart too a key only gets its own entries (files
  written before partitions existed belong to ``""``, which no key's requests use).
* **Lazy restore.** At start-up only the files' headers are read (token ids, key). A lookup
  that the disk can serve better than memory loads that one file into the memory cache and
  is served from there (``cached_tokens`` then counts it). A file is checked before use: its
  fingerprint, its layer count and classes, every layer's length and the shapes and dtypes of
  its arrays against the model's own cache.
* **Never fatal.** A file that cannot be read, belongs to another model or fails a check is
  ignored with a warning (and left alone); the server starts and serves without it.
* **Size cap.** ``--prompt-cache-dir-size`` (GB): after each write the least recently used
  files (by modification time; a restore touches its file) are deleted until the folder fits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import attrs

from mlxrt.cache.prompt_cache import PromptCache, common_prefix, token_array
from mlxrt.cache.prompt_files import (
    DTYPES,
    PRIVATE_FILE,
    compact_state,
    fingerprint_folder,
    host_copy,
    model_fingerprint,
    private_folder,
    read_metadata,
    scalar_copy,
    signature,
    write_safetensors,
)
from mlxrt.cache.token_ids import TokenIds

__all__ = ["PersistentPromptCache", "open_prompt_cache"]

log = logging.getLogger("mlxrt.cache.prompt_store")

#: Host copies waiting for the writer at most; past it new entries stay in memory only, so a
#: slow disk never piles up copies of the KV in RAM.
MAX_PENDING = 4


@attrs.define(eq=False)
class _File:
    path: Path
    tokens: TokenIds
    key: tuple[str, ...]
    partition: str
    adapters: str  # the adapter set's identity when written
    trimmable: bool
    size: int
    used: float


class PersistentPromptCache(PromptCache):
    """A :class:`PromptCache` whose entries are also kept in ``directory/fingerprint``.

    Args:
        directory: ``--prompt-cache-dir``.
        fingerprint: :func:`model_fingerprint` of the served configuration.
        reference: A cache of the served model(s) holding one token: the layer classes and
            array shapes a restored file must match.
        max_disk_bytes: ``--prompt-cache-dir-size``: bytes the folder may hold.
        adapter_identity: The identity of an adapter set (``None``: one of them is not
            mounted, so nothing is written or restored for it).
        check_shapes: False when caches change form while decoding (quantized KV), so only
            the layer count and lengths are checked.
        max_entries, max_bytes: The memory tier's bounds (:class:`PromptCache`).
    """

    def __init__(self, directory: str | os.PathLike, fingerprint: str, *, reference: list[Any],
                 max_disk_bytes: int, adapter_identity: Callable[[tuple[str, ...]], str | None],
                 check_shapes: bool = True, max_entries: int = 10, max_bytes: int = 1 << 62) -> None:
        super().__init__(max_entries=max_entries, max_bytes=max_bytes)
        self.fingerprint = fingerprint
        self.folder = private_folder(directory, fingerprint)
        self.max_disk_bytes = max_disk_bytes
        self._identity = adapter_identity
        self._signature = [signature(layer) for layer in reference] if check_shapes else None
        self._layers = len(reference)
        self._classes = [type(layer).__name__ for layer in reference]
        self._files: list[_File] = []
        self._lock = threading.Lock()  # _files: the worker reads it, the writer thread changes it
        self._queue: queue.Queue[Any] = queue.Queue()
        self._writer: threading.Thread | None = None
        self.restored = 0
        self.written = 0
        self.ignored = 0
        self.write_seconds = 0.0
        self.copy_seconds = 0.0
        self._scan()

    # -- the memory tier's interface -------------------------------------------------------------

    def fetch(self, tokens: Sequence[int], key: Hashable = (), partition: str = "") -> Any:
        if self._files and self.enabled:
            self._restore_better(token_array(tokens), key, partition)
        return super().fetch(tokens, key, partition)

    def insert(self, tokens: Sequence[int], cache: list[Any], key: Hashable = (), partition: str = "") -> None:
        super().insert(tokens, cache, key, partition)  # validates the lengths and evaluates the arrays
        if not self.enabled or not len(tokens) or not isinstance(key, tuple):
            return
        identity = self._identity(key)
        if identity is not None:
            self._persist(token_array(tokens), cache, key, partition, identity)

    def close(self) -> None:
        """Finish the writes already queued (the engine calls it when it stops)."""
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=60)
            self._writer = None

    def stats(self) -> dict[str, Any]:
        with self._lock:
            files, size = len(self._files), sum(f.size for f in self._files)
        return {**super().stats(), "disk": {
            "folder": str(self.folder), "files": files, "bytes": size, "max_bytes": self.max_disk_bytes,
            "restored": self.restored, "written": self.written, "ignored": self.ignored,
            "write_seconds": round(self.write_seconds, 4), "copy_seconds": round(self.copy_seconds, 4),
        }}

    # -- reading -----------------------------------------------------------------------------------

    def _scan(self) -> None:
        for stale in self.folder.glob(".*.tmp*"):  # a write cut short by a crash
            stale.unlink(missing_ok=True)
        for path in sorted(self.folder.glob("*.safetensors")):
            try:
                os.chmod(path, PRIVATE_FILE)  # entries written before files were made private
                meta = read_metadata(path)
                if meta.get("0.mlxrt_fingerprint") != self.fingerprint:
                    raise ValueError(f"it belongs to another model (fingerprint "
                                     f"{meta.get('0.mlxrt_fingerprint')!r}, this model's is {self.fingerprint!r})")
                tokens = TokenIds(int(t) for t in meta["0.mlxrt_tokens"].split(","))
                key = tuple(json.loads(meta["0.mlxrt_key"]))
                stat = path.stat()
                entry = _File(path, tokens, key, meta.get("0.mlxrt_partition", ""), meta["0.mlxrt_adapters"], meta["0.mlxrt_trimmable"] == "1",
                              stat.st_size, stat.st_mtime)
            except Exception as exc:  # any unreadable or foreign file: skipped, never fatal
                self._ignore(path, exc)
                continue
            self._files.append(entry)
        if self._files:
            log.info("prompt cache: %d entries on disk in %s (restored when a prompt needs them)",
                     len(self._files), self.folder)

    def _ignore(self, path: Path, why: Any) -> None:
        self.ignored += 1
        log.warning("prompt cache: ignoring %s: %s", path, why)

    def _restore_better(self, prompt: TokenIds, key: Hashable, partition: str) -> None:
        """Load the file that covers more of ``prompt`` than memory does, into memory (the
        longest cover first, ties to the most recently used; a file that fails its checks is
        dropped and the next one tried)."""
        limit = prompt.size - 1
        floor = self.reusable(prompt, key, partition)
        identity = None
        with self._lock:
            files = list(self._files)
        candidates = []
        for entry in files:
            if entry.key != key or entry.partition != partition:
                continue
            usable = min(common_prefix(entry.tokens, prompt), limit)
            if usable > floor and (usable == entry.tokens.size or entry.trimmable):
                if identity is None:
                    identity = self._identity(key) or ""
                if entry.adapters == identity:
                    candidates.append((usable, entry))
        candidates.sort(key=lambda c: (-c[0], -c[1].used))
        for _usable, entry in candidates:
            cache = self._load(entry)
            if cache is not None:
                super().insert(entry.tokens, cache, key, partition)  # not written again: it is on disk
                self.restored += 1
                return

    def _load(self, entry: _File) -> list[Any] | None:
        import mlx.core as mx
        from mlx_lm.models.cache import load_prompt_cache

        try:
            cache, meta = load_prompt_cache(str(entry.path), return_metadata=True)
            problem = self._check(cache, entry)
            if problem is None:
                mx.eval([layer.state for layer in cache])
        except Exception as exc:  # a file changed or damaged since the scan
            problem = f"cannot be loaded: {type(exc).__name__}: {exc}"
        if problem is not None:
            self._ignore(entry.path, problem)
            with self._lock:
                if entry in self._files:
                    self._files.remove(entry)
            return None
        os.utime(entry.path)
        entry.used = time.time()
        return cache

    def _check(self, cache: list[Any], entry: _File) -> str | None:
        if len(cache) != self._layers:
            return f"it has {len(cache)} cache layers, this model has {self._layers}"
        classes = [type(layer).__name__ for layer in cache]
        if self._signature is not None and classes != self._classes:
            return f"its cache layers are {sorted(set(classes))}, this model's are {sorted(set(self._classes))}"
        for i, layer in enumerate(cache):
            offset = getattr(layer, "offset", None)
            if isinstance(offset, int) and offset != entry.tokens.size:
                return f"layer {i} holds {offset} tokens, the file names {entry.tokens.size}"
            if self._signature is not None and signature(layer) != self._signature[i]:
                return f"layer {i}'s arrays {signature(layer)} do not fit this model's {self._signature[i]}"
        return None

    # -- writing -----------------------------------------------------------------------------------

    def _persist(self, tokens: TokenIds, cache: list[Any], key: tuple[str, ...], partition: str,
                 identity: str) -> None:
        from mlx.utils import tree_flatten
        from mlx_lm.models.cache import can_trim_prompt_cache

        if self._queue.qsize() >= MAX_PENDING:
            log.debug("prompt cache: %d writes pending; this entry is kept in memory only", MAX_PENDING)
            return
        trimmable = can_trim_prompt_cache(cache)
        with self._lock:
            for old in self._files:
                if old.key == key and old.partition == partition and old.adapters == identity and old.tokens.size >= tokens.size \
                        and common_prefix(old.tokens, tokens) == tokens.size \
                        and (old.tokens.size == tokens.size or old.trimmable):
                    return  # a file on disk already serves every prompt this entry could
        started = time.perf_counter()
        metadata = {"0.mlxrt_fingerprint": self.fingerprint, "0.mlxrt_tokens": ",".join(map(str, tokens.tolist())),
                    "0.mlxrt_key": json.dumps(list(key)), "0.mlxrt_partition": partition,
                    "0.mlxrt_adapters": identity,
                    "0.mlxrt_trimmable": "1" if trimmable else "0", "2.0": ""}
        metadata.update({f"1.{i}": type(layer).__name__ for i, layer in enumerate(cache)})
        arrays = {}
        # mlx-lm's layout: arrays by tree path; plain ints (a layer's offset, a sliding window's
        # size and position) as 0-d arrays and None (an unused slot of recurrent state) as an
        # empty one, listed under "scalars" (metadata 2.*), which load_prompt_cache turns back.
        for name, value in tree_flatten([compact_state(layer) for layer in cache]):
            if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
                n = len([k for k in metadata if k.startswith("2.")]) // 2 + 1
                metadata.update({f"2.{n}.0": name, f"2.{n}.1": "none" if value is None else "scalar"})
                arrays[name] = scalar_copy(value)
            elif hasattr(value, "dtype") and str(value.dtype).removeprefix("mlx.core.") in DTYPES:
                arrays[name] = host_copy(value)
            else:
                log.debug("prompt cache: an entry with state of type %s is kept in memory only", type(value))
                return
        self.copy_seconds += time.perf_counter() - started
        name = hashlib.sha256(json.dumps([list(key), partition, identity]).encode() + tokens.tobytes()).hexdigest()[:32]
        entry = _File(self.folder / f"{name}.safetensors", tokens, key, partition, identity, trimmable, 0, 0.0)
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="mlxrt-prompt-store", daemon=True)
            self._writer.start()
        self._queue.put((entry, arrays, metadata))

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            entry, arrays, metadata = item
            started = time.perf_counter()
            try:
                entry.size = write_safetensors(entry.path, arrays, metadata)
            except OSError as exc:
                log.warning("prompt cache: cannot write %s: %s", entry.path, exc)
                continue
            entry.used = time.time()
            self.write_seconds += time.perf_counter() - started
            self.written += 1
            self._settle(entry)

    def _settle(self, new: _File) -> None:
        """Index a written file, drop the files it covers, then keep the folder under its cap."""
        with self._lock:
            for old in list(self._files):
                covered = (old.key == new.key and old.partition == new.partition and old.adapters == new.adapters
                           and old.path != new.path
                           and old.tokens.size <= new.tokens.size
                           and common_prefix(old.tokens, new.tokens) == old.tokens.size
                           and (old.tokens.size == new.tokens.size or new.trimmable))
                if covered or old.path == new.path:
                    self._files.remove(old)
                    if covered:
                        old.path.unlink(missing_ok=True)
            self._files.append(new)
            self._files.sort(key=lambda f: f.used)
            while self._files and sum(f.size for f in self._files) > self.max_disk_bytes:
                oldest = self._files.pop(0)
                oldest.path.unlink(missing_ok=True)


def open_prompt_cache(directory: str | None, *, max_entries: int, max_bytes: int, max_disk_bytes: int,
                      model_path: Path | None, models: Sequence[Any], dtype: str | None = None,
                      kv: Any = None, draft_path: Path | None = None, adapters: Any = None) -> PromptCache:
    """The engine's prompt cache: persistent under ``directory`` when one is given (and the
    memory cache is on), else the plain in-memory one. Runs on the engine's worker.

    ``models`` are the served model and, with ``--draft-model``, the draft (a combined cache
    holds both, in that order); ``adapters`` is the engine's adapter registry.
    """
    if directory is None:
        return PromptCache(max_entries=max_entries, max_bytes=max_bytes)
    if max_entries == 0 or max_bytes == 0 or model_path is None:
        log.warning("--prompt-cache-dir %s: the prompt cache is off (or the model has no folder); "
                    "nothing is persisted", directory)
        return PromptCache(max_entries=max_entries, max_bytes=max_bytes)
    known: dict[str, str] = {}

    def identity(key: tuple[str, ...]) -> str | None:
        parts = []
        for name in key:
            adapter = adapters.get(name) if adapters is not None else None
            if adapter is None:
                return None
            if adapter.path not in known:
                known[adapter.path] = fingerprint_folder(adapter.path)
            parts.append(f"{name}={known[adapter.path]}")
        return ";".join(parts)

    fingerprint = model_fingerprint(model_path, dtype=dtype, kv=kv, draft_path=draft_path)
    try:
        return PersistentPromptCache(directory, fingerprint, reference=_reference_cache(models),
                                     max_disk_bytes=max_disk_bytes, adapter_identity=identity,
                                     check_shapes=kv is None, max_entries=max_entries, max_bytes=max_bytes)
    except OSError as exc:
        from mlxrt.errors import ModelLoadError

        raise ModelLoadError(f"--prompt-cache-dir {directory}: cannot use it: {exc.strerror or exc}") from exc


def _reference_cache(models: Sequence[Any]) -> list[Any]:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    combined: list[Any] = []
    for model in models:
        cache = make_prompt_cache(model)
        model(mx.array([[0]]), cache=cache)
        mx.eval([layer.state for layer in cache])
        combined += cache
    return combined
