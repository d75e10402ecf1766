"""Helpers shared by tests: SDK clients over the in-process app, real server processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

#: The installed console script, beside the running interpreter.
MLXRT_BIN = str(Path(sys.executable).with_name("mlxrt"))


def openai_client(http_client):
    import openai

    return openai.OpenAI(base_url=f"{http_client.base_url}/v1", api_key="unused", http_client=http_client,
                         max_retries=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A real ``mlxrt serve`` on 127.0.0.1, stopped at teardown."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, timeout: float = 120):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [MLXRT_BIN, "serve", *args, "--port", str(self.port)],
            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd="/",
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlxrt serve exited {self.proc.returncode}:\n{self.proc.stdout.read()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"mlxrt serve did not become healthy in {timeout}s")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.stdout.read() if self.proc.stdout else ""


