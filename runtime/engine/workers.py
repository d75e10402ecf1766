"""The threads engines run on, kept for the next engine when one stops.

MLX gives every thread that evaluates on the CPU a native thread of its own (its default
stream's, and one per ``mx.new_stream``), and ``mx.clear_streams()`` does not end it: a new
worker thread per model load left one native thread and about 1 MB behind on every load
(issue 31: 199 loads, 9 → 233 threads). So an engine runs on a :class:`Worker` from this
module's pool: a thread that makes its MLX stream once and runs one engine at a time; when the
engine stops, the thread waits for the next engine instead of ending. The pool never holds
more threads than engines ever ran at once (``--max-models``, plus one while a swap loads).

At exit the pool's threads clear their MLX streams and end (MLX aborts the process when a
thread that made streams is left to interpreter teardown); :func:`close` does it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Worker", "take", "close", "idle_count"]

#: A job: runs on the worker with the worker's MLX stream.
Job = Callable[[Any], None]


class Worker:
    """One thread that owns one MLX stream and runs jobs (one engine's whole life each)."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="mlxrt-engine", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def _loop(self) -> None:
        import mlx.core as mx

        # The engine's own stream, made on this thread: every MLX op of its engines runs on it.
        # (mlx-lm's default generation stream is thread-local; generating on it from a worker
        # thread makes MLX 0.32's CPU backend abort the process at exit.)
        stream = mx.new_stream(mx.default_device())
        try:
            while (job := self._jobs.get()) is not None:
                try:
                    job(stream)
                finally:
                    mx.synchronize(stream)
                if not _park(self):
                    break
        finally:
            # MLX wants each thread that made streams to destroy them before it ends.
            mx.clear_streams()


_lock = threading.Lock()
_idle: list[Worker] = []
_all: list[Worker] = []
_closing = False


def take() -> Worker:
    """An idle worker, or a new one."""
    with _lock:
        if _closing:
            raise RuntimeError("the process is exiting: no engine may start")
        if _idle:
            return _idle.pop()
        worker = Worker()
        _all.append(worker)
        return worker


def _park(worker: Worker) -> bool:
    """A worker's engine stopped: keep it for the next one (``False``: exiting, end the thread)."""
    with _lock:
        if _closing:
            return False
        _idle.append(worker)
        return True


def idle_count() -> int:
    """Workers waiting for an engine."""
    with _lock:
        return len(_idle)


def close(timeout: float = 5.0) -> None:
    """At exit, after every engine stopped: end the workers (each clears its MLX streams)."""
    global _closing
    with _lock:
        _closing = True
        idle, _idle[:] = list(_idle), []
        workers = list(_all)
    for worker in idle:
        worker._jobs.put(None)
    for worker in workers:
        if worker.thread is not threading.current_thread():
            worker.thread.join(timeout)
