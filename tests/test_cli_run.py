"""``mlxrt run``, ``mlxrt ps`` and ``mlxrt stop`` as a person uses them: the chat in a pseudo
terminal (type a question, read the streamed answer, Ctrl-C a long answer, slash commands,
``/bye``), one-shot answers through a pipe, and the resident models of a live server of a tiny
Qwen3 checkpoint scripted by :class:`Script`."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import subprocess
import termios
import time

import pytest
from agent_clients import AgentScript, AgentServer
from support import MLXRT_BIN, free_port

from mlxrt import hookimpl

LONG = "word " * 3000


class Script(AgentScript):
    """"long" questions get a slow, endless answer (for Ctrl-C); "Think first" a reasoned one."""

    def reply(self, prompt: str) -> str:
        question = prompt.rsplit("<|im_start|>user", 1)[-1]
        if "long" in question:
            return LONG
        if "Think first" in question:
            return "<think>pondering</think>42"
        return "Hello from mlxrt."

    @hookimpl
    def mlxrt_sampler(self, request, info):
        sample = AgentScript.mlxrt_sampler(self, request, info)
        if self.decisions[-1] != LONG:
            return sample

        def slow(logprobs):
            time.sleep(0.02)  # a long answer takes a minute: time to press Ctrl-C
            return sample(logprobs)

        return slow


@pytest.fixture(scope="module")
def server(mlxrt_tiny_checkpoint):
    live = AgentServer(mlxrt_tiny_checkpoint("qwen3"), Script("", {}))
    yield live
    live.stop()


class Terminal:
    """A command in a pseudo terminal it controls (so Ctrl-C is a SIGINT from the terminal)."""

    def __init__(self, args: list[str]) -> None:
        self.master, slave = pty.openpty()

        def controlling_terminal() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            # as a shell in a terminal starts it: a test run in the background of a non-interactive
            # shell (`nohup ... &`) has SIGINT ignored, which a child inherits, and Ctrl-C did nothing
            signal.signal(signal.SIGINT, signal.SIG_DFL)

        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                                     preexec_fn=controlling_terminal, env={**os.environ, "TERM": "dumb"})
        os.close(slave)
        self.seen = ""

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def expect(self, text: str, timeout: float = 60) -> str:
        """Read until ``text`` has appeared since the last expect; returns what was read."""
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.master], [], [], left)[0]:
                raise AssertionError(f"{text!r} did not appear; the terminal shows:\n{self.seen[-2000:]}")
            try:
                self.seen += os.read(self.master, 65536).decode("utf-8", "replace")
            except OSError:  # the command exited
                raise AssertionError(f"{text!r} did not appear before exit:\n{self.seen[-2000:]}") from None
        shown, self.seen = self.seen, self.seen[self.seen.index(text) + len(text):]
        return shown

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self.master)


def chats(server) -> list[dict]:
    return [e["body"] for e in server.generations("/api/chat")]


def test_chat_in_a_terminal(server):
    term = Terminal([MLXRT_BIN, "run", "--url", server.url, "qwen3-0-gen"])
    try:
        term.expect(">>> ")
        term.type("hi\r")
        assert "Hello from mlxrt." in term.expect(">>> ")
        term.type("Think first: 6*7?\r")
        shown = term.expect(">>> ")
        assert shown.index("Thinking...") < shown.index("pondering") < shown.index("...done thinking.") \
            < shown.index("42")
        term.type("tell me something long\r")
        term.expect("word word word")
        term.type("\x03")  # Ctrl-C: the answer stops, the chat goes on
        term.expect(">>> ", timeout=20)
        deadline = time.monotonic() + 20
        while server.models.primary.engine.stats()["requests_cancelled"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.models.primary.engine.stats()["requests_cancelled"] >= 1  # the server stopped generating too
        term.type('"""line one\r')
        term.type('line two"""\r')
        term.expect("Hello from mlxrt.")
        term.expect(">>> ")
        last = chats(server)[-1]["messages"]
        assert last[-1] == {"role": "user", "content": "line one\nline two"}
        assert [m["content"] for m in last if m["role"] == "user"] == ["hi", "Think first: 6*7?", "line one\nline two"]
        term.type("/set parameter temperature 0.5\r")
        term.expect("Set parameter 'temperature' to '0.5'")
        term.expect(">>> ")
        term.type("/show info\r")
        assert "qwen3" in term.expect("Capabilities")
        term.expect(">>> ")
        term.type("/clear\r")
        term.expect("Cleared session context")
        term.expect(">>> ")
        term.type("hi again\r")
        term.expect("Hello from mlxrt.")
        term.expect(">>> ")
        body = chats(server)[-1]
        assert body["options"] == {"temperature": 0.5} and len(body["messages"]) == 1
        term.type("/load qwen3-0-gen:latest\r")
        term.expect("Loading model 'qwen3-0-gen:latest'")
        term.expect(">>> ")
        assert chats(server)[-1] == {"model": "qwen3-0-gen:latest", "messages": []}  # loads it, no answer
        term.type("\x03")  # Ctrl-C at the prompt does not leave
        term.expect("Use Ctrl + d or /bye to exit.")
        term.type("/bye\r")
        assert term.proc.wait(timeout=20) == 0
    finally:
        term.close()


