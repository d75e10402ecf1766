"""Talking to a running ``mlxrt serve`` from the terminal verbs (``run``, ``ps``, ``stop``):
its Ollama API (plugins/ollama) over plain HTTP, and a server of one's own when none answers.

Standard library only (``urllib``): a verb that only talks to a server imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

__all__ = ["DEFAULT_URL", "Remote", "RemoteError", "OwnServer", "url_option_help"]

#: Where ``mlxrt serve`` listens by default (its ``--host``/``--port``).
DEFAULT_URL = "http://127.0.0.1:8080"
url_option_help = "The running server's address (env MLXRT_URL)."


class RemoteError(Exception):
    """The server refused (its ``{"error"}`` message and status), or could not be reached (status 0)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.message, self.status = message, status


class Remote:
    """A server's Ollama API at ``url``."""

    def __init__(self, url: str, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key

    def _request(self, method: str, path: str, body: Any = None, timeout: float | None = 600) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("content-type", "application/json")
        if self.api_key:
            request.add_header("authorization", f"Bearer {self.api_key}")
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            raw = exc.read().decode("utf-8", "replace")
            try:
                message = json.loads(raw)["error"]
                message = message if isinstance(message, str) else message.get("message", raw)
            except (ValueError, KeyError, TypeError, AttributeError):
                message = raw or exc.reason
            raise RemoteError(str(message), exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RemoteError(f"cannot reach mlxrt at {self.url} ({reason})") from None

    def alive(self, timeout: float = 1.0) -> bool:
        """Whether a server answers here (one that wants another API key answers too: the
        request that follows says so)."""
        try:
            with self._request("GET", "/api/version", timeout=timeout) as resp:
                return resp.status == 200
        except RemoteError as exc:
            return exc.status in (401, 403)

    def get(self, path: str) -> Any:
        with self._request("GET", path) as resp:
            return json.loads(resp.read() or b"null")

    def post(self, path: str, body: Any) -> Any:
        with self._request("POST", path, body) as resp:
            return json.loads(resp.read() or b"null")

    def stream(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        """The NDJSON objects of a streamed answer; closing the iterator (or an exception in
        the consumer, Ctrl-C included) closes the connection, which cancels the generation."""
        resp = self._request("POST", path, body, timeout=None)
        try:
            for line in resp:
                if not line.strip():
                    continue
                item = json.loads(line)
                if isinstance(item, dict) and "error" in item:
                    raise RemoteError(str(item["error"]), resp.status)
                yield item
        finally:
            resp.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OwnServer:
    """``mlxrt serve MODEL`` on a free loopback port, for as long as the verb runs."""

    def __init__(self, model: str | None, timeout: float = 600) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()
        command = [sys.executable, "-m", "mlxrt.cli", "serve", *([model] if model else []), "--port", str(port),
                   "--log-level", "WARNING"]
        # Its own session: a Ctrl-C typed to stop an answer is the chat's, not the server's.
        self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={**os.environ})
        remote = Remote(self.url)
        deadline = time.monotonic() + timeout
        while not remote.alive(timeout=1.0):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                output = self._output()
                self.stop()
                raise RemoteError(f"mlxrt serve {model or ''} did not start:\n{output}".rstrip())
            time.sleep(0.2)

    def _output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
