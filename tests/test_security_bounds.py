"""Issue 31, the edge: what one API key leaves in the server is invisible to another (the prompt
cache, in memory and on disk), and every route bounds its work before it spends it (text length,
body read time, image pixels across requests, template rendering time, config sizes), so the
server keeps answering ``/health`` and new clients while one client misbehaves."""

from __future__ import annotations

import openai
import pytest

SYSTEM = ("Confidential board memo. The merger with Zebrafalcon Corp closes on March 3rd at a price "
          "of 412 million; nobody outside the board may learn the price or the date. " * 3)


def _client(http, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{http.base_url}/v1", api_key=key, http_client=http, max_retries=0)


def _ask(client: openai.OpenAI, system: str, question: str = "When?"):
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=2, temperature=0)
    done = raw.parse()
    return done.usage.prompt_tokens_details.cached_tokens, raw.headers["x-mlxrt-cache"], done


# -- finding 1: the prompt cache is partitioned by caller --------------------------------------


@pytest.mark.parametrize("on_disk", [False, True], ids=["memory", "disk"])
def test_one_key_never_reuses_or_sees_another_keys_prompt(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path, on_disk):
    guessers = ["key-two", "key-three", "key-four"]
    options = {"api_keys": ["key-one", *guessers, "key-five"]}
    if on_disk:
        options["prompt_cache_dir"] = str(tmp_path / "pc")
    server = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options=options)
    one = _client(server, "key-one")
    _ask(one, SYSTEM)
    cached, _header, _ = _ask(one, SYSTEM, "Where?")
    assert cached > 40  # the cache works for its owner...
    wrong = SYSTEM.replace("412", "413")
    # ...and tells another key nothing (each guess from a fresh key, whose own cache is empty):
    # no reuse, and a header that does not say how far the guess matched.
    for key, guess in zip(guessers, (SYSTEM, wrong, SYSTEM.replace("Zebrafalcon", "Quokka")), strict=True):
        cached, header, _ = _ask(_client(server, key), guess)
        assert cached == 0, key
        assert header.startswith("miss") and "diverged" not in header and "no cached prompt" in header, header
    # A guesser's own repeat is cached, for that key.
    assert _ask(_client(server, "key-three"), wrong)[0] > 40
    if on_disk:
        # After a restart the files keep their partition: key two still gets nothing of key one's.
        server.app.state.models.stop()
        again = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options=options)
        assert _ask(_client(again, "key-five"), SYSTEM, "Where?")[0] == 0
        assert _ask(_client(again, "key-one"), SYSTEM, "Why?")[0] > 40


def test_without_keys_every_client_shares_one_partition(mlxrt_tiny_checkpoint, mlxrt_serve):
    server = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"))
    _ask(_client(server, "a"), SYSTEM)
    assert _ask(_client(server, "b"), SYSTEM, "Where?")[0] > 40  # any bearer text: the same caller


# -- finding 2: count_tokens and embeddings refuse over-long text before tokenizing ------------