def test_one_shot_is_pipe_friendly(server):
    out = subprocess.run([MLXRT_BIN, "run", "--url", server.url, "qwen3-0-gen", "Think", "first"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "42\n" and "pondering" in out.stderr
    piped = subprocess.run([MLXRT_BIN, "run", "--url", server.url, "qwen3-0-gen"], input="hi\n",
                           capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and piped.stdout == "Hello from mlxrt.\n"


def test_ps_and_stop(server):
    subprocess.run([MLXRT_BIN, "run", "--url", server.url, "qwen3-0-gen", "hi"], capture_output=True, timeout=60)
    ps = subprocess.run([MLXRT_BIN, "ps", "--url", server.url], capture_output=True, text=True, timeout=30)
    header, row = ps.stdout.splitlines()
    assert header.split() == ["NAME", "SIZE", "LANE", "IN", "USE", "UNTIL"]
    assert row.startswith("qwen3-0-gen:latest") and ("batch" in row or "serial" in row) and row.endswith("Forever")
    stop = subprocess.run([MLXRT_BIN, "stop", "qwen3-0-gen", "--url", server.url], capture_output=True, text=True,
                          timeout=30)
    assert stop.returncode == 0 and stop.stdout == "stopped qwen3-0-gen:latest\n"
    ps = subprocess.run([MLXRT_BIN, "ps", "--url", server.url], capture_output=True, text=True, timeout=30)
    assert ps.stdout.splitlines()[1:] == []
    again = subprocess.run([MLXRT_BIN, "stop", "qwen3-0-gen", "--url", server.url], capture_output=True,
                           text=True, timeout=30)
    assert again.returncode == 1 and "is not loaded" in again.stderr
    # the next request loads it again
    out = subprocess.run([MLXRT_BIN, "run", "--url", server.url, "qwen3-0-gen", "hi"], capture_output=True,
                         text=True, timeout=120)
    assert out.stdout == "Hello from mlxrt.\n"


def test_run_starts_a_server_of_its_own(tmp_path):
    from mlxrt.testing import write_tiny_checkpoint

    # A 64-token context: the random model's answer ends there at the latest.
    model = write_tiny_checkpoint(tmp_path / "small", "qwen3", config_overrides={"max_position_embeddings": 64})
    nobody = f"http://127.0.0.1:{free_port()}"
    out = subprocess.run([MLXRT_BIN, "run", "--url", nobody, str(model), "hi"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"no mlxrt server at {nobody}: starting one" in out.stderr and out.stdout.endswith("\n")


def test_a_keyed_server_counts_as_running():
    """A server that wants a key is still the one to talk to (its 401 says what to send)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from mlxrt.cli.remote import Remote, RemoteError

    class Keyed(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(401)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": "missing API key"}')

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Keyed)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        remote = Remote(f"http://127.0.0.1:{httpd.server_port}")
        assert remote.alive()
        with pytest.raises(RemoteError, match="missing API key") as refused:
            remote.get("/api/ps")
        assert refused.value.status == 401
    finally:
        httpd.shutdown()
    assert not Remote(f"http://127.0.0.1:{free_port()}").alive()
