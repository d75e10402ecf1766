"""The scheduler: the engine's inbox, its waiting queue and the worker loop that admits requests
into the lanes.

The worker loop, between decode steps:

1. takes new submissions and raw calls (:meth:`mlxrt.engine.engine.Engine.call`) from its inbox;
2. drops waiting requests whose client left, fails those that waited past
   ``--request-timeout`` (429);
3. admits waiting requests in arrival order while the lane has room and, under
   ``--memory-budget``, while the running rows' prompt + max_tokens together stay within the
   safe context (a request that does not fit waits; it never overcommits memory);
4. on admission builds the request's sampler chain, looks its prompt up in the prompt cache
   and reports the lookup; then runs a step of the lane (see :mod:`mlxrt.engine.lanes`).

The event loop's side (:meth:`Scheduler.accept`, :meth:`Scheduler.submit`,
:meth:`Scheduler.drain`) only counts, queues and answers; everything else runs on the worker.
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mlxrt.cache.prompt_cache import PromptCache
from mlxrt.engine.bridge import WAKE, Call
from mlxrt.engine.lanes import BatchLane, Job, Row, generation_error
from mlxrt.engine.sampling import (
    build_logits_processors,
    build_sampler,
    processors_stateless,
    seeded,
)
from mlxrt.errors import EngineError, MlxrtError, QueueFull, ShuttingDown
from mlxrt.records import CacheReport, FinishReason, GenerationRequest
from mlxrt.text.detokenize import Detokenizers
from mlxrt.text.stops import StopMatcher

if TYPE_CHECKING:
    from mlxrt.engine.adapters import AdapterRegistry
    from mlxrt.engine.config import EngineConfig
    from mlxrt.engine.peers import Peers
    from mlxrt.engine.sampling import SeedSource
    from mlxrt.engine.worker_setup import WorkerSetup
    from mlxrt.metrics import Histogram
    from mlxrt.records import LoadedModel, ModelInfo
    from mlxrt.registry import PluginHost

__all__ = ["Scheduler", "shutting_down"]

log = logging.getLogger("mlxrt.engine.engine")  # the engine's logger: its messages read as before

#: Prompt tokens decoded into a cache miss's snippet.
SNIPPET_TOKENS = 8
#: Seconds over which ``/stats`` reports tokens per second.
RATE_WINDOW = 10.0


def shutting_down() -> ShuttingDown:
    return ShuttingDown("the server is shutting down; retry on another instance or after it restarts")


def _end_by(job: Job, until: float) -> None:
    """Make ``job`` end with :class:`ShuttingDown` at ``until`` unless it finishes before."""
    job.deadline_error = shutting_down()  # before the deadline: the worker reads them in that order
    if job.deadline is None or job.deadline > until:
        job.deadline = until


class Scheduler:
    """Queues one engine's requests and runs them in its lanes (see the module).

    :param host: The plugin host (sampler and processor hooks per request).
    :param config: Queueing, timeout and batching settings.
    :param adapters: The engine's adapter registry (rows hold the adapters they run with).
    :param seeds: Seeds for sampled requests that name none.
    :param ttft: The time-to-first-token histogram.
    :param latency: The generation-duration histogram.
    :param peers: Processes that run every forward with this one (:mod:`mlxrt.engine.peers`).

    The lanes and the prompt cache arrive with :meth:`equip`, after the load.
    """

    def __init__(self, host: PluginHost, config: EngineConfig, *, adapters: AdapterRegistry, seeds: SeedSource,
                 ttft: Histogram, latency: Histogram, peers: Peers | None = None) -> None:
        self.host = host
        self.config = config
        self.adapters = adapters
        self.seeds = seeds
        self.ttft = ttft
        self.latency = latency
        self.peers = peers
        self.inbox: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self.queued = 0  # submitted, not yet admitted or dropped (guarded by _lock)
        self.drain_until: float | None = None  # set once by drain() (shutdown)
        # Worker-only state (set by equip, after the load).
        self.loaded: LoadedModel | None = None
        self.info: ModelInfo | None = None
        self.served_model: object = None  # the served model, handed to the sampler and processor hooks
        self.prompt_cache = PromptCache(max_entries=0)
        self.serial: Any = None  # SerialLane or DenoisingLane
        self.batch: BatchLane | None = None
        self._new_batch: Callable[[int], BatchLane] | None = None
        self.eos: frozenset[int] = frozenset()
        self.safe_context: int | None = None
        self.detokenizers: Detokenizers | None = None
        self.waiting: collections.deque[Job] = collections.deque()
        self.running: list[Row] = []  # rows admitted and not finished (either lane)
        self.reserved = 0
        self._rate: collections.deque[list[int]] = collections.deque()  # [second, tokens]
        self._latency = 0.0  # EWMA of request durations, seconds
        self.last_miss: dict[str, Any] | None = None
        self.requests_served = 0
        self.requests_cancelled = 0
        self.requests_rejected = 0
        self.tokens_generated = 0

    def equip(self, loaded: LoadedModel, info: ModelInfo, setup: WorkerSetup) -> None:
        """Take the loaded model and what the set-up built around it (on the worker, before the loop)."""
        self.loaded, self.info = loaded, info
        self.eos = setup.eos
        self.detokenizers = Detokenizers.of(loaded.tokenizer)
        if setup.prompt_cache is not None:
            self.prompt_cache = setup.prompt_cache
        self.safe_context = setup.memory.safe_context if setup.memory is not None else None
        self.serial, self.batch, self._new_batch = setup.serial, setup.batch, setup.new_batch

    # -- event loop (any thread) -------------------------------------------------------------------

    def accept(self) -> None:
        """Count one more submission in.

        :raises ShuttingDown: :meth:`drain` ran.
        :raises QueueFull: ``--max-queue`` requests are already waiting for admission.
        """
        with self._lock:
            if self.drain_until is not None:
                raise shutting_down()
            if self._queue_is_full():
                self.requests_rejected += 1
                raise QueueFull(
                    f"the server is at capacity: {self.queued} requests are waiting (--max-queue "
                    f"{self.config.max_queue}); retry later", retry_after=self.retry_after())
            self.queued += 1

    def submit(self, item: Job | Call) -> None:
        """Hand ``item`` (an accepted job, or a raw call) to the worker."""
        self.inbox.put(item)

    def wake(self) -> None:
        """Make the worker look at its queue now (a waiting job was cancelled)."""
        self.inbox.put(WAKE)

    def stop(self) -> None:
        """Tell the worker loop to end (after the current step)."""
        self.inbox.put(None)

    def drain(self, grace: float) -> None:
        """Refuse new and waiting requests (503 :class:`ShuttingDown`) and give running ones
        ``grace`` seconds, after which each ends with that error. Once; later calls do nothing."""
        with self._lock:
            if self.drain_until is not None:
                return
            self.drain_until = time.monotonic() + grace
        for row in list(self.running):  # a row admitted after this sees drain_until in _admit
            _end_by(row.job, self.drain_until)
        # Waiting requests are answered from here, not by the worker: in the serial lane it is
        # busy with the running request for up to `grace`. Cancelled, the worker drops them.
        with self.inbox.mutex:
            waiting = [item for item in self.inbox.queue if isinstance(item, Job)]
        for job in [*waiting, *list(self.waiting)]:  # list(deque) copies without yielding the GIL
            if not job.cancelled.is_set():
                job.deliver(shutting_down())
                job.cancelled.set()
        self.wake()

    def fail_all(self, error: MlxrtError) -> None:
        """Deliver ``error`` to every running row, waiting job and submission the worker has
        not taken yet (any thread: the worker may be stuck for good)."""
        for row in list(self.running):
            row.job.deliver(error)
        for job in list(self.waiting):
            job.deliver(error)
        left = []
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Job):
                self._dequeue(item)
                item.deliver(error)
            else:
                left.append(item)
        for item in left:
            self.inbox.put(item)

    def _queue_is_full(self) -> bool:
        # Only requests beyond the lane's free rows wait, so only those count against
        # --max-queue (a request that will be admitted at once is never refused).
        rows = self.batch.size if self.batch is not None else 1
        free = max(rows - len(self.running), 0)
        return self.queued - free >= self.config.max_queue

    def retry_after(self) -> int:
        """Seconds a refused client should wait: about one request's duration per batch of
        waiting requests ahead of it."""
        rows = self.config.batch if self.batch is not None else 1
        return max(1, math.ceil(self._latency * max(self.queued, 1) / rows)) if self._latency else 1

    def tokens_per_second(self) -> float:
        """Tokens generated per second over the last :data:`RATE_WINDOW` seconds."""
        now = time.monotonic()
        window = [(t, n) for t, n in list(self._rate) if now - t <= RATE_WINDOW]
        return sum(n for _, n in window) / max(now - window[0][0], 1.0) if window else 0.0

    def adapters_in_use(self) -> set[str]:
        """The adapters running rows hold (on the worker)."""
        return {key for row in self.running for key in row.adapters}

    # -- worker thread ---------------------------------------------------------------------------

    def run(self) -> None:
        """The worker loop, until :meth:`stop`; then the calls still queued are refused and the
        batch lane is closed."""
        try:
            self._loop()
        finally:
            self._refuse_pending_calls()
            if self.batch is not None:
                self.batch.close()

    def _loop(self) -> None:
        peers = self.peers
        while True:
            busy = self.batch is not None and len(self.batch) > 0
            if not self._take_inbox(block=not busy):
                break
            if peers is not None and (error := peers.refusal()) is not None:
                while self.waiting:
                    job = self.waiting.popleft()
                    self._dequeue(job)
                    job.deliver(error)
                continue
            self._expire_waiting()
            self._admit()
            if self.batch is not None and len(self.batch):
                try:
                    self.batch.step()
                    self.batch.reap()
                except Exception as exc:  # a failed step fails its rows, not the server
                    self._fail_batch(exc)
            if peers is not None:
                peers.idle()
        if peers is not None:
            peers.close()

    def _take_inbox(self, *, block: bool) -> bool:
        """Move inbox items to the waiting queue (or run them); False on the stop signal."""
        while True:
            try:
                item = self.inbox.get(block=block and not self.waiting, timeout=0.5 if block else None)
            except queue.Empty:
                return True
            block = False
            if item is None:
                return False
            if isinstance(item, Call):
                self._run_call(item)
            elif isinstance(item, Job):
                self.waiting.append(item)

    def _expire_waiting(self) -> None:
        if not self.waiting:
            return
        now = time.monotonic()
        keep: collections.deque[Job] = collections.deque()
        for job in self.waiting:
            if job.cancelled.is_set():
                self._dequeue(job)
                self.requests_cancelled += 1
            elif self.drain_until is not None:
                self._dequeue(job)
                self.requests_rejected += 1
                job.deliver(shutting_down())
            elif job.deadline is not None and now > job.deadline:
                self._dequeue(job)
                self.requests_rejected += 1
                job.deliver(QueueFull(
                    f"the request waited {now - job.submitted:.1f} s for admission, past the request "
                    f"timeout of {self.config.request_timeout:g} s; retry later",
                    retry_after=self.retry_after(), code="queue_timeout"))
            else:
                keep.append(job)
        self.waiting = keep

    def _dequeue(self, job: Job) -> None:
        with self._lock:
            self.queued -= 1

    def _next_job(self) -> Job:
        """The waiting job to admit next: the oldest, unless it is a choice of a request whose
        choices already hold their share of the rows (half the lane's, at least one) while a
        job of another request waits; then the oldest such job. A request's ``n`` choices
        queue like ``n`` requests, but one ``n: 128`` never keeps every row from the others
        (before, a 2-token chat queued behind one waited for all 128)."""
        head = self.waiting[0]
        group = head.request.choice_group
        if not group or len(self.waiting) == 1:
            return head
        share = max(1, (self.batch.size if self.batch is not None else 1) // 2)
        held = collections.Counter(row.request.choice_group for row in self.running)
        if held[group] < share:
            return head
        for job in self.waiting:
            other = job.request.choice_group
            if not other or held[other] < share:
                return job
        return head

    def _admit(self) -> None:
        """Admit waiting requests while the lane and the budget allow, in arrival order but for
        the share of rows one request's choices may hold (:meth:`_next_job`)."""
        while self.waiting:
            job = self._next_job()
            if job.cancelled.is_set():
                self.waiting.remove(job)
                self._dequeue(job)
                self.requests_cancelled += 1
                continue
            budget = self.safe_context
            if self.running and budget is not None and self.reserved + job.need > budget:
                return  # waits for running rows to free their context
            serial = self.batch is None or job.request.vision is not None  # image prompts: serial lane
            if not serial:
                if not self.batch.has_room():
                    return
            elif self.running:
                return
            # A lone stream decodes in the serial lane's tight loop (mlx-lm's batch generator costs
            # a single row up to a third of its speed) and joins the batch when another arrives.
            # Not with logits processors that may keep state (a grammar, a plugin's): it has seen
            # the token the batch refeeds. A logit bias (ignore_eos's) or a penalty keeps none.
            lone = not serial and not self.running and len(self.waiting) == 1
            self.waiting.remove(job)
            self._dequeue(job)
            row = self._prepare(job)
            if row is None:
                continue
            self.running.append(row)
            self.reserved += job.need
            if self.drain_until is not None:  # drain() ran while this row was being prepared
                _end_by(job, self.drain_until)
            if lone and processors_stateless(row.processors):
                if self._run_serial(row, handoff=self._work_arrived):
                    self.batch.resume(row)
            elif not serial:
                self.batch.add(row)
            else:
                self._run_serial(row)

    def _work_arrived(self) -> bool:
        return not self.inbox.empty()

    def _run_serial(self, row: Row, handoff: Callable[[], bool] | None = None) -> bool:
        """Run ``row`` in the serial lane; True when it stopped early for the batch (``handoff``)."""
        try:
            with self.adapters.select(row.adapters):
                return bool(self.serial.run(row, handoff=handoff) if handoff is not None else self.serial.run(row))
        except MlxrtError as exc:
            self._abandon(row, exc)
        except Exception as exc:  # keep serving: one failed generation must not kill the worker
            log.exception("generation %s failed", row.request.request_id)
            self._abandon(row, generation_error(exc))
        return False

    def _fail_batch(self, exc: Exception) -> None:
        log.exception("batch step failed; failing its %d rows", len(self.batch.rows))
        error = generation_error(exc)
        rows = list(self.batch.rows.values())
        try:
            self.batch.close()
        except Exception:
            log.debug("closing the failed batch", exc_info=True)
        self.batch = self._new_batch(self.batch.size)
        for row in rows:
            self._abandon(row, error)

    def _abandon(self, row: Row, error: MlxrtError) -> None:
        if row in self.running:
            self.running.remove(row)
            self.reserved -= row.job.need
            self.adapters.release(self.adapters_in_use())
        row.job.deliver(error)

    def _prepare(self, job: Job) -> Row | None:
        """Build the sampler chain, look the prompt up in the prompt cache, report it."""
        request = job.request
        tokenizer = self.loaded.tokenizer
        refused = getattr(self.serial, "refuse", lambda _request: None)(request)  # the lane's own limits
        if refused is not None:
            job.deliver(refused)
            return None
        try:
            # Resolved again here: the adapter may have been unmounted since the request was decoded.
            adapters = self.adapters.keys(request.adapters)
            sampler = build_sampler(self.host, request, self.info, tokenizer, model=self.served_model)
            processors = build_logits_processors(self.host, request, self.info, model=self.served_model)
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
            eos=self.eos, detok=self.detokenizers.new(),
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

    def done(self, row: Row, reason: FinishReason, cache: list[Any] | None, tokens: Sequence[int]) -> None:
        """A row ended (either lane): report it, free its reservation, keep its cache."""
        if row in self.running:
            self.running.remove(row)
            self.reserved -= row.job.need
            self.adapters.release(self.adapters_in_use())
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

    def tick(self, n: int) -> None:
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
                item = self.inbox.get_nowait()
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