def test_count_tokens_refuses_over_long_text_before_templating(mlxrt_tiny_checkpoint, mlxrt_serve, monkeypatch):
    import time

    from mlxrt.serving import EngineModel

    server = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"))
    ceiling = server.get("/stats").json()["engine"]["admission"]["context_ceiling"]

    def never(*_args, **_kwargs):
        raise AssertionError("the over-long prompt was templated")

    monkeypatch.setattr(EngineModel, "render", never)  # where count_tokens templates
    body = {"model": "m", "messages": [{"role": "user", "content": "a " * (ceiling * 16 + 8)}]}
    started = time.monotonic()
    resp = server.post("/v1/messages/count_tokens", json=body)
    assert time.monotonic() - started < 5
    assert resp.status_code == 400 and resp.json()["type"] == "error"
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == f"prompt is too long: {ceiling + 1} tokens > {ceiling} maximum"  # Anthropic's words
    monkeypatch.undo()
    short = server.post("/v1/messages/count_tokens", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert short.status_code == 200 and short.json()["input_tokens"] > 0
    assert server.get("/health").status_code == 200


def test_embeddings_refuse_over_long_inputs_before_tokenizing(mlxrt_tiny_checkpoint, mlxrt_serve, monkeypatch):
    import time

    import mlxrt.plugins.openai.embeddings as embeddings

    server = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3_embedding"))
    context = server.get("/stats").json()["engine"]["admission"]["context_ceiling"]  # the window, no budget

    def never(*_args, **_kwargs):
        raise AssertionError("the over-long input was tokenized")

    monkeypatch.setattr(embeddings, "encode_inputs", never)
    for payload in ("a " * (context * 16 + 8), ["short", "a " * (context * 16 + 8)]):
        started = time.monotonic()
        resp = server.post("/v1/embeddings", json={"model": "m", "input": payload})
        assert time.monotonic() - started < 5
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "context_length_exceeded" and "However, your messages resulted in at least" in error["message"]
    monkeypatch.undo()
    ok = server.post("/v1/embeddings", json={"model": "m", "input": ["short", "texts"]})
    assert ok.status_code == 200 and len(ok.json()["data"]) == 2


# -- finding 10 (second half): deep nesting in an ignored field of /v1/embeddings ---------------


@pytest.mark.parametrize("model", ["qwen3_embedding", "qwen3"])
def test_deeply_nested_ignored_field_of_embeddings_is_a_400(mlxrt_tiny_checkpoint, mlxrt_serve, model):
    server = mlxrt_serve(mlxrt_tiny_checkpoint(model))
    deep = b'{"model": "m", "input": "hi", "extra": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    resp = server.post("/v1/embeddings", content=deep, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert "error" in resp.json()
    assert server.get("/health").status_code == 200


# -- finding 3: stalled request bodies -----------------------------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from mlxrt.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "llama", "llama")


def _stalled(port: int, n: int) -> list:
    """``n`` connections that send a complete POST head and 10 of the 200 body bytes promised."""
    import socket

    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: 200\r\n\r\n" + b'{"messages"')
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(head)
        out.append(s)
    return out


def _answer(s) -> bytes | None:
    """What the server sent before closing ``s`` (``b""``: closed silently), or None: still open."""
    s.settimeout(0.5)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except TimeoutError:
        return None
    except (ConnectionResetError, BrokenPipeError):
        pass
    return got


def test_stalled_bodies_neither_lock_out_clients_nor_stay_open(llama, server_process):
    import json
    import time

    import httpx

    server = server_process([str(llama), "--max-connections", "24", "--body-timeout", "3"])
    stalled = _stalled(server.port, 40)  # past the cap: newcomers reclaim the oldest stalled ones
    try:
        started = time.monotonic()
        served = 0
        while time.monotonic() - started < 2.5:  # before the deadline, with the stalled sockets held
            assert httpx.get(f"{server.url}/health", timeout=3).status_code == 200
            chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=30,
                              json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert chat.status_code == 200
            served += 1
        assert served >= 2
        time.sleep(max(0.0, started + 4.5 - time.monotonic()))  # past --body-timeout
        answers = [_answer(s) for s in stalled]
        assert all(a is not None for a in answers), "a stalled connection is still open past --body-timeout"
        timed_out = [a for a in answers if a]
        assert timed_out, "no stalled connection got its 408"
        for got in timed_out:
            head, _, body = got.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 "), head
            error = json.loads(body)["error"]
            assert error["code"] == "body_timeout" and "--body-timeout" in error["message"]
        # The access log and metrics count them as the 408s they were, not as the app's failure.
        metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
        assert 'route="/v1/chat/completions",status="408"' in metrics and 'status="500"' not in metrics
    finally:
        for s in stalled:
            s.close()
    # A slow but complete body within the deadline is served.
    import socket

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                  b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body[:5])
        time.sleep(1)
        s.sendall(body[5:])
        assert _answer_blocking(s).startswith(b"HTTP/1.1 200 ")
    assert httpx.get(f"{server.url}/health", timeout=3).status_code == 200


def _answer_blocking(s) -> bytes:
    got = b""
    while chunk := s.recv(4096):
        got += chunk
    return got


# -- finding 9: log injection --------------------------------------------------------------------


def test_control_characters_in_request_text_cannot_forge_log_lines(llama, server_process):
    import httpx

    server = server_process([str(llama)])
    forged = "/x%0aINFO%20mlxrt.access%20[req-1]:%20GET%20/forged%20200%201.0%20ms%0d%1b[31mred%1b[0m%7f"
    assert httpx.get(server.url + forged, timeout=5).status_code == 404
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
    log = server.stop()
    assert "\x1b" not in log and "\r" not in log and "\x7f" not in log
    lines = log.splitlines()
    assert not any("GET /forged" in line and "/x" not in line for line in lines), log
    (line,) = [line for line in lines if "/forged" in line]
    assert line.startswith("INFO mlxrt.access [req-") and "\\x0aINFO mlxrt.access" in line and "\\x1b[31m" in line


