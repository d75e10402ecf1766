"""The seam through which other processes run every forward with an engine's worker.

An :class:`~mlxrt.engine.engine.Engine` built with ``peers`` (``serve --distributed``: rank 0's
:class:`mlxrt.distributed.group.RankGroup`) shares its model with processes that must take
part in each of its forwards. The engine then skips its warm-up (a forward on this process
alone would wait on the peers for ever) and calls the peers at these points, all on the worker:

1. after the load, before the set-up: :meth:`Peers.place` (shard the model);
2. after the set-up: :meth:`Peers.serial_lane` (the lane that keeps the peers in step);
3. each turn of the scheduler's loop: :meth:`Peers.refusal` before admission (an error every
   waiting request gets instead), :meth:`Peers.idle` after it (a heartbeat);
4. when the loop ends (the engine stops): :meth:`Peers.close`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mlxrt.engine.lanes import SerialLane
    from mlxrt.errors import MlxrtError
    from mlxrt.records import LoadedModel

__all__ = ["Peers"]


class Peers(Protocol):
    """Processes that run every forward of an engine's model with it (see the module)."""

    def place(self, loaded: LoadedModel) -> None:
        """After the load, before the set-up: take this process's part of ``loaded``.

        :raises ModelLoadError: The model cannot be served with these peers (the load fails).
        """

    def serial_lane(self, lane: SerialLane) -> SerialLane:
        """The lane the engine runs requests in instead of ``lane`` (built by the set-up)."""

    def refusal(self) -> MlxrtError | None:
        """An error for every waiting request (the peers are lost), or None: admit as usual."""

    def idle(self) -> None:
        """Once per turn of the worker loop, after admission (keep the peers waiting in step)."""

    def close(self) -> None:
        """The worker loop ended: the engine stops."""
