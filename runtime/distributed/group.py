"""The distributed group as rank 0's engine sees it: each rank's shard, and the other ranks
as the engine's peers (:mod:`mlxrt.engine.peers`).

:class:`RankGroup` places rank 0's shard after the load, hands the engine the serial lane that
keeps the ranks in lockstep (:mod:`mlxrt.distributed.lockstep`), sends the idle heartbeat and the
final ``SHUTDOWN``, and holds the group's failure: once a rank is lost (a collective raised, or
the watchdog found one overdue) every request fails with 503 until the server restarts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.distributed.lockstep import (
    HEARTBEAT,
    SHUTDOWN,
    Lockstep,
    LockstepSerialLane,
    RankLost,
    WorkItem,
)
from mlxrt.errors import MlxrtError, ModelLoadError

if TYPE_CHECKING:
    from mlxrt.engine.lanes import SerialLane
    from mlxrt.records import LoadedModel

__all__ = ["DistributedSettings", "RankGroup", "shard_model", "place", "HEARTBEAT_EVERY"]

log = logging.getLogger("mlxrt.distributed.serving")

#: Seconds between idle heartbeats.
HEARTBEAT_EVERY = 1.0


@attrs.frozen
class DistributedSettings:
    """``mlxrt serve --distributed`` settings.

    :ivar pipeline: Pipeline parallel (``--pipeline``) instead of tensor parallel.
    :ivar backend: ``mx.distributed.init``'s backend (``any``, ``ring``, ``mpi``, ...).
    :ivar timeout: Seconds a collective may take before the peers are declared lost.
    """

    pipeline: bool = False
    backend: str = "any"
    timeout: float = 10.0

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> DistributedSettings:
        return cls(pipeline=bool(options.get("pipeline")), backend=options.get("distributed_backend") or "any",
                   timeout=float(options.get("distributed_timeout") or 10.0))


def shard_model(model: Any, group: Any, *, pipeline: bool) -> str:
    """Shard ``model`` in place for ``group`` with mlx-lm's own methods; the mode's name.

    :raises ValueError: The architecture has no such support in mlx-lm.
    """
    inner = getattr(model, "model", None)
    if pipeline:
        if not hasattr(inner, "pipeline"):
            raise ValueError(f"{type(model).__module__} has no pipeline support in mlx-lm; "
                             "drop --pipeline to use tensor parallelism")
        inner.pipeline(group)
        return "pipeline"
    if not hasattr(model, "shard"):
        hint = " (try --pipeline)" if hasattr(inner, "pipeline") else ""
        raise ValueError(f"{type(model).__module__} has no tensor-parallel support (shard) in mlx-lm{hint}")
    model.shard(group)
    return "tensor"


def place(model: Any, group: Any, settings: DistributedSettings) -> None:
    """Shard, materialize this rank's weights, and wait for every rank to be ready (every rank)."""
    import mlx.core as mx

    try:
        mode = shard_model(model, group, pipeline=settings.pipeline)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    mx.eval(model.parameters())
    # Every rank has its shard; and all of them were told the same mode.
    ranks, piped = mx.distributed.all_sum(mx.array([1, int(settings.pipeline)]), group=group).tolist()
    if piped not in (0, ranks):
        raise ModelLoadError(f"{piped} of {ranks} ranks were started with --pipeline: give every rank the same flags")
    log.info("rank %d of %d holds its %s-parallel shard", group.rank(), group.size(), mode)


class RankGroup:
    """The other ranks, as rank 0's engine's peers (implements :class:`mlxrt.engine.peers.Peers`).

    :param group: The ``mx.distributed`` group (this process is its rank 0).
    :param settings: The ``--distributed`` settings.
    :param fail: Fails every request the engine holds (running, waiting, submitted) with an
        error; called from any thread once the group is lost.
    """

    def __init__(self, group: Any, settings: DistributedSettings, fail: Callable[[MlxrtError], None]) -> None:
        self.group = group
        self.settings = settings
        self.lockstep = Lockstep(group, settings.timeout)
        #: Why the group is lost, once it is (then every request gets 503).
        self.failure: str | None = None
        self._failed_lock = threading.Lock()
        self._fail = fail

    # -- the engine's peers (on its worker) ------------------------------------------------------

    def place(self, loaded: LoadedModel) -> None:
        if loaded.engine != "autoregressive":
            raise ModelLoadError(f"--distributed serves autoregressive models only, not {loaded.engine} ones")
        place(loaded.model, self.group, self.settings)

    def serial_lane(self, lane: SerialLane) -> SerialLane:
        return LockstepSerialLane(self.lockstep, self, model=lane.model, stream=lane.stream,
                                  prefill_step_size=lane.prefill_step_size, done=lane.done, tick=lane.tick)

    def refusal(self) -> MlxrtError | None:
        return RankLost(self.failure) if self.failure is not None else None

    def idle(self) -> None:
        if self.failure is None and time.monotonic() - self.lockstep.last_beat >= HEARTBEAT_EVERY:
            try:
                self.lockstep.send(WorkItem(HEARTBEAT))
            except RuntimeError as exc:
                self.declare_failed(f"a rank of the distributed group was lost: {exc}")

    def close(self) -> None:
        if self.failure is None:
            try:
                self.lockstep.send(WorkItem(SHUTDOWN))
            except RuntimeError:
                log.warning("could not tell the other ranks to shut down", exc_info=True)

    # -- failure (any thread) --------------------------------------------------------------------

    def declare_failed(self, reason: str) -> None:
        """Mark the group lost and fail every request the engine holds (any thread; idempotent)."""
        with self._failed_lock:
            if self.failure is not None:
                return
            self.failure = reason
        log.error("%s; failing requests with 503 until restarted", reason)
        self._fail(RankLost(reason))

    def watch(self, serving: Callable[[], bool]) -> None:
        """Declare the group lost when a collective has not returned within the timeout (a
        watchdog thread's loop, while ``serving()``)."""
        while serving() and self.failure is None:
            if self.lockstep.overdue(time.monotonic()):
                self.declare_failed(f"a rank of the distributed group did not answer within "
                                    f"{self.settings.timeout:g} s (--distributed-timeout)")
                return
            time.sleep(0.2)
