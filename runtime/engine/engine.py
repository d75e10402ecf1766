"""The engine: one worker thread owns MLX; the async HTTP side submits requests and awaits
events.

``Engine.generate(request)`` takes a :class:`GenerationRequest` and returns a
:class:`Generation` handle at once: ``await handle.started()`` gives the request's
:class:`CacheReport` once it is admitted (or raises the error that kept it out), and
iterating the handle yields :class:`TokenEvent`\\ s ending in one :class:`FinishEvent`.
Closing the handle (a client that left) cancels the request within one decode step.

The worker loop, between decode steps:

1. takes new submissions and raw calls (:meth:`Engine.call`) from its inbox;
2. drops waiting requests whose client left, fails those that waited past
   ``--request-timeout`` (429);
3. admits waiting requests in arrival order while the lane has room and, under
   ``--memory-budget``, while the running rows' prompt + max_tokens together stay within the
   safe context (a request that does not fit waits; it never overcommits memory);
4. on admission builds the request's sampler chain, looks its prompt up in the prompt cache
   and reports the lookup; then runs a step of the lane (see :mod:`mlxrt.engine.lanes`).

Every MLX call happens on the worker (MLX streams are not for sharing across threads).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import math
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.cache.prompt_cache import PromptCache, snapshots_from
from mlxrt.cache.prompt_store import open_prompt_cache
from mlxrt.engine import workers
from mlxrt.engine.adapters import AdapterRegistry, adapter_id_for
from mlxrt.engine.bridge import WAKE, Call, Generation, Outbox
from mlxrt.engine.config import EngineConfig
from mlxrt.engine.kv_quant import KVScheme, QuantizingModel, resolve_kv_scheme
from mlxrt.engine.lanes import BatchLane, Job, Row, SerialLane, batchable
from mlxrt.engine.memory import MemoryPlan, measure_kv, plan_memory, weight_bytes
from mlxrt.engine.sampling import SeedSource, build_logits_processors, build_sampler, seeded
from mlxrt.engine.speculative import Speculator, load_speculator
from mlxrt.errors import EngineError, MlxrtError, QueueFull, ShuttingDown
from mlxrt.loading import load_model
from mlxrt.records import (
    CacheReport,
    FamilyProfile,
    FinishReason,
    GenerationRequest,
    LoadedModel,
    ModelInfo,
)
from mlxrt.text.detokenize import Detokenizer
from mlxrt.text.stops import StopMatcher

if TYPE_CHECKING:
    from mlxrt.host import PluginHost

__all__ = ["Engine"]

log = logging.getLogger("mlxrt.engine.engine")

#: Prompt tokens decoded into a cache miss's snippet.
SNIPPET_TOKENS = 8
#: Seconds over which ``/stats`` reports tokens per second.
RATE_WINDOW = 10.0


def _snapshots_from(model: Any) -> int | None:
    from mlx_lm.models.cache import make_prompt_cache

    try:
        return snapshots_from(make_prompt_cache(model))
    except Exception:  # a model outside mlx-lm's cache protocol: nothing is cached for it anyway
        return None


def _shutting_down() -> ShuttingDown:
    return ShuttingDown("the server is shutting down; retry on another instance or after it restarts")


def _end_by(job: Job, until: float) -> None:
    """Make ``job`` end with :class:`ShuttingDown` at ``until`` unless it finishes before."""
    job.deadline_error = _shutting_down()  # before the deadline: the worker reads them in that order
    if job.deadline is None or job.deadline > until:
        job.deadline = until


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

    The model is loaded on the worker thread by :meth:`load`: MLX arrays a model creates at
    load belong to that thread's stream, so loading anywhere else breaks some models.
    """

    def __init__(self, host: PluginHost, config: EngineConfig | None = None) -> None:
        self.host = host
        self.config = config or EngineConfig()
        self.loaded: LoadedModel | None = None
        self.profile: FamilyProfile | None = None
        self.memory: MemoryPlan | None = None
        self.prompt_cache = PromptCache(max_entries=0)
        self.seeds = SeedSource()
        dirs = list(self.config.adapter_dirs)
        if self.config.adapter:
            dirs.append(str(Path(self.config.adapter).expanduser().parent))
        self.adapters = AdapterRegistry(dirs)
        self.kv: KVScheme | None = None
        self.speculator: Speculator | None = None
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._stream: Any = None  # the engine's MLX stream, made on the worker
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._queued = 0  # submitted, not yet admitted or dropped (guarded by _lock)
        self._drain_until: float | None = None  # set once by drain() (shutdown)
        self._outboxes: dict[asyncio.AbstractEventLoop, Outbox] = {}  # one per event loop
        # Worker-only state.
        self._waiting: collections.deque[Job] = collections.deque()
        self._serial: SerialLane | None = None
        self._batch: BatchLane | None = None
        self._running: list[Row] = []  # rows admitted and not finished (either lane)
        self._reserved = 0
        self._eos: frozenset[int] = frozenset()
        #: Context length from which rows keep prompt snapshots (the model's cache cannot be
        #: rewound past it; :func:`mlxrt.cache.prompt_cache.snapshots_from`), or None: never.
        self._snapshots_from: int | None = None
        self._rate: collections.deque[list[int]] = collections.deque()  # [second, tokens]
        self._latency = 0.0  # EWMA of request durations, seconds
        self.last_miss: dict[str, Any] | None = None
        self.requests_served = 0
        self.requests_cancelled = 0
        self.requests_rejected = 0
        self.tokens_generated = 0
        from mlxrt.metrics import Histogram

        self.ttft = Histogram("mlxrt_time_to_first_token_seconds",
                              "From submission (queue wait included) to the first generated token.")
        self.latency = Histogram("mlxrt_generation_seconds", "From submission to the last event of a generation.")

    # -- public surface (event loop) -------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def info(self) -> ModelInfo:
        return self.profile.info

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
    def lane(self) -> str:
        """``batch`` when requests are decoded together, else ``serial``."""
        return "batch" if self._batch is not None else "serial"

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

    def stop(self) -> None:
        """Stop the engine (between decode steps) and wait for it; its worker thread goes back
        to the pool for the next engine. Idempotent."""
        if self._thread is not None:
            self._inbox.put(None)
            self._finished.wait(timeout=30)
            self._thread = None
            _LIVE.discard(self)

    def generate(self, request: GenerationRequest) -> Generation:
        """Submit ``request``; its :class:`Generation` handle.

        :raises QueueFull: ``--max-queue`` requests are already waiting for admission.
        """
        if self._thread is None:
            raise EngineError("the engine has no model loaded")
        with self._lock:
            if self._drain_until is not None:
                raise _shutting_down()
            if self._queue_is_full():
                self.requests_rejected += 1
                raise QueueFull(
                    f"the server is at capacity: {self._queued} requests are waiting (--max-queue "
                    f"{self.config.max_queue}); retry later", retry_after=self.retry_after())
            self._queued += 1
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
            self._inbox.put(WAKE)

        handle = Generation(loop, cancel)
        outbox = self._outboxes.get(loop)
        if outbox is None:
            outbox = self._outboxes[loop] = Outbox(loop)
        job.deliver = lambda item: outbox.put(handle, item)
        self._inbox.put(job)
        return handle

    def drain(self, grace: float) -> None:
        """Shutdown began: refuse new and waiting requests (503 :class:`ShuttingDown`) and give
        running ones ``grace`` seconds, after which each ends with that error (a stream's error
        frame). Called once, on the event loop, by the server's shutdown."""
        with self._lock:
            if self._drain_until is not None:
                return
            self._drain_until = time.monotonic() + grace
        for row in list(self._running):  # a row admitted after this sees _drain_until in _admit
            _end_by(row.job, self._drain_until)
        # Waiting requests are answered from here, not by the worker: in the serial lane it is
        # busy with the running request for up to `grace`. Cancelled, the worker drops them.
        with self._inbox.mutex:
            waiting = [item for item in self._inbox.queue if isinstance(item, Job)]
        for job in [*waiting, *list(self._waiting)]:  # list(deque) copies without yielding the GIL
            if not job.cancelled.is_set():
                job.deliver(_shutting_down())
                job.cancelled.set()
        self._inbox.put(WAKE)

    def _queue_is_full(self) -> bool:
        # Only requests beyond the lane's free rows wait, so only those count against
        # --max-queue (a request that will be admitted at once is never refused).
        rows = self._batch.size if self._batch is not None else 1
        free = max(rows - len(self._running), 0)
        return self._queued - free >= self.config.max_queue

    def retry_after(self) -> int:
        """Seconds a refused client should wait: about one request's duration per batch of
        waiting requests ahead of it."""
        rows = self.config.batch if self._batch is not None else 1
        return max(1, math.ceil(self._latency * max(self._queued, 1) / rows)) if self._latency else 1

    async def call(self, fn: Callable[[LoadedModel], Any]) -> Any:
        """Run ``fn(loaded_model)`` on the worker, between decode steps, and return its result.

        For raw forwards (embeddings, next-token distributions): they are serialized with
        generation, never run beside a step. Exceptions raised by ``fn`` are re-raised here.
        """
        if self._thread is None:
            raise EngineError("the engine has no model loaded")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._inbox.put(Call(fn, done, loop))
        return await done

    def call_blocking(self, fn: Callable[[LoadedModel], Any]) -> Any:
        """:meth:`call` for a thread that is not the event loop's (templating, image splicing):
        blocks that thread until ``fn`` ran on the worker."""
        if self._thread is None:
            raise EngineError("the engine has no model loaded")
        if threading.current_thread() is self._thread:
            return fn(self.loaded)
        done: Future[Any] = Future()
        self._inbox.put(Call(fn, done, None))
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
        adapter = await self.call(lambda _loaded: self.adapters.unmount(adapter_id, self._adapters_in_use(), owner))
        return {"id": adapter.id, "removed_layers": len(adapter.layers)}

    def stats(self) -> dict[str, Any]:
        """Counters for ``/stats`` (read from the event loop; values are a moment's snapshot)."""
        now = time.monotonic()
        window = [(t, n) for t, n in list(self._rate) if now - t <= RATE_WINDOW]
        rate = sum(n for _, n in window) / max(now - window[0][0], 1.0) if window else 0.0
        lanes = {"serial": self._serial.served if self._serial is not None else 0,
                 "batch": self._batch.served if self._batch is not None else 0}
        return {
            "lane": self.lane,
            "batch_size": self.config.batch if self._batch is not None else 1,
            # _queued counts every submitted request not yet admitted (its inbox and _waiting)
            "queue_depth": max(self._queued, len(self._waiting)),
            "max_queue": self.config.max_queue,
            "running_rows": len(self._running),
            "reserved_tokens": self._reserved,
            "tokens_per_second": round(rate, 2),
            "tokens_generated": self.tokens_generated,
            "requests_served": self.requests_served,
            "requests_cancelled": self.requests_cancelled,
            "requests_rejected": self.requests_rejected,
            "served_by_lane": lanes,
            "admission": {"safe_context": self.safe_context, "context_ceiling": self.context_ceiling,
                          **(self.memory.describe() if self.memory else {})},
            "prompt_cache": {**self.prompt_cache.stats(), "last_miss": self.last_miss},
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
                self.loaded, self.profile = load_model(info, self.host)
                self._setup()
                if self.config.adapter:
                    path = self.config.adapter
                    self.adapters.mount(self.loaded.model, adapter_id_for(path), path)
                    self.adapters.default = (adapter_id_for(path),)
            except BaseException as exc:  # handed to the caller of load()
                ready.set_exception(exc)
            else:
                self._warm_up()
                ready.set_result(None)
                try:
                    self._loop()
                finally:
                    self._refuse_pending_calls()
                    if self._batch is not None:
                        self._batch.close()
                    self.prompt_cache.close()  # finishes the prompt-cache writes still queued
                    mx.synchronize(self._stream)


    def _setup(self) -> None:
        """Plan memory, size the prompt cache and choose the lane (after the load)."""
        model, cfg = self.loaded.model, self.config
        self._eos = frozenset(self.loaded.tokenizer.eos_token_ids or ())
        if self.loaded.engine == "denoising":  # its own serial lane: no prompt cache, no batch
            from mlxrt.engine.denoising_lane import DenoisingLane

            self._serial = DenoisingLane(self.loaded.denoiser, done=self._done, tick=self._tick)
            return
        if self.loaded.engine != "autoregressive":
            return
        self.kv = resolve_kv_scheme(kv_quant=cfg.kv_quant, kv_bits=cfg.kv_bits, kv_group_size=cfg.kv_group_size,
                                    quantized_kv_start=cfg.quantized_kv_start,
                                    model_path=Path(self.info.path) if self.info.path else None)
        if self.kv is not None:
            self.kv.check(model)
        if cfg.draft_model:
            if self.kv is not None:
                from mlxrt.errors import ModelLoadError

                raise ModelLoadError(f"--draft-model cannot be combined with quantized KV caches ({self.kv.source})")
            self.speculator = load_speculator(cfg.draft_model, self.host, self.loaded, self.info,
                                              num_draft_tokens=cfg.num_draft_tokens)
        can_batch = batchable(model) and self.kv is None and self.speculator is None
        rows = cfg.batch if (cfg.batch > 1 and can_batch) else 1
        try:
            kv = measure_kv(model)
            if self.speculator is not None:  # every row keeps the draft's KV beside the model's
                draft_kv = measure_kv(self.speculator.model)
                kv = attrs.evolve(kv, per_token=kv.per_token + draft_kv.per_token, fixed=kv.fixed + draft_kv.fixed)
        except Exception:  # a model outside mlx-lm's cache protocol: no KV figures
            log.debug("could not measure KV cost", exc_info=True)
            from mlxrt.engine.memory import KVCost

            kv = KVCost(0, 0)
        weights = weight_bytes(model) + (weight_bytes(self.speculator.model) if self.speculator else 0)
        self.memory = plan_memory(weights, kv, budget=cfg.memory_budget,
                                  prompt_cache_bytes=cfg.prompt_cache_bytes, rows=rows)
        spec = self.speculator
        self.prompt_cache = open_prompt_cache(
            cfg.prompt_cache_dir, max_entries=cfg.prompt_cache_size, max_bytes=self.memory.prompt_cache_bytes,
            max_disk_bytes=cfg.prompt_cache_dir_bytes, model_path=self.info.path,
            models=[model] + ([spec.model] if spec else []),
            dtype=self.loaded.dtype.cast if self.loaded.dtype is not None else None,
            kv=self.kv.describe() if self.kv is not None else None,
            draft_path=spec.info.path if spec else None, adapters=self.adapters)
        self._snapshots_from = _snapshots_from(model) if self.speculator is None else None
        serial_model = QuantizingModel(model, self.kv) if self.kv is not None else model
        self._serial = SerialLane(serial_model, stream=self._stream, prefill_step_size=cfg.prefill_step_size,
                                  done=self._done, tick=self._tick, speculator=self.speculator)
        if rows > 1:
            self._batch = self._new_batch_lane(rows)
        elif cfg.batch > 1 and self.speculator is not None:
            log.warning("--batch %d with --draft-model: speculative decoding runs one sequence at a time, so "
                        "every request runs in the serial lane", cfg.batch)
        elif cfg.batch > 1 and self.kv is not None:
            log.warning("--batch %d: quantized KV caches (%s) cannot join a batch (mlx-lm's QuantizedKVCache "
                        "has no merge); requests run one at a time", cfg.batch, self.kv.source)
        elif cfg.batch > 1:
            log.warning("--batch %d: this model's cache layers cannot be batched (no merge); "
                        "requests run one at a time", cfg.batch)

    def _new_batch_lane(self, rows: int) -> BatchLane:
        cfg = self.config
        return BatchLane(self.loaded.model, stream=self._stream, size=rows, prefill_batch_size=cfg.prompt_concurrency,
                         prefill_step_size=cfg.prefill_step_size, eos=sorted(self._eos),
                         done=self._done, tick=self._tick, adapters=self.adapters)

    def _adapters_in_use(self) -> set[str]:
        return {key for row in self._running for key in row.adapters}

    def _warm_up(self) -> None:
        """Import the decode path and run one token, so the first request does not pay for it."""
        if self.loaded.engine != "autoregressive":
            return
        try:
            import mlx.core as mx
            from mlx_lm.models.cache import make_prompt_cache

            from mlxrt.engine.steps import token_steps

            first = self.loaded.tokenizer.eos_token_id or 0
            for _ in token_steps(mx.array([first]), self.loaded.model, max_tokens=1, stream=self._stream,
                                 cache=make_prompt_cache(self.loaded.model)):
                pass
        except Exception:  # a model that cannot warm up will fail its first request visibly
            log.warning("engine warm-up failed", exc_info=True)

    def _loop(self) -> None:
        while True:
            busy = self._batch is not None and len(self._batch) > 0
            if not self._take_inbox(block=not busy):
                return
            self._expire_waiting()
            self._admit()
            if self._batch is not None and len(self._batch):
                try:
                    self._batch.step()
                    self._batch.reap()
                except Exception as exc:  # a failed step fails its rows, not the server
                    self._fail_batch(exc)

    def _take_inbox(self, *, block: bool) -> bool:
        """Move inbox items to the waiting queue (or run them); False on the stop signal."""
        while True:
            try:
                item = self._inbox.get(block=block and not self._waiting, timeout=0.5 if block else None)
            except queue.Empty:
                return True
            block = False
            if item is None:
                return False
            if isinstance(item, Call):
                self._run_call(item)
            elif isinstance(item, Job):
                self._waiting.append(item)

    def _expire_waiting(self) -> None:
        if not self._waiting:
            return
        now = time.monotonic()
        keep: collections.deque[Job] = collections.deque()
        for job in self._waiting:
            if job.cancelled.is_set():
                self._dequeue(job)
                self.requests_cancelled += 1
            elif self._drain_until is not None:
                self._dequeue(job)
                self.requests_rejected += 1
                job.deliver(_shutting_down())
            elif job.deadline is not None and now > job.deadline:
                self._dequeue(job)
                self.requests_rejected += 1
                job.deliver(QueueFull(
                    f"the request waited {now - job.submitted:.1f} s for admission, past the request "
                    f"timeout of {self.config.request_timeout:g} s; retry later",
                    retry_after=self.retry_after(), code="queue_timeout"))
            else:
                keep.append(job)
        self._waiting = keep

    def _dequeue(self, job: Job) -> None:
        with self._lock:
            self._queued -= 1

    def _admit(self) -> None:
        """Admit waiting requests in arrival order while the lane and the budget allow."""
        while self._waiting:
            job = self._waiting[0]
            if job.cancelled.is_set():
                self._waiting.popleft()
                self._dequeue(job)
                self.requests_cancelled += 1
                continue
            budget = self.safe_context
            if self._running and budget is not None and self._reserved + job.need > budget:
                return  # waits for running rows to free their context
            serial = self._batch is None or job.request.vision is not None  # image prompts: serial lane
            if not serial:
                if not self._batch.has_room():
                    return
            elif self._running:
                return
            # A lone stream decodes in the serial lane's tight loop (mlx-lm's batch generator costs
            # a single row up to a third of its speed) and joins the batch when another arrives.
            # Not with logits processors: their state (a grammar) has seen the token the batch refeeds.
            lone = not serial and not self._running and len(self._waiting) == 1
            self._waiting.popleft()
            self._dequeue(job)
            row = self._prepare(job)
            if row is None:
                continue
            self._running.append(row)
            self._reserved += job.need
            if self._drain_until is not None:  # drain() ran while this row was being prepared
                _end_by(job, self._drain_until)
            if lone and not row.processors:
                if self._run_serial(row, handoff=self._work_arrived):
                    self._batch.resume(row)
            elif not serial:
                self._batch.add(row)
            else:
                self._run_serial(row)

    def _work_arrived(self) -> bool:
        return not self._inbox.empty()

    def _run_serial(self, row: Row, handoff: Callable[[], bool] | None = None) -> bool:
        """Run ``row`` in the serial lane; True when it stopped early for the batch (``handoff``)."""
        try:
            with self.adapters.select(row.adapters):
                return bool(self._serial.run(row, handoff=handoff) if handoff is not None else self._serial.run(row))
        except MlxrtError as exc:
            self._abandon(row, exc)
        except Exception as exc:  # keep serving: one failed generation must not kill the worker
            log.exception("generation %s failed", row.request.request_id)
            self._abandon(row, EngineError(f"generation failed: {type(exc).__name__}: {exc}"))
        return False

    def _fail_batch(self, exc: Exception) -> None:
        log.exception("batch step failed; failing its %d rows", len(self._batch.rows))
        error = EngineError(f"generation failed: {type(exc).__name__}: {exc}")
        rows = list(self._batch.rows.values())
        try:
            self._batch.close()
        except Exception:
            log.debug("closing the failed batch", exc_info=True)
        self._batch = self._new_batch_lane(self._batch.size)
        for row in rows:
            self._abandon(row, error)

    def _abandon(self, row: Row, error: MlxrtError) -> None:
        if row in self._running:
            self._running.remove(row)
            self._reserved -= row.job.need
            self.adapters.release(self._adapters_in_use())
        row.job.deliver(error)

    def _prepare(self, job: Job) -> Row | None:
        """Build the sampler chain, look the prompt up in the prompt cache, report it."""
        request = job.request
        tokenizer = self.loaded.tokenizer
        refused = getattr(self._serial, "refuse", lambda _request: None)(request)  # the lane's own limits
        if refused is not None:
            job.deliver(refused)
            return None
        try:
            # Resolved again here: the adapter may have been unmounted since the request was decoded.
            adapters = self.adapters.keys(request.adapters)
            sampler = build_sampler(self.host, request, self.info, tokenizer)
            processors = build_logits_processors(self.host, request, self.info)
        except MlxrtError as exc:
            job.deliver(exc)
            return None
        except Exception as exc:
            log.exception("building the sampler chain of %s failed", request.request_id)
            job.deliver(EngineError(f"building the sampler chain failed: {type(exc).__name__}: {exc}"))
            return None
        from mlx_lm.sample_utils import greedy_sampler

        if sampler is not greedy_sampler:
            seed = request.sampling.seed if request.sampling.seed is not None else self.seeds.next()
            sampler = seeded(sampler, seed)
        report, cache, reused = self._lookup(request)
        job.deliver(report)
        return Row(
            job=job, sampler=sampler, processors=processors, report=report, cache=cache, reused=reused,
            eos=self._eos, detok=Detokenizer(lambda ids: tokenizer.decode(ids, skip_special_tokens=False)),
            stops=StopMatcher(request.stop), timeout=self.config.request_timeout, adapters=adapters,
        )

    def _lookup(self, request: GenerationRequest) -> tuple[CacheReport, list[Any] | None, int]:
        prompt = request.prompt_ids
        # Image prompts bypass the cache: their placeholder ids are the same for every image.
        if not self.prompt_cache.enabled or len(prompt) < 2 or request.vision is not None:
            return CacheReport("off", 0, len(prompt)), None, 0
        found = self.prompt_cache.fetch(prompt, key=request.adapters, partition=request.partition)
        snippet = None
        if found.diverged_at is not None and found.status != "hit":
            snippet = self.loaded.tokenizer.decode(list(prompt[found.diverged_at:found.diverged_at + SNIPPET_TOKENS]))
            # /stats is shared by every client: counts only. The text (the request's own) goes
            # in its x-mlxrt-cache header; what the cache held there is another request's prompt.
            self.last_miss = {"status": found.status, "diverged_at": found.diverged_at,
                              "prompt_tokens": len(prompt), "cached_tokens": found.reused,
                              "reason": found.reason}
            if log.isEnabledFor(logging.DEBUG):  # a decode per miss otherwise, for nothing
                log.debug("prompt cache %s for %s: diverged at token %d of %d (%s): %r (cache held %r)",
                          found.status, request.request_id, found.diverged_at, len(prompt), found.reason, snippet,
                          self.loaded.tokenizer.decode(list(found.expected)))
        report = CacheReport(found.status, found.reused, len(prompt), found.diverged_at, snippet,
                             found.reason if found.status != "hit" else None)
        return report, found.cache, found.reused

    def _done(self, row: Row, reason: FinishReason, cache: list[Any] | None, tokens: Sequence[int]) -> None:
        """A row ended (either lane): report it, free its reservation, keep its cache."""
        if row in self._running:
            self._running.remove(row)
            self._reserved -= row.job.need
            self.adapters.release(self._adapters_in_use())
        row.finish(reason)
        now = time.monotonic()
        self.requests_served += 1
        self.requests_cancelled += reason is FinishReason.CANCELLED and row.error is None
        took = now - row.job.submitted
        if row.first_token_at is not None:
            self.ttft.observe(row.first_token_at - row.job.submitted)
        self.latency.observe(took)
        self._latency = took if not self._latency else 0.8 * self._latency + 0.2 * took
        if not self.prompt_cache.enabled or row.request.vision is not None:
            return
        snapshots, row.snapshots = row.snapshots, []
        try:
            self.prompt_cache.insert_turn(tokens if cache is not None else (), cache, snapshots,
                                          key=row.request.adapters, partition=row.request.partition)
        except ValueError:
            log.warning("prompt cache: %s's cache does not match its tokens; not stored",
                        row.request.request_id, exc_info=True)

    def _tick(self, n: int) -> None:
        """``n`` tokens were generated (per-second buckets for the rate in /stats)."""
        self.tokens_generated += n
        second = int(time.monotonic())
        if self._rate and self._rate[-1][0] == second:
            self._rate[-1][1] += n
        else:
            self._rate.append([second, n])
            while self._rate and second - self._rate[0][0] > RATE_WINDOW:
                self._rate.popleft()

    def _refuse_pending_calls(self) -> None:
        """At stop: a blocking caller still waiting on a raw call gets an error, never a hang."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Call) and item.loop is None:
                item.done.set_exception(EngineError("the engine stopped"))

    def _run_call(self, call: Call) -> None:
        def settle(setter: Callable[[Any], None], value: Any) -> None:
            if not call.done.done():
                setter(value)

        if call.loop is None:  # a blocking caller's thread-safe future
            try:
                call.done.set_result(call.fn(self.loaded))
            except BaseException as exc:
                call.done.set_exception(exc)
            return
        if call.done.cancelled():  # the awaiting request left (its client did): skip the forward
            return
        try:
            result = call.fn(self.loaded)
        except BaseException as exc:  # handed back to the awaiting request
            call.loop.call_soon_threadsafe(settle, call.done.set_exception, exc)
        else:
            call.loop.call_soon_threadsafe(settle, call.done.set_result, result)


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
