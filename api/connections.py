"""Connection limits uvicorn does not have: header and body deadlines and a connection cap.

uvicorn waits for a request's headers and body forever and accepts connections until the
process runs out of file descriptors, so a few thousand sockets that send their headers one
byte at a time, or send complete headers and then stall the body, starve everyone (``/health``
included). :func:`guarded_protocol` wraps uvicorn's HTTP protocol:

* **Header deadline.** A connection that has not sent a complete request head within
  ``--header-timeout`` seconds of connecting is closed.
* **Body deadline.** A request whose body has not fully arrived ``--body-timeout`` seconds
  after its head gets 408 (``code: "body_timeout"``) and its connection is closed.
* **Connection cap.** Past ``--max-connections`` open connections, a new one closes the
  oldest *idle* connection (no request in flight: still sending headers, or kept alive after
  its response), else the oldest one still sending its request body (nothing has been
  answered or computed for it yet), so a fresh client (a health check) still gets in while
  slow sockets wait to be reclaimed; when every connection is busy with a request whose body
  has arrived, the new one is closed instead.

They act once per connection or request, never per streamed chunk.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from typing import Any

from mlxrt.compat import (
    uvicorn_connections,
    uvicorn_http_protocol,
    uvicorn_loop,
    uvicorn_request,
    uvicorn_request_progress,
    uvicorn_request_scope,
    uvicorn_transport,
)

__all__ = ["guarded_protocol", "default_max_connections", "BODY_TIMED_OUT", "DEFAULT_BODY_TIMEOUT"]

#: File descriptors kept for everything but client sockets (model files, the prompt-cache
#: folder, logs, the listening socket).
_FD_RESERVE = 64


def default_max_connections() -> int:
    """1,024, or fewer when the open-file limit is lower (keeping a reserve for the server)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(16, min(1024, soft - _FD_RESERVE))


#: Seconds a request's body may take to arrive after its head (``--body-timeout``).
DEFAULT_BODY_TIMEOUT = 60.0
#: Set in the ASGI scope of a request answered 408 here (the app, left without a body, fails).
BODY_TIMED_OUT = "mlxrt.body_timed_out"


def _idle(protocol: Any) -> bool:
    request = uvicorn_request(protocol)
    return request is None or uvicorn_request_progress(request).response_complete


def _receiving(protocol: Any) -> bool:
    """Still sending its request body, with nothing answered yet."""
    request = uvicorn_request(protocol)
    if request is None:
        return False
    progress = uvicorn_request_progress(request)
    return progress.more_body and not progress.response_started


def _timeout_response(body_timeout: float) -> bytes:
    body = json.dumps({"error": {
        "message": f"the request body did not arrive within {body_timeout:g} s of its headers (--body-timeout)",
        "type": "invalid_request_error", "param": None, "code": "body_timeout"}}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def guarded_protocol(max_connections: int, header_timeout: float,
                     body_timeout: float = DEFAULT_BODY_TIMEOUT) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (h11 or httptools, as uvicorn picks) with the limits above."""
    class GuardedHTTPProtocol(uvicorn_http_protocol()):  # type: ignore[misc]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.mlxrt_opened = time.monotonic()
            self.mlxrt_head_timer = uvicorn_loop(self).call_later(header_timeout, self._mlxrt_head_late)
            self.mlxrt_body_timer: asyncio.TimerHandle | None = None
            self.mlxrt_timed: Any = None  # the request the body timer watches
            if len(uvicorn_connections(self)) > max_connections:
                _make_room(uvicorn_connections(self), self, max_connections)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            request = uvicorn_request(self)
            # A new request whose body did not come with its head: its body's deadline starts.
            if (request is not None and request is not self.mlxrt_timed
                    and uvicorn_request_progress(request).more_body):
                self.mlxrt_timed = request
                if self.mlxrt_body_timer is not None:
                    self.mlxrt_body_timer.cancel()
                self.mlxrt_body_timer = uvicorn_loop(self).call_later(body_timeout, self._mlxrt_body_late, request)

        def _mlxrt_head_late(self) -> None:
            transport = uvicorn_transport(self)
            if uvicorn_request(self) is None and not transport.is_closing():
                transport.close()

        def _mlxrt_body_late(self, request: Any) -> None:
            transport = uvicorn_transport(self)
            if (uvicorn_request(self) is not request or not uvicorn_request_progress(request).more_body
                    or transport.is_closing()):
                return
            if not uvicorn_request_progress(request).response_started:
                transport.write(_timeout_response(body_timeout))
                uvicorn_request_scope(request)[BODY_TIMED_OUT] = True  # the access log and metrics say 408 too
            # The handler awaiting the body sees a disconnect (connection_lost) and stops.
            transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self.mlxrt_head_timer.cancel()
            if self.mlxrt_body_timer is not None:
                self.mlxrt_body_timer.cancel()
            super().connection_lost(exc)

    return GuardedHTTPProtocol


def _make_room(connections: Any, newcomer: Any, max_connections: int) -> None:
    open_ = [c for c in connections if not uvicorn_transport(c).is_closing()]
    if len(open_) <= max_connections:
        return  # the excess is already closing
    others = [c for c in open_ if c is not newcomer]
    reclaimable = [c for c in others if _idle(c)] or [c for c in others if _receiving(c)]
    victim = min(reclaimable, key=lambda c: getattr(c, "mlxrt_opened", 0.0)) if reclaimable else newcomer
    uvicorn_transport(victim).close()