# -- finding 8: chat templates get a rendering time limit ----------------------------------------

SPIN = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ messages[0].content }}"
HI = [{"role": "user", "content": "hi"}]


def test_a_template_that_spins_is_aborted_with_a_400(llama, mlxrt_serve, monkeypatch):
    import time

    import mlxrt.text.chat_template as chat_template

    monkeypatch.setattr(chat_template, "RENDER_TIME_LIMIT", 1.0)
    server = mlxrt_serve(llama, options={"chat_template": SPIN})
    started = time.monotonic()
    resp = server.post("/v1/chat/completions", json={"model": "m", "messages": HI, "max_tokens": 2})
    took = time.monotonic() - started
    # The handler waits for the rendering thread: its 400 means the thread stopped rendering.
    assert resp.status_code == 400 and 0.9 < took < 10, (resp.status_code, took)
    error = resp.json()["error"]
    assert error["message"].startswith("prompt build failed:") and "took longer than 1 s" in error["message"]
    assert server.get("/health").status_code == 200


def test_sigterm_is_prompt_while_a_template_spins_for_a_client_that_left(llama, server_process):
    import signal
    import time

    import httpx

    server = server_process([str(llama), "--chat-template", SPIN, "--shutdown-grace", "1"])
    with pytest.raises(httpx.TimeoutException):  # the client gives up while the template spins
        httpx.post(f"{server.url}/v1/chat/completions", json={"model": "m", "messages": HI, "max_tokens": 2},
                   timeout=1)
    assert httpx.get(f"{server.url}/health", timeout=3).status_code == 200
    server.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    server.proc.wait(timeout=15)  # the rendering stops at its limit (5 s) at the latest
    assert time.monotonic() - started < 12
    assert server.proc.returncode == 0



# -- finding 7: a global bound on decoded image pixels -------------------------------------------


def _png_url(width: int, height: int) -> str:
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_decoded_pixels_are_bounded_across_concurrent_requests(mlxrt_serve, tmp_path, monkeypatch):
    import threading
    import time

    import mlxrt.loading.images as images
    from mlxrt.families.gemma4.splice import Gemma4Vision
    from mlxrt.testing import write_tiny_checkpoint

    # Room for one 96x64 image (6,144 pixels) at a time, across all requests.
    server = mlxrt_serve(write_tiny_checkpoint(tmp_path / "gemma4", "gemma4"),
                       options={"max_image_pixels": 10_000, "max_image_pixels_in_flight": 10_000})
    monkeypatch.setattr(images, "PIXEL_WAIT_S", 0.5)
    towering = threading.Event()
    splice = Gemma4Vision.splice

    def slow_splice(self, ids, pictures):
        towering.set()
        time.sleep(3)  # the first request holds its decoded pixels a while
        return splice(self, ids, pictures)

    monkeypatch.setattr(Gemma4Vision, "splice", slow_splice)
    chat = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": _png_url(96, 64)}}]}]}
    first: list = []
    holder = threading.Thread(target=lambda: first.append(server.post("/v1/chat/completions", json=chat)))
    holder.start()
    assert towering.wait(30)
    started = time.monotonic()
    busy = server.post("/v1/chat/completions", json=chat)
    assert time.monotonic() - started < 2.5  # waited briefly (0.5 s here), then refused
    assert busy.status_code == 429, busy.text
    assert busy.json()["error"]["code"] == "images_busy" and "--max-image-pixels-in-flight" in busy.text
    assert busy.headers["retry-after"]
    # Text requests and /health are not held up by the image budget.
    assert server.get("/health").status_code == 200
    text = server.post("/v1/chat/completions", json={"model": "m", "max_tokens": 2,
                                                     "messages": [{"role": "user", "content": "hi"}]})
    assert text.status_code == 200
    holder.join(60)
    assert first[0].status_code == 200
    monkeypatch.setattr(Gemma4Vision, "splice", splice)
    # The first request gave its pixels back: the next image request fits again.
    assert server.post("/v1/chat/completions", json=chat).status_code == 200


# -- finding 19: a config that declares more layers than its weights hold -----------------------


