"""Several models served by one process: which engine answers a request's ``model``.

The :class:`ModelPool` is the one place a request's ``model`` is resolved, in this order:

1. empty or ``default``: the served model (the one ``mlxrt serve MODEL`` names);
2. an ``--model-alias NAME=MODEL`` name;
3. the id, the start-up spelling or the folder of a model named at start (served model,
   ``--preload``, alias targets) or loaded since;
4. unless the server is strict (``--strict-model``): any *local* model, as ``mlxrt serve``
   resolves it (a folder, a ``.gguf`` file, a Hugging Face cache repo id or a unique part of
   one). Never a download.

Anything else is answered by the served model (the *fallback*, reported: the response's
``model`` is the served model's id, the header ``x-mlxrt-model-fallback`` names what was asked
for, and the log says it once per distinct name), or, on a strict server, is
:class:`~mlxrt.errors.ModelNotFound` (404) unless ``--model-fallback`` asks for the fallback
there too. A name that is no possible path (too long, a NUL byte) never reaches the filesystem.
Each resident model has its own :class:`~mlxrt.engine.engine.Engine` (lane,
prompt cache, adapters, family profile, self-test) on the one shared plugin host, and its own
:class:`~mlxrt.serving.ServedModel` (:func:`mlxrt.serving.serve`): what routes get from
:meth:`ModelPool.model_for` and what every hook about that model is given as ``model``.

At most ``--max-models`` are resident; loading another evicts the least recently used *idle*
one (no request holds it, nothing queued or running). ``--idle-unload`` unloads models
nobody used for that long. With ``--memory-budget`` every resident model is planned on an
equal share of it (budget / max-models), so admission of all of them together never exceeds
the budget; a model whose weights cannot fit its share is refused before any weight loads.
Concurrent requests for one cold model wait for a single load. The pool's state lives on the
event loop (no locks): loads and unloads run on worker threads and are awaited.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import math
import time
from collections.abc import Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.errors import (
    InvalidRequest,
    MlxrtError,
    ModelLoadError,
    ModelNotFound,
    ModelUnavailable,
    QueueFull,
)
from mlxrt.loading.resolve import ModelSource
from mlxrt.serving import serve

if TYPE_CHECKING:
    from mlxrt.records import FamilyProfile, ModelInfo
    from mlxrt.registry import PluginHost
    from mlxrt.serving import ServedModel, ServingEngine

__all__ = ["ModelPool", "PoolSettings", "Slot", "LEASES_KEY", "FALLBACK_HEADER", "releasing_leases"]

log = logging.getLogger("mlxrt.models")

#: Names that mean the served model.
DEFAULT_NAMES = frozenset({"", "default"})
#: Where a request's model leases are kept in its ASGI scope until the response is sent.
LEASES_KEY = "mlxrt.model_leases"
#: Where the name a request asked for is kept in its ASGI scope when the served model answers it.
FALLBACK_KEY = "mlxrt.model_fallback"
#: The response header that names the model a request asked for when the served model answered.
FALLBACK_HEADER = "x-mlxrt-model-fallback"
#: Distinct fallback names remembered so that each is logged once (then the memory starts over).
FALLBACK_NAMES_KEPT = 1024
#: Spellings of one model's name kept (``./m``, ``m/``, ``/abs/m``…, each resolved once): the
#: oldest is forgotten past it, and resolved again if asked for (4,000 spellings kept 12 MB).
SPELLINGS_KEPT = 16
#: Models found on disk by a request (not named at start) kept while not resident: the least
#: recently used is forgotten past it.
FOUND_KEPT = 64
#: Seconds a request waits for a resident model to become idle (all --max-models busy).
BUSY_WAIT = 60.0


@attrs.frozen
class PoolSettings:
    """The ``mlxrt serve`` flags the pool follows.

    :ivar max_models: Models resident at once (``--max-models``).
    :ivar idle_unload: Seconds of disuse after which a model is unloaded, or ``None``.
    :ivar strict: Only models named at start may be served (``--strict-model``).
    :ivar fallback: Unknown names get the served model instead of 404: always unless strict;
        on a strict server with ``--model-fallback``.
    :ivar memory_budget: Bytes all resident models share (``--memory-budget``), or ``None``.
    """

    max_models: int = 1
    idle_unload: float | None = None
    strict: bool = False
    fallback: bool = True
    memory_budget: int | None = None

    @property
    def share(self) -> int | None:
        """Bytes each resident model is planned on."""
        return self.memory_budget // self.max_models if self.memory_budget is not None else None


@attrs.define(eq=False)
class Slot:
    """One model the pool knows: resident (``engine`` and ``model`` set) or not."""

    source: ModelSource
    primary: bool = False
    named: bool = False  # named at start (served, --preload, an alias target)
    state: str = "unloaded"  # unloaded | loading | ready
    engine: ServingEngine | None = None
    #: The resident model as routes and hooks see it (``None`` while unloaded).
    model: ServedModel | None = None
    profile: FamilyProfile | None = None  # the family profile of its last load (kept while unloaded)
    loading: asyncio.Task[None] | None = None
    leases: int = 0
    last_used: float = 0.0
    load_started: float | None = None
    load_seconds: float | None = None
    loads: int = 0
    last_error: str | None = None
    #: Seconds of disuse before it is unloaded, as a client asked (Ollama's ``keep_alive``;
    #: ``math.inf``: never), over ``--idle-unload``; ``None``: the pool's rule. Reset at unload.
    keep: float | None = None
    #: The request spellings that resolved to this model (bounded: :data:`SPELLINGS_KEPT`).
    spellings: collections.deque[str] = attrs.field(factory=collections.deque)

    @property
    def key(self) -> str:
        return str(self.source.path)

    @property
    def model_id(self) -> str:
        return str(self.source.model_id)

    @property
    def lane(self) -> str | None:
        """``batch`` or ``serial``: how the resident model decodes (``None`` while unloaded)."""
        return None if self.engine is None else self.engine.stats()["lane"]

    def idle(self) -> bool:
        if self.leases or self.engine is None:
            return False
        stats = self.engine.stats()
        return not stats["queue_depth"] and not stats["running_rows"]


class Lease:
    """A request's hold on a model: it is not evicted until the response is sent."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.released = False
        slot.leases += 1

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.slot.leases -= 1
            self.slot.last_used = time.monotonic()


