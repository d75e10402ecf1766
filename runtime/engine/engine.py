"""The engine: one worker thread owns MLX; the async HTTP side submits requests and awaits
events.

``Engine.generate(request)`` takes a :class:`GenerationRequest` and returns a
:class:`Generation` handle at once: ``await handle.started()`` gives the request's
:class:`CacheReport` once it is admitted (or raises the error that kept it out), and
iterating the handle yields :class:`TokenEvent`\\ s ending in one :class:`FinishEvent`.
Closing the handle (a client that left) cancels the request within one decode step.

This module is the facade other code uses. The worker loads the model, then builds the KV
scheme, speculator, memory plan, prompt cache and lanes around it
(:mod:`mlxrt.engine.worker_setup`) and runs the scheduler's loop
(:mod:`mlxrt.engine.scheduler`: queueing, admission, the lanes' steps) until the engine stops.
An engine that shares its model with other processes takes them as ``peers``
(:mod:`mlxrt.engine.peers`; ``serve --distributed``).

Every MLX call happens on the worker (MLX streams are not for sharing across threads).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlxrt.engine.workers as workers
from mlxrt.cache.prompt_cache import PromptCache
from mlxrt.engine.adapters import AdapterRegistry, adapter_id_for
from mlxrt.engine.bridge import Call, Generation, Outbox
from mlxrt.engine.config import EngineConfig
from mlxrt.engine.kv_quant import KVScheme
from mlxrt.engine.lanes import Job
from mlxrt.engine.memory import MemoryPlan
from mlxrt.engine.sampling import SeedSource
from mlxrt.engine.scheduler import Scheduler
from mlxrt.engine.speculative import Speculator
from mlxrt.engine.worker_setup import set_up, warm_up
from mlxrt.errors import EngineError
from mlxrt.records import FamilyProfile, GenerationRequest, LoadedModel, ModelInfo

if TYPE_CHECKING:
    from mlxrt.engine.loader import ModelLoader
    from mlxrt.engine.peers import Peers
    from mlxrt.registry import PluginHost

__all__ = ["Engine"]

log = logging.getLogger("mlxrt.engine.engine")


def _active_memory() -> int | None:
    try:
        import mlx.core as mx

        return int(mx.get_active_memory())
    except Exception:  # an MLX build without memory counters
        return None


class Engine:
    """Owns the model on a worker thread and runs generations for the HTTP side.

    :param host: The plugin host (family hooks at load, sampler and processor hooks per request).
    :param config: Batching, queueing, memory and prompt-cache settings.
    :param loader: Loads the model and ``--draft-model`` on the worker (:class:`mlxrt.loading.Loader`;
        the engine does not import model loading).
    :param peers: Processes that run every forward with this one (:mod:`mlxrt.engine.peers`),
        or None: the model is this process's alone.

    The model is loaded on the worker thread by :meth:`load`: MLX arrays a model creates at
    load belong to that thread's stream, so loading anywhere else breaks some models.
    """

    def __init__(self, host: PluginHost, config: EngineConfig | None = None, *, loader: ModelLoader,
                 peers: Peers | None = None) -> None:
        self.host = host
        self.loader = loader
        self.config = config or EngineConfig()
        self.peers = peers
        self.loaded: LoadedModel | None = None
        self.profile: FamilyProfile | None = None
        self.memory: MemoryPlan | None = None
        self.seeds = SeedSource()
        dirs = list(self.config.adapter_dirs)
        if self.config.adapter:
            dirs.append(str(Path(self.config.adapter).expanduser().parent))
        self.adapters = AdapterRegistry(dirs)
        self.kv: KVScheme | None = None
        self.speculator: Speculator | None = None
        #: The model this engine serves as hooks see it (set by mlxrt.serving.serve before the
        #: load); only handed to the hooks the engine runs, as their ``model``.
        self.served_model: object = None
        from mlxrt.metrics import Histogram

        self.ttft = Histogram("mlxrt_time_to_first_token_seconds",
                              "From submission (queue wait included) to the first generated token.")
        self.latency = Histogram("mlxrt_generation_seconds", "From submission to the last event of a generation.")
        #: Queueing, admission and the worker loop.
        self.scheduler = Scheduler(host, self.config, adapters=self.adapters, seeds=self.seeds,
                                   ttft=self.ttft, latency=self.latency, peers=peers)
        self._stream: Any = None  # the engine's MLX stream, made on the worker
        self._thread: threading.Thread | None = None
        self._outboxes: dict[asyncio.AbstractEventLoop, Outbox] = {}  # one per event loop
        #: Context length from which rows keep prompt snapshots (the model's cache cannot be
        #: rewound past it; :func:`mlxrt.cache.prompt_cache.snapshots_from`), or None: never.
        self._snapshots_from: int | None = None

    # -- public surface (event loop) -------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def info(self) -> ModelInfo:
        return self.profile.info

    @property
    def prompt_cache(self) -> PromptCache:
        """The prompt cache (a disabled one until the load sizes it)."""
        return self.scheduler.prompt_cache

    @property
    def safe_context(self) -> int | None:
        """Tokens of context the memory budget holds (``None`` without a budget)."""
        return self.memory.safe_context if self.memory is not None else None

    @property
    def context_ceiling(self) -> int | None:
        """The most prompt + max_tokens one request may ask for: the model's context window,
        capped by the memory budget's safe context."""
        limits = [c for c in (self.info.context_window, self.safe_context) if c is not None]
        return min(limits) if limits else None

    @property
    def keeps_snapshots(self) -> bool:
        """Whether requests keep prompt-cache snapshots (the model's cache cannot be rewound;
        see :mod:`mlxrt.cache.prompt_cache`): templating then also finds each chat's turn boundary."""
        return self._snapshots_from is not None and self.prompt_cache.enabled

    @property
    def unhealthy(self) -> str | None:
        """Why this engine cannot serve any more, else ``None`` (a distributed one can lose a rank)."""
        return None

    @property
    def lane(self) -> str:
        """``batch`` when requests are decoded together, else ``serial``."""
        return "batch" if self.scheduler.batch is not None else "serial"

    @property
    def serving(self) -> bool:
        """Whether the worker runs: a model is loaded and the engine was not stopped."""
        return self._thread is not None

    # The scheduler's counters, read as the engine's.
    @property
    def last_miss(self) -> dict[str, Any] | None:
        return self.scheduler.last_miss

    @property
    def requests_served(self) -> int:
        return self.scheduler.requests_served

    @property
    def requests_cancelled(self) -> int:
        return self.scheduler.requests_cancelled

    @property
    def requests_rejected(self) -> int:
        return self.scheduler.requests_rejected

    @property
    def tokens_generated(self) -> int:
        return self.scheduler.tokens_generated

    def load(self, info: ModelInfo) -> None:
        """Start the worker, load ``info`` on it (MLX state stays on that thread), and warm up.

        Blocks until the model is ready; a load error (or a budget that cannot serve the
        model) is raised here.
        """
        if self._thread is not None:
            raise EngineError("the engine already has a model")
        ready: Future[None] = Future()
        # A pooled thread (mlxrt.engine.workers): a thread per load leaked MLX's native threads.
        worker = workers.take()
        # A worker still running when the interpreter exits makes MLX abort the process
        # (status 134): stop every engine first, then end the workers, then let the main
        # thread clean up too (one handler, registered once, however many engines ran) —
        # registered before the load, so a load that fails (and exits) ends its worker too.
        atexit.unregister(_at_exit)
        atexit.register(_at_exit)
        self._thread, self._finished = worker.thread, threading.Event()
        worker.submit(lambda stream: self._run(info, ready, stream))
        try:
            ready.result()
        except BaseException:
            self._finished.wait(timeout=5)
            self._thread = None
            raise
        _LIVE.add(self)

    def stop(self, *, timeout: float = 30.0) -> None:
        """Stop the engine (between decode steps) and wait for it, at most ``timeout`` seconds;
        its worker thread goes back to the pool for the next engine. Idempotent."""
        if self._thread is not None:
            self.scheduler.stop()
            self._finished.wait(timeout=timeout)
            self._thread = None
            _LIVE.discard(self)

    def generate(self, request: GenerationRequest) -> Generation:
        """Submit ``request``; its :class:`Generation` handle.

        :raises QueueFull: ``--max-queue`` requests are already waiting for admission.
        """
        if self._thread is None:
            raise EngineError("the engine has no model loaded")
        self.scheduler.accept()
        loop = asyncio.get_running_loop()
        job = Job(request, deliver=lambda _item: None, cancelled=threading.Event())
        if self.keeps_snapshots and request.vision is None \
                and len(request.prompt_ids) + request.max_tokens > self._snapshots_from:
            # copies of the prompt's KV held while it runs: at its last token, and at the turn boundary
            job.snapshot_tokens = len(request.prompt_ids) * (1 if request.turn_start is None else 2)
        if self.config.request_timeout is not None:
            job.deadline = job.submitted + self.config.request_timeout

        def cancel() -> None:
            job.cancelled.set()
            self.scheduler.wake()

        handle = Generation(loop, cancel)
        outbox = self._outboxes.get(loop)
        if outbox is None:
            outbox = self._outboxes[loop] = Outbox(loop)
        job.deliver = lambda item: outbox.put(handle, item)
        self.scheduler.submit(job)
        return handle

    def drain(self, grace: float) -> None:
        """Shutdown began: refuse new and waiting requests (503 :class:`ShuttingDown`) and give
        running ones ``grace`` seconds, after which each ends with that error (a stream's error
        frame). Called once, on the event loop, by the server's shutdown."""
        self.scheduler.drain(grace)

    def fail_all(self, error: Exception) -> None:
        """Fail every running, waiting and submitted request with ``error`` (any thread)."""
        self.scheduler.fail_all(error)

    def retry_after(self) -> int:
        """Seconds a refused client should wait: about one request's duration per batch of
        waiting requests ahead of it."""
        return self.scheduler.retry_after()

    async def call(self, fn: Callable[[LoadedModel], Any]) -> Any:
        """Run ``fn(loaded_model)`` on the worker, between decode steps, and return its result.

        For raw forwards (embeddings, next-token distributions): they are serialized with
        generation, never run beside a step. Exceptions raised by ``fn`` are re-raised here.
        """
        if self._thread is None:
            raise EngineError("the engine has no model loaded")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self.scheduler.submit(Call(fn, done, loop))
        return await done

    def call_blocking(self, fn: Callable[[LoadedModel], Any]) -> Any:
        """:meth:`call` for a thread that is not the event loop's (templating, image splicing):
        blocks that thread until ``fn`` ran on the worker."""
        if self._thread is None:
            raise EngineError("the engine has no model loaded")
        if threading.current_thread() is self._thread:
            return fn(self.loaded)
        done: Future[Any] = Future()
        self.scheduler.submit(Call(fn, done, None))
        return done.result()

    async def mount_adapter(self, adapter_id: str, path: str, owner: str = "") -> dict[str, Any]:
        """Mount an adapter folder as ``owner``'s ``adapter_id`` (on the worker, between decode
        steps); the folder must lie under an adapter root
        (:meth:`~mlxrt.engine.adapters.AdapterRegistry.confine`)."""
        adapter = await self.call(lambda loaded: self.adapters.mount(loaded.model, adapter_id,
                                                                     self.adapters.confine(path), owner))
        return adapter.describe()

    async def unmount_adapter(self, adapter_id: str, owner: str = "") -> dict[str, Any]:
        """Unmount ``owner``'s ``adapter_id``: new requests cannot select it; rows already running
        with it finish with it (its arrays are freed after them). 404 if it is not mounted."""
        adapter = await self.call(lambda _loaded: self.adapters.unmount(adapter_id, self.scheduler.adapters_in_use(),
                                                                        owner))
        return {"id": adapter.id, "removed_layers": len(adapter.layers)}

    def stats(self) -> dict[str, Any]:
        """Counters for ``/stats`` (read from the event loop; values are a moment's snapshot)."""
        sched = self.scheduler
        rate = sched.tokens_per_second()
        lanes = {"serial": sched.serial.served if sched.serial is not None else 0,
                 "batch": sched.batch.served if sched.batch is not None else 0}
        return {
            "lane": self.lane,
            "batch_size": self.config.batch if sched.batch is not None else 1,
            # queued counts every submitted request not yet admitted (its inbox and waiting)
            "queue_depth": max(sched.queued, len(sched.waiting)),
            "max_queue": self.config.max_queue,
            "running_rows": len(sched.running),
            "reserved_tokens": sched.reserved,
            "tokens_per_second": round(rate, 2),
            "tokens_generated": sched.tokens_generated,
            "requests_served": sched.requests_served,
            "requests_cancelled": sched.requests_cancelled,
            "requests_rejected": sched.requests_rejected,
            "served_by_lane": lanes,
            "admission": {"safe_context": self.safe_context, "context_ceiling": self.context_ceiling,
                          **(self.memory.describe() if self.memory else {})},
            "prompt_cache": {**self.prompt_cache.stats(), "last_miss": sched.last_miss},
            # The server's own adapters; API keys' mounts are their own (GET /v1/adapters), counted only.
            "adapters": {"mounted": [a.id for a in self.adapters.list("")], "default": list(self.adapters.default),
                         "mounted_by_keys": len(self.adapters.list()) - len(self.adapters.list(""))},
            "kv_quant": self.kv.describe() if self.kv is not None else None,
            "speculative": self.speculator.describe() if self.speculator is not None else None,
            "mlx_active_bytes": _active_memory(),
        }

    # -- worker thread ---------------------------------------------------------------------------

    def _run(self, info: ModelInfo, ready: Future[None], stream: Any) -> None:
        try:
            self._serve(info, ready, stream)
        finally:
            self._finished.set()

    def _serve(self, info: ModelInfo, ready: Future[None], stream: Any) -> None:
        import mlx.core as mx

        # The worker's stream (mlxrt.engine.workers): every MLX op of the engine runs on it.
        self._stream = stream
        with mx.stream(self._stream):
            try:
                self.loaded, self.profile = self.loader.load(info, self.host, self.served_model)
                self._set_up()
                if self.config.adapter:
                    path = self.config.adapter
                    self.adapters.mount(self.loaded.model, adapter_id_for(path), path)
                    self.adapters.default = (adapter_id_for(path),)
            except BaseException as exc:  # handed to the caller of load()
                ready.set_exception(exc)
            else:
                if self.peers is None:  # with peers, a forward here alone would wait on them for ever
                    warm_up(self.loaded, self._stream)
                ready.set_result(None)
                try:
                    self.scheduler.run()
                finally:
                    self.prompt_cache.close()  # finishes the prompt-cache writes still queued
                    mx.synchronize(self._stream)

    def _set_up(self) -> None:
        """Build the KV scheme, speculator, memory plan, prompt cache and lanes (after the load)."""
        if self.peers is not None:
            self.peers.place(self.loaded)
        sched = self.scheduler
        setup = set_up(self.loaded, self.info, self.host, self.config, self.adapters,
                       stream=self._stream, done=sched.done, tick=sched.tick, loader=self.loader)
        if self.peers is not None and setup.serial is not None:
            setup.serial = self.peers.serial_lane(setup.serial)
        self.kv, self.speculator, self.memory = setup.kv, setup.speculator, setup.memory
        self._snapshots_from = setup.snapshots_from
        sched.equip(self.loaded, self.info, setup)
        sched.served_model = self.served_model


#: Engines with a model loaded, stopped at exit (weakly held: a dropped engine is not kept).
_LIVE: weakref.WeakSet[Engine] = weakref.WeakSet()


def _at_exit() -> None:
    """Stop every engine, end the worker threads, then clear the main thread's MLX streams."""
    for engine in list(_LIVE):
        engine.stop()
    workers.close()
    _clear_main_streams()


def _clear_main_streams() -> None:
    """At exit, on the main thread: destroy its MLX streams while the interpreter still runs."""
    try:
        import mlx.core as mx

        mx.clear_streams()
    except Exception:  # an MLX without clear_streams cleans up by itself
        log.debug("clearing MLX streams at exit", exc_info=True)
