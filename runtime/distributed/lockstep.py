"""The lockstep protocol that keeps the ranks of ``mlxrt serve --distributed`` running the
same steps, and the serial lane that speaks it on rank 0.

All collectives run on the engine's MLX stream, in the same order on every rank:

* an **item** (:class:`WorkItem`) is a header
  ``int32[4] = [kind, max_tokens, prompt_len, prefill_step_size]``
  all-summed from rank 0 (every other rank contributes zeros), followed for a ``JOB`` by the
  prompt ids as ``int32[prompt_len]``. Kinds: ``HEARTBEAT`` (idle, once a second: proves the
  peers are alive), ``JOB`` (run one generation), ``SHUTDOWN``.
* during a job every rank runs mlx-lm's ``generate_step`` on its shard; the sampled token is
  rank 0's, all-summed inside the step's graph (so no rank samples on its own and seeds or
  float rounding cannot make the ranks diverge), and after each token one ``int32[1]`` says
  whether rank 0 stops there (EOS, stop string, cancellation, timeout, a failed sampler chain).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs

from mlxrt.engine.lanes import Row, SerialLane
from mlxrt.errors import EngineError, MlxrtError
from mlxrt.records import FinishReason

__all__ = ["HEARTBEAT", "JOB", "SHUTDOWN", "WorkItem", "RankLost", "Lockstep", "LockstepSerialLane", "is_lost"]

log = logging.getLogger("mlxrt.distributed.serving")

HEARTBEAT, JOB, SHUTDOWN = 1, 2, 3

class RankLost(MlxrtError):
    """A rank of the distributed group died or stopped answering (503)."""

    status = 503
    type = "service_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="rank_lost")



@attrs.frozen
class WorkItem:
    """One item of the lockstep protocol, as every rank receives it.

    :ivar kind: ``HEARTBEAT``, ``JOB`` or ``SHUTDOWN``.
    :ivar max_tokens: A job's token limit (the ranks' ``generate_step`` ends on the same count).
    :ivar prompt: A job's prompt ids (the whole prompt: the distributed engine has no prompt cache).
    """

    kind: int
    max_tokens: int = 0
    prompt: tuple[int, ...] = ()
    #: Prompt tokens per prefill chunk (rank 0's ``--prefill-step-size``: the chunks, and so
    #: the collectives of the prefill, must be the same on every rank).
    prefill_step_size: int = 2048



class Lockstep:
    """The collectives that keep every rank running the same steps (see the module doc).

    One instance per rank, used on the engine's worker (rank 0) or the follower loop. For
    the watchdog it keeps :attr:`waiting`: since when rank 0 has been waiting on the other
    ranks and for how long it may: one ``timeout`` per blocking collective, per decode step
    during a job, and per prefill chunk (plus one) until a job's first token.
    """

    def __init__(self, group: Any, timeout: float = 10.0) -> None:
        self.group = group
        self.leader = group.rank() == 0
        self.timeout = timeout
        #: ``(since, allowance)`` while waiting on the other ranks, else ``None``.
        self.waiting: tuple[float, float] | None = None
        self._in_job = False
        self.last_beat = 0.0

    def overdue(self, now: float) -> bool:
        """Whether the current wait has lasted longer than it may (the watchdog's question)."""
        waiting = self.waiting
        return waiting is not None and now - waiting[0] > waiting[1]

    def begin_job(self, prefill_chunks: int) -> None:
        self._in_job = True
        self.waiting = (time.monotonic(), self.timeout * (1 + max(prefill_chunks, 0)))

    def end_job(self) -> None:
        self._in_job = False
        self.waiting = None

    def _sum(self, values: Any) -> Any:
        import mlx.core as mx

        return mx.distributed.all_sum(values, group=self.group)

    def _blocking(self, values: Any) -> list[int]:
        if not self._in_job:
            self.waiting = (time.monotonic(), self.timeout)
        try:
            return self._sum(values).tolist()
        finally:
            # In a job the clock restarts at each token: the next decode step may take a timeout.
            self.waiting = (time.monotonic(), self.timeout) if self._in_job else None

    def send(self, item: WorkItem) -> None:
        """Rank 0: broadcast one item."""
        import mlx.core as mx

        limit = 2**31 - 1  # int32 on the wire; no generation gets near it
        self._blocking(mx.array([item.kind, min(item.max_tokens, limit), len(item.prompt),
                                 min(item.prefill_step_size, limit)], dtype=mx.int32))
        if item.kind == JOB and item.prompt:
            self._blocking(mx.array(list(item.prompt), dtype=mx.int32))
        self.last_beat = time.monotonic()

    def receive(self) -> WorkItem:
        """Other ranks: the next item (blocks until rank 0 sends one)."""
        import mlx.core as mx

        kind, max_tokens, length, step = self._sum(mx.zeros((4,), dtype=mx.int32)).tolist()
        prompt = self._sum(mx.zeros((length,), dtype=mx.int32)).tolist() if kind == JOB and length else []
        return WorkItem(kind, max_tokens, tuple(prompt), step)

    def sampler(self, sample: Any = None) -> Any:
        """The sampler every rank gives ``generate_step``: rank 0's choice, all-summed."""
        import mlx.core as mx

        def shared(logprobs: Any) -> Any:
            if sample is not None:
                mine = sample(logprobs).astype(mx.int32)
            else:
                mine = mx.zeros((logprobs.shape[0],), dtype=mx.int32)
            return self._sum(mine)

        return shared

    def agree(self, stop: bool) -> bool:
        """After each token: whether rank 0 stops generating here (every rank learns it)."""
        import mlx.core as mx

        return bool(self._blocking(mx.array([1 if (stop and self.leader) else 0], dtype=mx.int32))[0])


def is_lost(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and ("peer" in str(exc) or "[ring]" in str(exc) or "MPI" in str(exc))



class LockstepSerialLane(SerialLane):
    """The serial lane, with each generation announced to the other ranks and every token
    shared with them (see :class:`Lockstep`)."""

    #: The other ranks run mlx-lm's ``generate_step``, which queues the next step (its
    #: collectives) before handing a token out and agreeing on a stop: rank 0 does the same from
    #: the first token, or the ranks would meet each other's collectives out of order.
    first_at_once = False

    def __init__(self, lockstep: Lockstep, ranks: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lockstep = lockstep
        #: The group (:class:`mlxrt.distributed.group.RankGroup`): its ``failure`` and ``declare_failed``.
        self.ranks = ranks
        self._fault: Exception | None = None  # raised by the running row's sampler chain
        self._row: Row | None = None

    def _guarded(self, fn: Any, fallback: Any) -> Any:
        """``fn``, except that an exception is kept for :meth:`agree` (which stops every rank
        after the current token) and ``fallback`` answers instead: a plugin's sampler or
        processor failing must not leave the other ranks waiting for a step rank 0 never ran."""

        def call(*args: Any) -> Any:
            if self._fault is None:
                try:
                    return fn(*args)
                except Exception as exc:
                    log.exception("the sampler chain of a request failed")
                    self._fault = exc
            return fallback(*args)

        return call

    def run(self, row: Row) -> None:
        import mlx.core as mx

        if self.ranks.failure is not None:
            raise RankLost(self.ranks.failure)
        self._fault, self._row = None, row
        row.processors = [self._guarded(p, lambda _tokens, logits: logits) for p in row.processors]
        sample = self._guarded(row.sampler, lambda logprobs: mx.argmax(logprobs, axis=-1))
        try:
            self.lockstep.send(WorkItem(JOB, row.request.max_tokens, tuple(row.request.prompt_ids),
                                        self.prefill_step_size))
            self.lockstep.begin_job(-(-len(row.request.prompt_ids) // self.prefill_step_size))
            row.sampler = self.lockstep.sampler(sample)
            super().run(row)
        except Exception as exc:
            # Whatever interrupted the generation, the other ranks are now somewhere else in
            # the protocol: the group cannot be trusted any more.
            reason = (f"a rank of the distributed group was lost: {exc}" if is_lost(exc) else
                      f"the ranks fell out of step: generation failed on rank 0: {type(exc).__name__}: {exc}")
            self.ranks.declare_failed(reason)
            raise RankLost(reason) from exc
        finally:
            self.lockstep.end_job()

    def agree(self, stop: Any) -> Any:
        failed = self._fault is not None
        if not self.lockstep.agree(stop is not None or failed):
            return None
        if failed:
            if self._row is not None and self._row.error is None:
                self._row.error = EngineError(f"generation failed: {type(self._fault).__name__}: {self._fault}")
            return stop or FinishReason.CANCELLED
        return stop