#: Starts the engine of a model and loads it (blocking): ``make_engine(host, info, primary)``;
#: it calls :func:`mlxrt.serving.serve` before the load, so the load's hooks are given the model.
EngineFactory = Callable[["PluginHost", "ModelInfo", bool], "ServingEngine"]
#: Resolves a name to a local model (``mlxrt.loading.resolve.resolve_model`` without downloads).
Resolver = Callable[[str], ModelSource]


class ModelPool:
    """The models a server may answer with, their engines, and on-demand loading.

    :param host: The shared plugin host (the registry: every model's hooks are its plugins').
    :param primary: The served model. ``preload`` models are loaded at start, ``aliases``
        map names to models loaded on demand.
    """

    def __init__(self, host: PluginHost, primary: ModelSource, settings: PoolSettings, make_engine: EngineFactory, *,
                 resolver: Resolver, aliases: dict[str, ModelSource] | None = None,
                 preload: Iterable[ModelSource] = (), start_specs: dict[str, str] | None = None) -> None:
        self.host = host
        self.settings = settings
        self._make_engine = make_engine
        self._resolver = resolver
        self._slots: dict[str, Slot] = {}
        self._names: dict[str, Slot] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._fallbacks_logged: set[str] = set()
        self.primary = self._add(primary, primary=True, named=True)
        self.aliases = {name: self._add(source, named=True) for name, source in (aliases or {}).items()}
        self.preload = [self._add(source, named=True) for source in preload]
        for spelling, key in (start_specs or {}).items():  # "./llama", "org/name": as the operator wrote them
            if key in self._slots:
                self._names.setdefault(spelling, self._slots[key])
        self._names.update(self.aliases)
        for name in DEFAULT_NAMES:
            self._names[name] = self.primary

    def _add(self, source: ModelSource, *, primary: bool = False, named: bool = False) -> Slot:
        key = str(source.path)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = Slot(source, primary=primary, named=named)
            self._names.setdefault(source.model_id, slot)
            self._names.setdefault(key, slot)
        slot.named = slot.named or named
        return slot

    # -- start and stop (called off the event loop, before serving and at shutdown) -------------

    def load_at_start(self) -> None:
        """Load the served model and the ``--preload`` ones (blocking; errors are fatal)."""
        wanted = [self.primary, *(s for s in self.preload if s is not self.primary)]
        if len(wanted) > self.settings.max_models:
            raise ModelLoadError(f"--preload names {len(wanted)} models with the served one, but --max-models is "
                                 f"{self.settings.max_models}")
        for slot in wanted:  # nothing serves yet: the engine's own memory plan refuses what cannot fit
            if slot.state != "ready":
                self._installed(slot, self._start_engine(slot))

    async def open(self) -> None:
        """App startup: start the idle-unload task (models preloaded and never asked for count too)."""
        self._start_reaper()

    async def close(self) -> None:
        """App shutdown: end the idle-unload task on its own loop."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None

    def drain(self, grace: float) -> None:
        """Shutdown began: every resident engine refuses waiting requests (503) and ends its
        running ones after ``grace`` seconds (:meth:`mlxrt.engine.engine.Engine.drain`)."""
        for slot in list(self._slots.values()):
            if slot.engine is not None:
                slot.engine.drain(grace)

    def stop(self) -> None:
        """Stop every resident engine."""
        for slot in self._slots.values():
            if slot.engine is not None:
                slot.engine.stop()

    # -- the request path (event loop) ---------------------------------------------------------

    async def model_for(self, name: str | None, scope: MutableMapping[str, Any] | None = None) -> ServedModel:
        """The model that answers a request naming ``name``, loading it if needed.

        ``scope`` (the ASGI scope) holds the request's lease until :func:`releasing_leases`
        drops it after the response: a model is never evicted under a request.

        :raises ModelNotFound: ``name`` is not servable here and the server does not fall back (404).
        :raises InvalidRequest: ``name`` matches several local models (400).
        :raises ModelUnavailable: The model cannot be loaded or cannot fit (503).
        :raises QueueFull: Every resident model stayed busy (429).
        """
        slot = self._names.get(name or "")
        if slot is None:
            slot = await self._find(name or "")
            if slot is None:  # no such model here: the served one answers, and says so
                slot = self._fallback(name or "", scope)
        lease = Lease(slot)
        if scope is not None:
            scope.setdefault(LEASES_KEY, []).append(lease)
        try:
            await self._ensure(slot)
        except BaseException:
            lease.release()
            raise
        slot.last_used = time.monotonic()
        self._start_reaper()
        assert slot.model is not None  # ready: _installed set it
        return slot.model

    async def _find(self, name: str) -> Slot | None:
        """The local model ``name`` resolves to (not on a strict server), or ``None``."""
        import anyio

        if self.settings.strict:
            return None
        try:  # reads the disk and the HF cache: off the event loop
            source = await anyio.to_thread.run_sync(self._resolver, name)
        except ModelLoadError as exc:
            if exc.code == "ambiguous_model":
                raise InvalidRequest(exc.message, param="model", code="ambiguous_model") from None
            return None
        slot = self._add(source)
        self._remember(name, slot)
        self._forget_found(keep=slot)
        return slot

    def _remember(self, name: str, slot: Slot) -> None:
        """Keep ``name`` as a spelling of ``slot``'s model, the oldest of its spellings
        forgotten past :data:`SPELLINGS_KEPT` (its model id and path always stay)."""
        if name in self._names:
            return
        self._names[name] = slot
        slot.spellings.append(name)
        while len(slot.spellings) > SPELLINGS_KEPT:
            old = slot.spellings.popleft()
            if self._names.get(old) is slot:
                del self._names[old]

    def _forget_found(self, *, keep: Slot) -> None:
        """Forget the least recently used models found on disk by requests, unloaded and not
        named at start, past :data:`FOUND_KEPT` (with every name they had here), but ``keep``."""
        found = sorted((s for s in self._slots.values()
                        if s is not keep and not s.named and s.state == "unloaded" and not s.leases),
                       key=lambda s: s.last_used)
        for slot in found[:max(len(found) - FOUND_KEPT, 0)]:
            del self._slots[slot.key]
            for name in [n for n, s in self._names.items() if s is slot]:
                del self._names[name]

    def _fallback(self, name: str, scope: MutableMapping[str, Any] | None) -> Slot:
        """The served model for a name nothing here answers to, or 404 where it may not."""
        if not self.settings.fallback:
            raise ModelNotFound(name)
        if scope is not None:
            scope[FALLBACK_KEY] = name
        shown = _shown(name)  # what is kept is bounded too: names may be megabytes long
        if shown not in self._fallbacks_logged:
            if len(self._fallbacks_logged) >= FALLBACK_NAMES_KEPT:
                self._fallbacks_logged.clear()
            self._fallbacks_logged.add(shown)
            log.info("model '%s' is not served here: the served model %s answers it (header %s)",
                     shown, self.primary.model_id, FALLBACK_HEADER)
        return self.primary

    async def _ensure(self, slot: Slot) -> None:
        while slot.state != "ready":
            if slot.loading is None or slot.loading.done():
                # The load is the pool's task, not the request's: a client that leaves while it
                # waits does not cancel a load other requests wait for (or leak a half-made engine).
                slot.loading = asyncio.get_running_loop().create_task(self._load(slot))
                slot.loading.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved
            await asyncio.shield(slot.loading)  # one load for every waiter; its error is theirs

    async def _load(self, slot: Slot) -> None:
        import anyio

        slot.state, slot.load_started = "loading", time.monotonic()
        try:
            await anyio.to_thread.run_sync(self._check_fits, slot)  # before evicting anything for it
            await self._make_room(slot)
            engine = await anyio.to_thread.run_sync(self._start_engine, slot)
        except BaseException as exc:
            slot.state, slot.load_started = "unloaded", None
            if not isinstance(exc, Exception):
                raise
            typed = isinstance(exc, MlxrtError) and (exc.status < 500 or isinstance(exc, ModelUnavailable))
            error = exc if typed and isinstance(exc, MlxrtError) else self._unavailable(slot, exc)
            slot.last_error = error.message
            raise error from None
        self._installed(slot, engine)  # bookkeeping on the event loop, as every other change

    def _unavailable(self, slot: Slot, exc: BaseException) -> MlxrtError:
        detail = exc.message if isinstance(exc, MlxrtError) else f"{type(exc).__name__}: {exc}"
        over = isinstance(exc, MlxrtError) and exc.code == "over_budget"  # the engine's own memory plan
        return ModelUnavailable(f"cannot load model {slot.model_id!r}: {detail}; resident: {self._resident_text()}",
                                code="model_over_budget" if over else "model_load_failed")

    def _resident_text(self) -> str:
        rows = [f"{s.model_id} ({_size(s.engine.memory.weights)} weights)"
                if s.engine is not None and s.engine.memory is not None else s.model_id
                for s in self._slots.values() if s.state == "ready"]
        return ", ".join(rows) or "none"

    def _check_fits(self, slot: Slot) -> None:
        """Refuse, before any weight is read (and before anything is evicted for it), a model
        whose config does not fit its own weights, whose folder cannot serve
        (:mod:`mlxrt.loading.folder_check`) or whose weights exceed its budget share."""
        from mlxrt.loading.folder_check import check_model_folder
        from mlxrt.loading.weights import check_layer_count

        try:
            check_layer_count(slot.source.path)
            check_model_folder(slot.source.path)  # a folder that cannot serve evicts nothing
        except (ValueError, ModelLoadError) as exc:
            detail = exc.message if isinstance(exc, ModelLoadError) else str(exc)
            raise ModelUnavailable(f"cannot load model {slot.model_id!r}: {detail}; resident: "
                                   f"{self._resident_text()}", code="model_load_failed") from None
        share = self.settings.share
        if share is None:
            return
        from mlxrt.engine.memory import MARGIN
        from mlxrt.loading.sizes import weights_summary

        try:
            needs = weights_summary(slot.source.path).weight_bytes
        except ModelLoadError:
            return  # no safetensors to read ahead (GGUF conversions do have them; others fail at load)
        if needs > share * (1 - MARGIN):
            raise ModelUnavailable(
                f"model {slot.model_id!r} cannot fit: its weights need {_size(needs)} but each of the "
                f"--max-models {self.settings.max_models} resident models gets {_size(share)} of the "
                f"{_size(self.settings.memory_budget or 0)} --memory-budget (less a {MARGIN:.0%} margin); "
                f"resident: {self._resident_text()}", code="model_over_budget")

    async def _make_room(self, slot: Slot) -> None:
        """Evict least recently used idle models until ``slot`` may be resident."""
        deadline = time.monotonic() + BUSY_WAIT
        while True:
            others = [s for s in self._slots.values() if s is not slot and s.state in ("ready", "loading")]
            if len(others) < self.settings.max_models:
                return
            idle = sorted((s for s in others if s.state == "ready" and s.idle()), key=lambda s: s.last_used)
            if idle:
                await self._unload(idle[0], f"to make room for {slot.model_id} (--max-models "
                                            f"{self.settings.max_models})")
                continue
            if time.monotonic() > deadline:
                raise QueueFull(f"cannot load model {slot.model_id!r}: all --max-models {self.settings.max_models} "
                                f"resident models stayed busy ({', '.join(s.model_id for s in others)}); retry later",
                                retry_after=5, code="models_busy")
            await asyncio.sleep(0.05)

    def _start_engine(self, slot: Slot) -> ServingEngine:
        """Load ``slot``'s model on a new engine (blocking: a worker thread or start-up)."""
        from mlxrt.loading.resolve import read_model_info

        slot.load_started = slot.load_started or time.monotonic()
        log.info("loading model %s from %s", slot.model_id, slot.source.path)
        return self._make_engine(self.host, read_model_info(slot.source), slot.primary)

    def _installed(self, slot: Slot, engine: ServingEngine) -> None:
        now = time.monotonic()
        slot.engine, slot.model = engine, serve(self.host, engine)
        slot.profile = engine.profile
        slot.state, slot.loads = "ready", slot.loads + 1
        slot.load_seconds, slot.load_started = now - (slot.load_started or now), None
        slot.last_used, slot.last_error = now, None
        log.info("loaded model %s in %.2f s (%d resident)", slot.model_id, slot.load_seconds,
                 sum(s.state == "ready" for s in self._slots.values()))

    async def _unload(self, slot: Slot, why: str) -> None:
        import anyio

        engine, slot.engine, slot.model = slot.engine, None, None
        slot.state, slot.keep = "unloaded", None  # a client's keep_alive lasts while it stays resident
        log.info("unloading model %s %s", slot.model_id, why)
        if engine is not None:
            await anyio.to_thread.run_sync(engine.stop)
            del engine
            await anyio.to_thread.run_sync(_return_memory)

    # -- idle unload ---------------------------------------------------------------------------

    def _limits(self) -> list[float]:
        """The idle limits in force: ``--idle-unload`` and every finite client ``keep``."""
        keeps = [s.keep for s in self._slots.values() if s.keep is not None and s.keep != math.inf]
        return keeps + ([self.settings.idle_unload] if self.settings.idle_unload is not None else [])

    def _start_reaper(self) -> None:
        if self._limits() and (self._reaper is None or self._reaper.done()):
            # A fresh context: its log lines belong to no request (not to the one that started it).
            self._reaper = asyncio.get_running_loop().create_task(self._reap(), context=contextvars.Context())

    async def _reap(self) -> None:
        while limits := self._limits():
            await asyncio.sleep(min(max(min(limits) / 4, 0.05), 5.0))
            now = time.monotonic()
            for slot in list(self._slots.values()):
                limit = self._idle_limit(slot)
                if limit is not None and slot.state == "ready" and slot.idle() and now - slot.last_used >= limit:
                    rule = "--idle-unload" if slot.keep is None else "keep_alive"
                    await self._unload(slot, f"after {now - slot.last_used:.0f} s idle ({rule} {limit:g})")

    def _idle_limit(self, slot: Slot) -> float | None:
        if slot.keep is None:
            return self.settings.idle_unload
        return None if slot.keep == math.inf else slot.keep

    # -- a client's say over residency (Ollama's keep_alive, `mlxrt stop`) --------------------

    def slot_of(self, model: ServedModel) -> Slot | None:
        """The slot of ``model`` (one :meth:`model_for` gave), or ``None`` once it was unloaded."""
        return next((s for s in self._slots.values() if s.model is model), None)

    def keep_alive(self, model: ServedModel, seconds: float | None) -> None:
        """Keep ``model`` resident until it was unused for ``seconds`` (0: unload it once idle;
        negative: never unload it; ``None``: back to ``--idle-unload``)."""
        slot = self.slot_of(model)
        if slot is None:
            return
        slot.keep = None if seconds is None else math.inf if seconds < 0 else float(seconds)
        self._start_reaper()

    def expires_at(self, slot: Slot) -> float | None:
        """When (``time.time()``) a resident model will be unloaded if nobody uses it, or ``None``
        (never); a model in use counts from now."""
        limit = self._idle_limit(slot)
        if limit is None or slot.engine is None:
            return None
        since = time.monotonic() if not slot.idle() else slot.last_used
        return time.time() + (since + limit - time.monotonic())

    async def unload(self, name: str) -> bool:
        """Unload the resident model ``name`` names (an id, alias or start-up spelling) now, once no
        request holds it; ``False`` when no such model is resident.

        :raises QueueFull: It stayed busy for :data:`BUSY_WAIT` seconds (429).
        """
        slot = self._names.get(name) or next((s for s in self._slots.values() if s.model_id == name), None)
        if slot is None or slot.state != "ready":
            return False
        deadline = time.monotonic() + BUSY_WAIT
        while not slot.idle():
            if time.monotonic() > deadline:
                raise QueueFull(f"model {slot.model_id!r} stayed busy; retry later", retry_after=5, code="models_busy")
            await asyncio.sleep(0.05)
            if slot.state != "ready":
                return True
        await self._unload(slot, "on request")
        return True

    # -- what the server shows -----------------------------------------------------------------

    def is_loaded(self, model_id: str) -> bool:
        return any(s.state == "ready" and s.model_id == model_id for s in self._slots.values())

    def resident(self) -> list[Slot]:
        return [s for s in self._slots.values() if s.engine is not None]

    def current(self) -> Slot | None:
        """The model the server describes where nothing names one (``/health``, ``/v1``,
        ``/stats``, ``/metrics``, the start banner, the status pages): the served model while
        it is resident, else the resident model used last; ``None`` when none is resident.
        Never loads anything."""
        if self.primary.engine is not None:
            return self.primary
        return max(self.resident(), key=lambda s: s.last_used, default=None)

    def names(self) -> dict[str, str]:
        """Alias → model id."""
        return {name: slot.model_id for name, slot in self.aliases.items()}

    def usable_names(self) -> list[str]:
        """The names a caller may use without the disk: the id of each model named at start
        (the served one, ``--preload``, alias targets) and the aliases."""
        return sorted({s.model_id for s in self._slots.values() if s.named} | set(self.aliases))

    def known_source(self, name: str) -> ModelSource | None:
        """The model a name already known here stands for (no disk read), or ``None``."""
        slot = self._names.get(name)
        return slot.source if slot is not None else None

    def known(self) -> list[Slot]:
        return list(self._slots.values())

    def describe(self) -> dict[str, Any]:
        """``/stats``' ``models`` section."""
        now = time.monotonic()
        rows = []
        for slot in self._slots.values():
            row: dict[str, Any] = {"id": slot.model_id, "path": slot.key, "state": slot.state,
                                   "served": slot.primary, "named_at_start": slot.named, "loads": slot.loads,
                                   "load_seconds": round(slot.load_seconds, 3) if slot.load_seconds else None,
                                   "in_use": slot.leases,
                                   "idle_seconds": round(now - slot.last_used, 1) if slot.engine else None}
            if slot.state == "loading" and slot.load_started is not None:
                row["loading_for_seconds"] = round(now - slot.load_started, 2)
            if slot.last_error:
                row["last_error"] = slot.last_error
            if slot.engine is not None and slot.engine.memory is not None:
                row["weight_bytes"] = slot.engine.memory.weights
            rows.append(row)
        s = self.settings
        return {"max_models": s.max_models, "idle_unload": s.idle_unload, "strict": s.strict,
                "fallback": s.fallback, "memory_share_bytes": s.share, "aliases": self.names(),
                "names_known": len(self._names), "models": rows}

    def metric_families(self) -> list[list[str]]:
        """``/metrics`` families with a ``model`` label, one row per known model."""
        from mlxrt.metrics import gauge

        known = list(self._slots.values())

        def per_model(field: str) -> dict[tuple[str, ...], float]:
            return {(s.model_id,): s.engine.stats()[field] for s in known if s.engine is not None}

        return [
            gauge("mlxrt_model_loaded", "1 when the model is resident.", None,
                  {(s.model_id,): float(s.state == "ready") for s in known}, ("model",)),
            gauge("mlxrt_model_loads_total", "Times the model was loaded.", None,
                  {(s.model_id,): s.loads for s in known}, ("model",)),
            gauge("mlxrt_model_requests_served_total", "Generations finished by the model's current engine.", None,
                  per_model("requests_served"), ("model",)),
            gauge("mlxrt_model_tokens_generated_total", "Tokens generated by the model's current engine.", None,
                  per_model("tokens_generated"), ("model",)),
            gauge("mlxrt_model_queue_depth", "Requests waiting for the model.", None,
                  per_model("queue_depth"), ("model",)),
            gauge("mlxrt_model_running_rows", "Requests the model is generating.", None,
                  per_model("running_rows"), ("model",)),
        ]


