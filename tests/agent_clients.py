"""Real agent clients (Claude Code, Codex CLI) against a live server: pinned npm installs, a
scripted tiny checkpoint that calls the client's shell tool, and a recorder of every request.

Used by tests/test_agent_clients.py. Nothing here downloads a model; the npm packages come from
the npm registry into a cache folder reused across runs (``MLXRT_CLIENTS_CACHE``, default
``~/.cache/mlxrt-test-clients/<package>@<version>``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from support import free_port
from tokenizers import Tokenizer

from mlxrt import hookimpl

CACHE = Path(os.environ.get("MLXRT_CLIENTS_CACHE", Path.home() / ".cache" / "mlxrt-test-clients"))
#: Headers whose values are credentials: recorded as ``<scrubbed>``.
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "cookie", "proxy-authorization"})
#: What the command prints; written as ``$((6*7))`` in the command itself, so the text is in a
#: later prompt only if the tool really ran and its output came back.
RAN = "MLXRT-TOOL-42-RAN"


def npm_install(package: str, version: str, timeout: float = 600) -> Path | None:
    """The folder of ``package@version`` installed with npm under CACHE, installing it once.

    Returns ``None`` without node or npm, or when the install fails (no registry, say)."""
    if not (shutil.which("node") and shutil.which("npm")):
        return None
    root = CACHE / f"{package.replace('/', '+')}@{version}"
    done = root / ".installed"
    if not done.exists():
        root.mkdir(parents=True, exist_ok=True)
        try:
            out = subprocess.run(["npm", "install", "--prefix", str(root), "--no-audit", "--no-fund",
                                  "--loglevel=error", f"{package}@{version}"],
                                 capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode != 0:
            return None
        done.write_text(f"{package}@{version}\n")
    return root


def npm_bin(root: Path, name: str) -> Path | None:
    path = root / "node_modules" / ".bin" / name
    return path if path.exists() else None


class AgentScript:
    """A sampler that plays an agent: when the prompt offers one of ``calls``' tools, the first
    turn calls it with the command; once the command's output (RAN) is in the prompt, it answers
    ``done``; any other request (titles, side questions) gets ``other``.

    ``calls``: tool name → a function of the command giving the call's arguments. The call is
    written in the Qwen3 template's markup (``<tool_call>{json}</tool_call>``)."""

    def __init__(self, command: str, calls: dict, done: str = "All done.", other: str = "ok"):
        self.command, self.calls, self.done, self.other = command, calls, done, other
        self.decisions: list[str] = []

    def reply(self, prompt: str) -> str:
        if RAN in prompt:
            return self.done
        for name, arguments in self.calls.items():
            if f'"name": "{name}"' in prompt:
                call = json.dumps({"name": name, "arguments": arguments(self.command)})
                return f"<tool_call>\n{call}\n</tool_call>"
        return self.other

    @hookimpl
    def mlxrt_sampler(self, request, info):
        import mlx.core as mx

        tok = Tokenizer.from_file(str(info.path / "tokenizer.json"))
        prompt = tok.decode(list(request.prompt_ids), skip_special_tokens=False)
        reply = self.reply(prompt)
        self.decisions.append(reply)
        eos = json.loads((info.path / "generation_config.json").read_text())["eos_token_id"]
        ids = iter(tok.encode(reply, add_special_tokens=False).ids + [eos if isinstance(eos, int) else eos[0]])
        return lambda logprobs: mx.array([next(ids, 0)])


class NoNetwork:
    """A proxy that refuses everything and remembers what was asked of it: a client run with
    :meth:`env` reaches the loopback server directly and every other host through here, so
    ``asked`` lists the hosts it tried to phone (``CONNECT github.com:443 …``)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.asked: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def env(self) -> dict[str, str]:
        url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        return {name: url for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy",
                                       "all_proxy")} | {"NO_PROXY": "127.0.0.1,localhost",
                                                        "no_proxy": "127.0.0.1,localhost"}

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            with conn:
                try:
                    conn.settimeout(5)
                    self.asked.append(conn.recv(4096).decode("latin-1", "replace").split("\r\n", 1)[0])
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def scrub(body):
    """A request body with nothing that identifies the machine or user: ``metadata.user_id``."""
    if isinstance(body, dict) and isinstance(body.get("metadata"), dict) and "user_id" in body["metadata"]:
        body = {**body, "metadata": {**body["metadata"], "user_id": "<scrubbed>"}}
    return body


class Recorder:
    """ASGI middleware: keeps every HTTP request (method, path, headers, JSON body) with its
    response's status, ``x-mlxrt-*`` headers and, for a 4xx or 5xx, its body, in arrival order."""

    def __init__(self, app):
        self.app, self.exchanges = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()  # then wait for the disconnect like any app

        headers = {k.decode("latin-1").lower(): ("<scrubbed>" if k.decode("latin-1").lower() in SECRET_HEADERS
                                                 else v.decode("latin-1")) for k, v in scope["headers"]}
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        entry = {"method": scope["method"], "path": scope["path"], "headers": headers, "body": scrub(body)}
        self.exchanges.append(entry)

        async def record(message):
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
                entry["response_headers"] = {k.decode("latin-1").lower(): v.decode("latin-1")
                                             for k, v in message.get("headers", [])
                                             if k.decode("latin-1").lower().startswith("x-mlxrt")}
            elif message["type"] == "http.response.body" and entry.get("status", 200) >= 400:
                entry["error"] = entry.get("error", "") + message.get("body", b"").decode("utf-8", "replace")
            await send(message)

        return await self.app(scope, replay, record)


class AgentServer:
    """The app of a tiny checkpoint behind a Recorder, served by uvicorn on loopback in a thread;
    ``script`` is a plugin (an AgentScript) that decides what the model says."""

    def __init__(self, model: Path, script, options=None):
        import uvicorn

        from mlxrt.cli import build_server
        from mlxrt.host import make_host

        self.host = make_host(extra=[("agent-script", script)])
        # Default flags: the clients send their own model names (claude-…, gpt-…), which a
        # loopback server answers with the served model (docs/dialects.md, model names).
        app = build_server(self.host, str(model), {"host": "127.0.0.1", "port": 0, **(options or {})})
        self.recorder = Recorder(app)
        self.models = app.state.models  # the app's model pool (mlxrt.model_pool.ModelPool)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(self.recorder, host="127.0.0.1", port=port,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.stop()
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)

    def generations(self, path: str) -> list[dict]:
        return [e for e in self.recorder.exchanges if e["path"] == path and e["method"] == "POST"]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.models.stop()


def write_fixtures(folder: Path, exchanges: list[dict]) -> None:
    """Keep a run's POST bodies as replay fixtures: ``NN.json`` with method, path, headers, body."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    posts = [e for e in exchanges if e["method"] == "POST"]
    for i, e in enumerate(posts):
        keep = {k: e[k] for k in ("method", "path", "headers", "body", "status")}
        (folder / f"{i:02d}.json").write_text(json.dumps(keep, indent=1, ensure_ascii=False) + "\n")