def _rss() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_huge_config_is_refused_before_the_model_is_built(llama, mlxrt_serve, tmp_path):
    import json
    import shutil
    import time

    huge = tmp_path / "huge"
    shutil.copytree(llama, huge)
    config = json.loads((huge / "config.json").read_text())
    (huge / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10_000}))
    server = mlxrt_serve(llama, options={"model_fallback": False, "strict_model": False})  # loopback: paths load
    client = _client(server, "unused")
    assert client.chat.completions.create(model=str(llama), messages=HI, max_tokens=1).choices  # warm
    before = _rss()
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model=str(huge), messages=HI, max_tokens=1)
    took = time.monotonic() - started
    assert refused.value.status_code == 503 and refused.value.body["code"] == "model_load_failed"
    message = refused.value.body["message"]
    assert "declares 10000 layers but the weights hold at most 2" in message
    assert "resident: llama" in message  # refused before the served model was evicted for it
    # Before: 4.3 s (19 s on a busy 2-core machine) and ~0.8-1 GB kept after the refusal.
    assert took < 3 and _rss() - before < 100 * 2**20, (took, _rss() - before)
    assert client.chat.completions.create(model=str(llama), messages=HI, max_tokens=1).choices


# -- found by schemathesis (finding 18) ------------------------------------------------------


def test_what_schemathesis_found_is_a_400_or_escaped(llama, mlxrt_serve):
    server = mlxrt_serve(llama)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):  # an unhashable role was a 500
        resp = server.post(path, json={"model": "m", "max_tokens": 2, "messages": [{"role": {}, "content": "x"}]})
        assert resp.status_code == 400 and "role" in resp.json()["error"]["message"], resp.text
    # Ignored field names beyond Latin-1 (or with controls) made the x-mlxrt-ignored header a 500.
    body = {"model": "m", "max_tokens": 2, "messages": HI, "caf\u00e9\U0001f600": 1, "a\r\nx-evil: 1": 2,
            **{f"f{i}": i for i in range(40)}}
    resp = server.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    header = resp.headers["x-mlxrt-ignored"]
    assert "caf\\xe9\\U0001f600" in header and "a\\r\\nx-evil: 1" in header
    assert "x-evil" not in resp.headers and header.endswith("more)")


def test_null_for_a_nullable_field_means_its_default(llama, mlxrt_serve):
    # ``--checks all`` (positive_data_acceptance): OpenAI's spec, and mlxrt's own schema, let
    # stream, store and parallel_tool_calls be null; a null was a 400 ("expected bool @ $.stream").
    server = mlxrt_serve(llama)
    client = _client(server, "unused")
    chat = client.chat.completions.create(model="m", messages=HI, max_tokens=2, stream=None, n=None)
    assert chat.choices[0].message.content is not None
    text = client.completions.create(model="m", prompt="hi", max_tokens=2, stream=None)
    assert text.choices[0].finish_reason in ("stop", "length")
    answer = client.responses.create(model="m", input="hi", max_output_tokens=16, stream=None, store=None,
                                     parallel_tool_calls=None)
    assert answer.status in ("completed", "incomplete")
    from support import anthropic_client

    assert anthropic_client(server).messages.create(model="m", max_tokens=2, messages=HI, stream=None).content is not None


def test_what_schemathesis_all_checks_found_invalid_is_a_400(llama, mlxrt_serve):
    # ``--checks all`` (negative_data_rejection): these were 200s that ignored the bad field.
    server = mlxrt_serve(llama)
    with pytest.raises(openai.BadRequestError, match="echo must be of type bool"):
        _client(server, "unused").completions.create(model="m", prompt="hi", max_tokens=2, extra_body={"echo": 0})
    # Ollama's load-only bodies (no messages / prompt) and the empty-prompt embedding were
    # answered without checking the rest of the body.
    bad = {"/api/chat": {"model": "m", "messages": [], "options": {"top_k": {}}},
           "/api/generate": {"model": "m", "options": {"top_p": 2}},
           "/api/embeddings": {"model": {}, "prompt": ""}}
    for path, body in bad.items():
        resp = server.post(path, json=body)
        assert resp.status_code == 400 and resp.json()["error"], (path, resp.text)
    resp = server.post("/api/chat", json={"model": "m", "messages": [], "tools": [{"type": "function", "function": 3}]})
    assert resp.status_code == 400 and "tools" in resp.json()["error"], resp.text
    resp = server.post("/api/embeddings", json={"model": "m", "prompt": "", "keep_alive": ""})
    assert resp.status_code == 400 and "keep_alive" in resp.json()["error"], resp.text
    # ...while the well-formed ones still load, and still answer an empty prompt.
    assert server.post("/api/chat", json={"model": "m", "messages": []}).json()["done_reason"] == "load"
    assert server.post("/api/embeddings", json={"model": "m", "prompt": ""}).json() == {"embedding": []}


