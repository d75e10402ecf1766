"""Connection limits uvicorn does not have: a header deadline and a connection cap.

uvicorn waits for a request's headers forever and accepts connections until the process runs
out of file descriptors, so a few thousand sockets that send their headers one byte at a time
starve everyone (``/health`` included). :func:`guarded_protocol` wraps uvicorn's HTTP protocol:

* **Header deadline.** A connection that has not sent a complete request head within
  ``--header-timeout`` seconds of connecting is closed.
* **Connection cap.** Past ``--max-connections`` open connections, a new one closes the
  oldest *idle* connection (no request in flight: still sending headers, or kept alive after
  its response), so a fresh client (a health check) still gets in while slow sockets wait to
  be reclaimed; when every connection is busy with a request, the new one is closed instead.

Both act once per connection, never per request or per streamed chunk.
"""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Any

__all__ = ["guarded_protocol", "default_max_connections"]

#: File descriptors kept for everything but client sockets (model files, the prompt-cache
#: folder, logs, the listening socket).
_FD_RESERVE = 64


def default_max_connections() -> int:
    """1,024, or fewer when the open-file limit is lower (keeping a reserve for the server)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(16, min(1024, soft - _FD_RESERVE))


def _idle(protocol: Any) -> bool:
    cycle = getattr(protocol, "cycle", None)
    return cycle is None or cycle.response_complete


def guarded_protocol(max_connections: int, header_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (h11 or httptools, as uvicorn picks) with the limits above."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class GuardedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.mlxrt_opened = time.monotonic()
            self.mlxrt_head_timer = self.loop.call_later(header_timeout, self._mlxrt_head_late)
            if len(self.connections) > max_connections:
                _make_room(self.connections, self, max_connections)

        def _mlxrt_head_late(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self.mlxrt_head_timer.cancel()
            super().connection_lost(exc)

    return GuardedHTTPProtocol


def _make_room(connections: Any, newcomer: Any, max_connections: int) -> None:
    open_ = [c for c in connections if not c.transport.is_closing()]
    if len(open_) <= max_connections:
        return  # the excess is already closing
    idle = [c for c in open_ if c is not newcomer and _idle(c)]
    victim = min(idle, key=lambda c: getattr(c, "mlxrt_opened", 0.0)) if idle else newcomer
    victim.transport.close()
