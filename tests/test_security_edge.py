"""Issue 22, the HTTP edge: no drive-by from web pages (Host, Content-Type, browser refusal,
CORS off), resource limits (body cap, early length refusal, slow sockets), SIGTERM ends
streams with a final frame, plugins failing at start are skipped, odd JSON is a 400, and
prompt-cache files are private."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import MLXRT_BIN, anthropic_client, free_port, openai_client

from mlxrt import hookimpl

MSG = [{"role": "user", "content": "hi"}]
CHAT = {"messages": MSG, "max_tokens": 2}
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from mlxrt.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama", "llama")


@pytest.fixture(scope="module")
def app_client(llama):
    """One in-process app bound (nominally) to loopback, shared by the cheap checks."""
    from litestar.testing import TestClient

    from mlxrt.cli import build_server
    from mlxrt.host import make_host

    host = make_host()
    app = build_server(host, str(llama), {"host": "127.0.0.1", "port": 0, "model_fallback": True})
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client
    app.state.models.stop()


# -- item 2: drive-by from web pages -------------------------------------------------------------


def test_host_header_is_checked_against_the_bound_names(app_client, llama, mlxrt_serve):
    # DNS rebinding: the page's own name reaches 127.0.0.1; the Host header still names it.
    evil = app_client.get("/v1/models", headers={"host": "attacker.example"})
    assert evil.status_code == 421
    error = evil.json()["error"]
    assert error["code"] == "host_not_allowed" and "attacker.example" in error["message"]
    assert "--allowed-hosts" in error["message"]
    # Anthropic's route answers in Anthropic's shape.
    anth = app_client.post("/v1/messages", headers={"host": "attacker.example:8080", **JSON},
                           json={"model": "m", "max_tokens": 2, "messages": MSG})
    assert anth.status_code == 421 and anth.json()["type"] == "error"
    for name in ("localhost:8080", "127.0.0.1", "[::1]:8080", "LOCALHOST"):
        assert app_client.get("/v1/models", headers={"host": name}).status_code == 200, name
    assert app_client.get("/health").status_code == 200  # the server kept serving

    named = mlxrt_serve(llama, options={"allowed_hosts": ["api.example", "other.example"]})
    assert named.get("/v1/models", headers={"host": "api.example:443"}).status_code == 200
    assert named.get("/v1/models", headers={"host": "localhost"}).status_code == 421
    anyone = mlxrt_serve(llama, options={"allowed_hosts": ["*"]})
    assert anyone.get("/v1/models", headers={"host": "attacker.example"}).status_code == 200


def test_json_routes_require_a_json_content_type(app_client):
    body = json.dumps(CHAT)
    for given_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"content-type": given_type} if given_type else {}
        resp = app_client.post("/v1/chat/completions", content=body, headers=headers)
        assert resp.status_code == 415, given_type
        error = resp.json()["error"]
        assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]
    for ok in ("application/json", "application/json; charset=utf-8", "Application/JSON",
               "application/vnd.mlxrt+json"):
        assert app_client.post("/v1/chat/completions", content=body,
                               headers={"content-type": ok}).status_code == 200, ok
    # The official clients send what the check wants.
    assert openai_client(app_client).chat.completions.create(model="m", messages=MSG, max_tokens=2).choices
    assert anthropic_client(app_client).messages.create(model="m", messages=MSG, max_tokens=2).content is not None


def test_state_changing_routes_refuse_other_origins_without_a_key(app_client, llama, mlxrt_serve):
    mount = {"id": "x", "path": "/nonexistent"}
    refused = app_client.post("/v1/adapters", json=mount, headers={"origin": "http://evil.test"})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "cross_origin_refused"
    gone = app_client.delete("/v1/adapters/x", headers={"sec-fetch-site": "cross-site"})
    assert gone.status_code == 403
    assert app_client.delete("/v1/responses/resp_1", headers={"origin": "null"}).status_code == 403
    # The server's own pages (same origin), and clients that are not browsers, get through.
    own = app_client.post("/v1/adapters", json=mount, headers={"origin": "http://127.0.0.1"})
    assert own.status_code == 400  # past the edge: the handler's own answer
    assert app_client.post("/v1/adapters", json=mount).status_code == 400
    assert app_client.delete("/v1/adapters/x", headers={"sec-fetch-site": "same-origin"}).status_code == 404
    # Inference is not state-changing: CORS alone decides whether a page may read it.
    assert app_client.post("/v1/chat/completions", json=CHAT, headers={"origin": "http://evil.test"}).status_code == 200

    listed = mlxrt_serve(llama, options={"allowed_origins": "http://a.test"})
    assert listed.post("/v1/adapters", json=mount, headers={"origin": "http://a.test"}).status_code == 400
    assert listed.post("/v1/adapters", json=mount, headers={"origin": "http://b.test"}).status_code == 403
    star = mlxrt_serve(llama, options={"allowed_origins": "*"})  # * opens reading, not acting
    assert star.post("/v1/adapters", json=mount, headers={"origin": "http://b.test"}).status_code == 403
    keyed = mlxrt_serve(llama, options={"api_keys": ["k"]})  # a page cannot know the key
    resp = keyed.post("/v1/adapters", json=mount, headers={"origin": "http://b.test", "authorization": "Bearer k"})
    assert resp.status_code == 400


# -- item 5: resource exhaustion at the edge ---------------------------------------------------


def test_body_cap_and_early_length_refusal(app_client, monkeypatch):
    from mlxrt.serving import EngineModel  # where every dialect's chat is templated

    def never(*_args, **_kwargs):
        raise AssertionError("the over-long prompt was templated")

    monkeypatch.setattr(EngineModel, "render", never)
    ceiling = app_client.get("/stats").json()["engine"]["admission"]["context_ceiling"]
    long = {"messages": [{"role": "user", "content": "a " * (ceiling * 16 + 8)}], "max_tokens": 2}
    resp = app_client.post("/v1/chat/completions", json=long)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "context_length_exceeded" and "However, your messages resulted in at least" in error["message"]
    assert error["message"].startswith(f"This model's maximum context length is {ceiling} tokens.")
    # Above the default body cap (32 MiB): 413 before anything is parsed.
    huge = app_client.post("/v1/chat/completions", content=b"[" + b" " * (33 * 1024 * 1024) + b"]", headers=JSON)
    assert huge.status_code == 413
    monkeypatch.undo()
    assert app_client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_slow_header_sockets_do_not_starve_health(llama, server_process):
    """A slowloris from loopback: more sockets than --max-connections, each sending its
    headers a byte at a time; fresh clients are still served and the slow ones are reclaimed."""
    server = server_process([str(llama), "--max-connections", "40", "--header-timeout", "2",
                             "--allowed-hosts", "127.0.0.1,good.example", "--allowed-hosts", "other.example"])
    for name, status in (("good.example", 200), ("other.example:80", 200), ("localhost", 421)):
        assert httpx.get(f"{server.url}/v1/models", headers={"host": name}).status_code == status, name
    slow: list[socket.socket] = []
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    try:
        for _ in range(120):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=2)
            s.setblocking(False)
            slow.append(s)
        deadline = time.monotonic() + 4
        served, sent = 0, 0
        while time.monotonic() < deadline:
            for s in slow:  # one more byte on every socket still open
                try:
                    s.send(head[sent % len(head):sent % len(head) + 1])
                except OSError:
                    pass
            sent += 1
            resp = httpx.get(f"{server.url}/health", timeout=3)
            assert resp.status_code == 200 and resp.content == b'{"status": "ok"}'
            served += 1
            time.sleep(0.2)
        assert served >= 5
        # Past the header deadline every slow socket has been closed by the server.
        time.sleep(1)
        closed = 0
        for s in slow:
            s.setblocking(True)
            s.settimeout(0.5)
            try:
                closed += s.recv(1) == b""
            except (ConnectionResetError, BrokenPipeError):
                closed += 1
            except TimeoutError:
                pass
        assert closed == len(slow)
    finally:
        for s in slow:
            s.close()
    assert httpx.get(f"{server.url}/health", timeout=3).status_code == 200



def test_a_client_leaving_during_templating_queues_nothing(llama, monkeypatch):
    """The prompt is still being templated (slowly, here) when the client hangs up: the
    request ends there and never reaches the engine (before, it queued and generated)."""
    import asyncio

    import uvicorn

    from mlxrt.cli import build_server
    from mlxrt.host import make_host
    from mlxrt.serving import EngineModel  # where every dialect's chat is templated

    real, entered = EngineModel.render, threading.Event()

    def slow_render(*args):
        entered.set()
        time.sleep(1.5)
        return real(*args)

    monkeypatch.setattr(EngineModel, "render", slow_render)
    host = make_host()
    app = build_server(host, str(llama), {"host": "127.0.0.1", "port": 0, "model_fallback": True})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        body = json.dumps({"messages": MSG, "max_tokens": 50}).encode()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            assert entered.wait(10)
        time.sleep(3)  # the templating thread finishes meanwhile; its result must go nowhere
        stats = app.state.models.primary.engine.stats()
        assert stats["requests_served"] == 0 and stats["requests_cancelled"] == 0, stats
        ok = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT, timeout=30)
        assert ok.status_code == 200 and app.state.models.primary.engine.stats()["requests_served"] == 1
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        app.state.models.stop()

# -- item 6: SIGTERM --------------------------------------------------------------------------


def test_sigterm_ends_running_streams_with_a_final_frame_and_refuses_queued(llama, server_process):
    # Grace 0: the tiny model writes its whole context in about a second, so a stream must be
    # ended by the shutdown, not left to finish.
    server = server_process([str(llama), "--batch", "2", "--shutdown-grace", "0", "--model-fallback"])
    long = {"model": "m", "messages": [{"role": "user", "content": "Tell me a long story."}], "stream": True,
            "temperature": 0}  # greedy: this tiny checkpoint never picks its end token for this prompt
    frames: dict[str, list[str]] = {"openai": [], "anthropic": []}
    statuses: dict[str, int] = {}
    queued: dict[str, httpx.Response] = {}
    running = threading.Barrier(4, timeout=20)  # both streams, the waiting request, this thread

    def stream(kind: str, path: str, body: dict, headers: dict) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http, \
                http.stream("POST", path, json=body, headers=headers) as resp:
            statuses[kind] = resp.status_code
            lines = resp.iter_lines()
            for line in lines:
                frames[kind].append(line)
                if len(frames[kind]) > 6:
                    break
            running.wait()
            frames[kind].extend(lines)

    def waiting() -> None:
        running.wait()
        with httpx.Client(base_url=server.url, timeout=30) as http:
            queued["resp"] = http.post("/v1/chat/completions", json={**long, "stream": False})

    threads = [threading.Thread(target=stream, args=("openai", "/v1/chat/completions", long, {}), daemon=True),
               threading.Thread(target=stream, args=("anthropic", "/v1/messages", {**long, "max_tokens": 100000},
                                                     {"anthropic-version": "2023-06-01"}), daemon=True),
               threading.Thread(target=waiting, daemon=True)]
    for t in threads:
        t.start()
    running.wait()
    time.sleep(0.2)  # the third request waits for a row
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=30)
    server.proc.wait(timeout=30)
    log = server.stop()
    assert server.proc.returncode == 0, log
    assert statuses == {"openai": 200, "anthropic": 200}, log

    openai_data = [f.removeprefix("data: ") for f in frames["openai"] if f.startswith("data: ")]
    assert openai_data[-1] == "[DONE]", (openai_data[-3:], log)
    last = json.loads(openai_data[-2])
    assert last["error"]["code"] == "shutting_down" and last["error"]["type"] == "service_unavailable"
    anth = [f for f in frames["anthropic"] if f]
    assert anth[-2] == "event: error", (anth[-4:], log)
    assert "shutting down" in json.loads(anth[-1].removeprefix("data: "))["error"]["message"]
    resp = queued["resp"]
    assert resp.status_code == 503 and resp.headers["content-type"].startswith("application/json")
    assert resp.json()["error"]["code"] == "shutting_down"
    assert "Traceback" not in log


def test_sigterm_answers_queued_requests_at_once_in_the_serial_lane(llama, server_process):
    """The serial lane's worker is busy with the running request for up to the grace period;
    a request waiting behind it gets its 503 when the signal comes, not when that one ends."""
    server = server_process([str(llama), "--shutdown-grace", "30", "--model-fallback", "--batch", "1"])
    body = {"model": "m", "messages": [{"role": "user", "content": "Tell me a long story."}], "temperature": 0}
    ended: dict[str, float] = {}
    running = threading.Event()

    def stream() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http, \
                http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
            for line in resp.iter_lines():
                running.set()
                if line == "data: [DONE]":
                    ended["stream"] = time.monotonic()

    def queued() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            ended["status"] = http.post("/v1/chat/completions", json=body).status_code
            ended["queued"] = time.monotonic()

    first = threading.Thread(target=stream, daemon=True)
    first.start()
    assert running.wait(30)
    second = threading.Thread(target=queued, daemon=True)
    second.start()
    time.sleep(0.3)
    server.proc.send_signal(signal.SIGTERM)
    first.join(timeout=60)
    second.join(timeout=60)
    server.proc.wait(timeout=60)
    assert ended["status"] == 503
    # The running stream (about 8,000 tokens) was allowed to finish; the 503 came before it did.
    assert ended["queued"] < ended["stream"], ended

# -- item 7: plugins failing at start ---------------------------------------------------------


FAILING = Path(__file__).resolve().parent / "fixture-plugins" / "mlxrt-failing-start-example"


def test_plugins_failing_in_routes_or_startup_are_skipped(llama, mlxrt_serve):
    class BadRoutes:
        @hookimpl
        def mlxrt_routes(self, host):
            raise RuntimeError("no routes today")

    class BadStartup:
        @hookimpl
        def mlxrt_startup(self, host):
            async def later():
                raise RuntimeError("no start today")

            return later()

    client = mlxrt_serve(llama, plugins=[("badroutes", BadRoutes()), ("badstart", BadStartup())])
    failed = client.get("/stats").json()["plugins"]["failed"]
    assert "no routes today" in failed["badroutes"] and "mlxrt_routes" in failed["badroutes"]
    assert "no start today" in failed["badstart"] and "mlxrt_startup" in failed["badstart"]
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_an_installed_plugin_failing_at_start_is_reported_and_skipped(llama, tmp_path, server_process):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(FAILING)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([MLXRT_BIN, "plugins", "--json"], env=env, capture_output=True, text=True, check=True,
                         cwd="/")
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["badroutes"]["status"] == "failed" and "routes broken on purpose" in rows["badroutes"]["error"]

    server = server_process([str(llama)], env=env)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        failed = http.get("/stats").json()["plugins"]["failed"]
        assert set(failed) >= {"badroutes", "badstart"} and "startup broken on purpose" in failed["badstart"]
        late = http.get("/badstart")  # its route exists, but its plugin failed to start
        assert late.status_code == 503 and late.json()["error"]["code"] == "plugin_failed"
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    server.stop()

    strict = subprocess.run([MLXRT_BIN, "serve", str(llama), "--port", "1"], capture_output=True, text=True,
                            env={**env, "MLXRT_STRICT_PLUGINS": "1", "MLXRT_DISABLE_PLUGINS": "badroutes"},
                            timeout=120, cwd="/")
    assert strict.returncode != 0 and "startup broken on purpose" in strict.stdout + strict.stderr


# -- item 8: odd JSON --------------------------------------------------------------------------


def test_deep_nesting_and_lone_surrogates_are_400s(app_client):
    deep = b'{"messages": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    resp = app_client.post("/v1/chat/completions", content=deep, headers=JSON)
    assert resp.status_code == 400 and "nested too deeply" in resp.json()["error"]["message"]
    lone = '"hi \\ud800 there"'
    bodies = {"/v1/chat/completions": f'{{"messages": [{{"role": "user", "content": {lone}}}], "max_tokens": 2}}',
              "/v1/completions": f'{{"prompt": {lone}, "max_tokens": 2}}',
              "/v1/messages": f'{{"model": "m", "messages": [{{"role": "user", "content": {lone}}}], "max_tokens": 2}}',
              "/v1/responses": f'{{"input": {lone}, "max_output_tokens": 2}}'}
    for path, body in bodies.items():
        resp = app_client.post(path, content=body.encode(), headers=JSON)
        assert resp.status_code == 400, (path, resp.text[:200])
        assert "lone surrogate \\ud800" in resp.json()["error"]["message"], path
    # A surrogate pair spelled as escapes is a real character (an emoji), not an error.
    pair = b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 2}'
    assert app_client.post("/v1/chat/completions", content=pair, headers=JSON).status_code == 200


_odd_text = st.lists(st.one_of(st.characters(), st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\x00",
                                                                "\ufffe", "\U0010ffff"])),
                     max_size=8).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(depth=st.integers(min_value=1, max_value=3000), text=_odd_text,
       path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
                             "/v1/embeddings", "/v1/messages/count_tokens"]))
def test_fuzzed_nesting_and_unicode_only_get_4xx(app_client, depth, text, path):
    escaped = json.dumps(text)  # ensure_ascii: lone surrogates travel as \udxxx escapes
    nested = "[" * depth + escaped + "]" * depth
    for body in (f'{{"messages": [{{"role": "user", "content": {escaped}}}], "max_tokens": 1}}',
                 f'{{"messages": {nested}, "max_tokens": 1}}', f'{{"prompt": {nested}, "input": {escaped}}}'):
        resp = app_client.post(path, content=body.encode(), headers=JSON)
        assert resp.status_code < 500, (path, depth, text, resp.text[:300])
        assert isinstance(resp.json(), dict)


# -- item 9: private prompt-cache files --------------------------------------------------------


def test_prompt_cache_files_are_private(llama, mlxrt_serve, tmp_path):
    user_dir = tmp_path / "mine"
    user_dir.mkdir(mode=0o755)
    os.chmod(user_dir, 0o755)
    cache_dir = user_dir / "new" / "cache"
    client = mlxrt_serve(llama, options={"prompt_cache_dir": str(cache_dir)})
    body = {"messages": [{"role": "user", "content": "a private prompt " * 8}], "max_tokens": 2}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    deadline = time.monotonic() + 20
    while not list(cache_dir.glob("*/*.safetensors")) and time.monotonic() < deadline:
        time.sleep(0.1)
    files = list(cache_dir.glob("*/*.safetensors"))
    assert files
    mode = stat.S_IMODE
    for f in files:
        assert mode(f.stat().st_mode) == 0o600, f
    for folder in (files[0].parent, cache_dir, cache_dir.parent):
        assert mode(folder.stat().st_mode) == 0o700, folder
    assert mode(user_dir.stat().st_mode) == 0o755  # the user's own folder is left as it was


def test_existing_prompt_cache_folder_and_files_are_tightened(tmp_path):
    from mlxrt.cache.prompt_files import private_folder, write_safetensors

    root = tmp_path / "cache"
    ours = root / "fingerprint"
    ours.mkdir(parents=True, mode=0o755)
    os.chmod(ours, 0o755)
    assert stat.S_IMODE(private_folder(root, "fingerprint").stat().st_mode) == 0o700
    path = ours / "e.safetensors"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    write_safetensors(path, {"a": ("F32", (2,), bytes(8))}, {})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