# -- finding 18: the OpenAPI schema describes the bodies; schemathesis finds no 5xx -------------


def test_openapi_declares_request_and_error_bodies(llama, mlxrt_serve):
    from openapi_spec_validator import validate

    server = mlxrt_serve(llama)
    schema = server.get("/schema/openapi.json").json()
    validate(schema)
    posts = {path: item["post"] for path, item in schema["paths"].items() if "post" in item}
    assert {"/v1/chat/completions", "/v1/messages", "/v1/embeddings", "/v1/responses"} <= set(posts)
    for path, op in posts.items():
        body = op["requestBody"]["content"]["application/json"]["schema"]
        assert body["type"] == "object", path
    assert posts["/v1/chat/completions"]["requestBody"]["content"]["application/json"]["schema"]["required"] == \
        ["messages"]
    # The declared error body is the one the server sends, in both dialects.
    from jsonschema import validate as conforms

    for path, bad in (("/v1/chat/completions", {"messages": "no"}), ("/v1/messages", {"model": "m"})):
        resp = server.post(path, json=bad)
        assert resp.status_code == 400
        for code in ("4XX", "5XX"):
            conforms(resp.json(), posts[path]["responses"][code]["content"]["application/json"]["schema"])
        assert not {"400", "500"} & set(posts[path]["responses"])  # not Litestar's own error shape


def test_kept_alive_answers_are_not_held_for_the_clients_delayed_ack(llama, server_process):
    """The listening socket says it is TCP, so asyncio sets TCP_NODELAY on each connection: a
    response's body, written after its head, leaves at once instead of waiting (Nagle) for the
    ACK the client delays ~40 ms. Every kept-alive request (the SDKs keep connections) took
    >= 44 ms, a 1-token chat completion 48-56 ms instead of ~5 ms; fuzzing took 230 s, not 22."""
    import time

    server = server_process([str(llama), "--log-level", "WARNING"])
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)

    def fastest(call) -> float:
        call()  # the connection opens (and the first answer is never held)
        took = []
        for _ in range(6):
            started = time.perf_counter()
            call()
            took.append(time.perf_counter() - started)
        return min(took)  # the least loaded try: load adds, the stall is a floor of 40 ms

    listing = fastest(client.models.list)
    chat = fastest(lambda: client.chat.completions.create(model="m", messages=HI, max_tokens=1))
    assert listing < 0.025 and chat < 0.03, (listing, chat)


def test_schemathesis_finds_no_server_error_in_the_post_bodies(tmp_path, server_process):
    """Schema-driven fuzzing of every POST body (24 operations, loopback, ~5,000 requests, ~4,500
    of them the coverage phase's: ~20 s on a busy 2-core machine): no 5xx, no response slower
    than 10 s, every body as the schema says; the server still answers. It found a dict
    ``role`` in count_tokens (the coverage phase sends each message field of each wrong type:
    role as a dict, list, int and bool on every chat-shaped route) and non-Latin-1 ignored field
    names in ``x-mlxrt-ignored`` (the fuzzing phase adds unknown properties with such names;
    with 12 examples an operation, 4 such bodies are answered 200 on 3 routes, with 6 only 1)
    answering 500; ``--generation-deterministic`` sends those same cases every run. It took
    ~230 s while every kept-alive answer waited ~40 ms for the client's delayed ACK (the test
    above)."""
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    pytest.importorskip("schemathesis")
    from mlxrt.testing import write_tiny_checkpoint

    # A 64-token context: fuzzed max_tokens past it are refused at once instead of generating.
    model = write_tiny_checkpoint(tmp_path / "small", "llama", config_overrides={"max_position_embeddings": 64})
    # WARNING: ~1,450 access-log lines would fill the unread stdout pipe and stall the server.
    server = server_process([str(model), "--log-level", "WARNING"])
    run = subprocess.run(
        [str(Path(sys.executable).with_name("schemathesis")), "run", f"{server.url}/schema/openapi.json",
         "--include-method", "POST", "--checks", "not_a_server_error,response_schema_conformance",
         "--max-examples", "12", "--request-timeout", "10", "--max-response-time", "10", "--workers", "1",
         "--phases", "examples,coverage,fuzzing", "--generation-deterministic"],
        capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-6000:]
    assert "Tested: " in run.stdout and "Server error" not in run.stdout
    assert httpx.get(f"{server.url}/health", timeout=3).status_code == 200