def _return_memory() -> None:
    """After an unload: free the engine's arrays now and hand MLX's buffer cache back to the
    system, so the next model does not load on top of the last one's weights."""
    import gc

    gc.collect()
    try:
        import mlx.core as mx

        mx.clear_cache()
    except Exception:  # an MLX without a buffer cache
        log.debug("clearing MLX's buffer cache", exc_info=True)


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def _shown(name: str, limit: int = 200) -> str:
    """A requested name as logs and headers show it: bounded, ASCII, no control characters,
    no space at either end (a header value cannot start or end with one: ``"gpt-4o "`` made
    h11 drop the connection with no response), each escaped as Python would write it."""
    text = name if len(name) <= limit else name[:limit] + "..."
    text = text.encode("unicode_escape").decode("ascii")
    core = text.strip(" ")
    if core == text:
        return text
    lead = len(text) - len(text.lstrip(" "))
    trail = len(text) - lead - len(core) if core else 0
    return "\\x20" * lead + core + "\\x20" * trail


def releasing_leases(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap the app's ASGI handler: a request's model leases end when its response (a whole
    stream included) has been sent, or the connection ended; a response the served model gave
    in place of the one asked for carries :data:`FALLBACK_HEADER` with the name asked for."""

    async def wrapped(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        async def sending(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and FALLBACK_KEY in scope:
                value = _shown(scope[FALLBACK_KEY]).encode("latin-1")
                message["headers"] = [*message.get("headers", ()), (FALLBACK_HEADER.encode(), value)]
            await send(message)

        try:
            await handler(scope, receive, sending)
        finally:
            for lease in scope.pop(LEASES_KEY, ()):
                lease.release()

    return wrapped
