"""Operating the server: API keys, request ids, /metrics, body limits, JSON logs, graceful
shutdown, and a fuzz of every POST route that must only ever answer 4xx."""

from __future__ import annotations

import json
import re
import signal
import time

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ServerProcess

MSG = [{"role": "user", "content": "hi"}]


def _api_routes(client) -> list[tuple[str, str]]:
    index = client.get("/v1", headers={"authorization": "Bearer k1"}).json()["endpoints"]
    return [tuple(e.split(" ", 1)) for e in index]


def test_api_keys_guard_every_api_route_but_health(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"api_keys": ["k1", "k2"]})
    routes = _api_routes(client)
    assert ("POST", "/v1/chat/completions") in routes and ("GET", "/metrics") in routes
    for method, path in routes:
        path = path.replace("{model_id:str}", "default").replace("{model_id:path}", "default")
        resp = client.request(method, path, json={})
        if path == "/health":
            assert resp.status_code == 200
            continue
        if path in ("/", "/curves", "/pages/assets/{name:str}"):  # the pages: public (docs/pages.md)
            page = client.get(path.replace("{name:str}", "pages.css"))
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/"), path
            continue
        if path in ("/favicon.ico", "/schema/assets/{name:str}"):  # static files a browser loads (api/schema_ui.py)
            static = client.get(path.replace("{name:str}", "swagger-ui.css"))
            assert static.status_code == 200 and static.headers["content-type"].startswith(("text/", "image/")), path
            continue
        assert resp.status_code == 401, (method, path, resp.status_code)
        body = resp.json()
        if path.startswith("/api/"):  # Ollama's shape: {"error": "..."}
            assert body["error"].startswith("missing API key"), (path, body)
            continue
        assert body["error"]["type"] == "authentication_error"  # in the route's own dialect
        if "code" in body["error"]:  # OpenAI's shape; Anthropic's has none
            assert body["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/models", headers={"authorization": "Bearer k1"}).status_code == 200
    assert client.get("/v1/models", headers={"x-api-key": "k2"}).status_code == 200
    bad = client.get("/v1/models", headers={"authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["error"]["message"] == "invalid API key"


def test_the_openai_client_authenticates_with_the_key(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"api_keys": ["secret"]})

    def sdk(key):
        return openai.OpenAI(base_url=f"{client.base_url}/v1", api_key=key, http_client=client, max_retries=0)

    out = sdk("secret").chat.completions.create(model="default", messages=MSG, max_tokens=2)
    assert out.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.AuthenticationError):
        sdk("wrong").chat.completions.create(model="default", messages=MSG, max_tokens=2)


def test_request_ids_are_echoed_or_minted(mlxrt_client):
    given_id = mlxrt_client.get("/health", headers={"x-request-id": "trace-42"})
    assert given_id.headers["x-request-id"] == "trace-42"
    minted = mlxrt_client.get("/nowhere")
    assert minted.status_code == 404 and re.fullmatch(r"req-[0-9a-f]{20}", minted.headers["x-request-id"])
    junk = mlxrt_client.get("/health", headers={"x-request-id": "x" * 500})
    assert junk.headers["x-request-id"].startswith("req-")


def test_metrics_in_prometheus_text_format(mlxrt_client):
    assert mlxrt_client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 3}).status_code == 200
    mlxrt_client.get("/nowhere/at/all")
    text = mlxrt_client.get("/metrics")
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain; version=0.0.4")
    body = text.text
    assert 'mlxrt_http_requests_total{method="POST",route="/v1/chat/completions",status="200"} 1' in body
    assert 'route="unmatched",status="404"' in body and "/nowhere" not in body
    assert re.search(r"^mlxrt_time_to_first_token_seconds_count [1-9]", body, re.M)
    assert re.search(r'^mlxrt_generation_seconds_bucket\{le="\+Inf"\} [1-9]', body, re.M)
    assert re.search(r'^mlxrt_prompt_cache_lookups_total\{outcome="miss"\} [1-9]', body, re.M)
    for name in ("mlxrt_queue_depth", "mlxrt_running_rows", "mlxrt_tokens_generated_total",
                 "mlxrt_prompt_cache_bytes"):
        assert re.search(rf"^# TYPE {name} gauge$", body, re.M)
    # Every sample line is "name{labels} value".
    for line in body.splitlines():
        assert line.startswith("#") or re.fullmatch(r"[a-z_]+(\{[^}]*\})? -?[0-9.e+]+", line), line


def test_an_oversized_body_is_413(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"max_body_bytes": 2000})
    resp = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 5000}]})
    assert resp.status_code == 413 and resp.json()["error"]["type"] == "request_too_large"
    assert client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}).status_code == 200


def _no_eos(model) -> dict[str, float]:
    eos = json.loads((model / "generation_config.json").read_text())["eos_token_id"]
    return {str(t): -100.0 for t in (eos if isinstance(eos, list) else [eos])}


def test_json_logs_graceful_shutdown_and_the_open_bind_warning(mlxrt_tiny_checkpoint):
    model = mlxrt_tiny_checkpoint("qwen3")
    server = ServerProcess([str(model), "--host", "0.0.0.0", "--log-format", "json", "--shutdown-grace", "1"])
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": MSG, "max_tokens": 2},
                   headers={"x-request-id": "abc-123"}, timeout=30)
    assert r.status_code == 200
    long = {"messages": MSG, "max_tokens": 20000, "stream": True, "logit_bias": _no_eos(model), "temperature": 0.7}
    with httpx.Client(base_url=server.url, timeout=60) as http, \
            http.stream("POST", "/v1/chat/completions", json=long) as stream:
        lines = stream.iter_lines()
        next(lines)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=30)
    assert code == 0 and time.monotonic() - started < 20
    output = server.stop()
    assert "WITHOUT an API key" in output
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    access = [r for r in records if r["logger"] == "mlxrt.access" and r["request_id"] == "abc-123"]
    assert access and access[0]["status"] == 200 and access[0]["path"] == "/v1/chat/completions"


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=12,
)
_FIELDS = ["messages", "prompt", "input", "model", "max_tokens", "temperature", "top_p", "stream", "stop",
           "logprobs", "top_logprobs", "seed", "logit_bias", "tools", "tool_choice", "n", "response_format",
           "stream_options", "max_completion_tokens", "encoding_format", "dimensions", "system"]
_bodies = st.one_of(
    _json,
    st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=6),
    st.fixed_dictionaries({"messages": st.lists(st.dictionaries(st.sampled_from(["role", "content", "name"]),
                                                                _json, max_size=3), max_size=3)},
                          optional={"max_tokens": _json, "stream": _json, "stop": _json}),
)


def _assert_error_schema(route: str, body: dict) -> None:
    """The error body has its dialect's documented shape, with the right types."""
    if route.startswith("/v1/messages"):  # Anthropic
        assert set(body) == {"type", "error"} and body["type"] == "error"
        assert isinstance(body["error"]["type"], str) and isinstance(body["error"]["message"], str)
        return
    if route.startswith("/api/"):  # Ollama
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"]
        return
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    assert error["param"] is None or isinstance(error["param"], str)
    assert error["code"] is None or isinstance(error["code"], str)


def test_fuzzed_bodies_on_every_post_route_get_only_4xx(mlxrt_client):
    posts = [p for m, p in _api_routes(mlxrt_client) if m == "POST"]
    assert "/v1/chat/completions" in posts

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=_bodies, route=st.sampled_from(posts), raw=st.booleans())
    def check(body, route, raw):
        if raw:  # not JSON at all
            resp = mlxrt_client.post(route, content=json.dumps(body)[::-1].encode() + b"\xff",
                                     headers={"content-type": "application/json"})
        else:
            resp = mlxrt_client.post(route, content=json.dumps(body, allow_nan=True),
                                     headers={"content-type": "application/json"})
        assert resp.status_code < 500, (route, body, resp.text[:300])
        if resp.status_code >= 400:
            _assert_error_schema(route, resp.json())

    check()
    assert mlxrt_client.get("/health").status_code == 200
    assert mlxrt_client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}).status_code == 200


def test_guards_run_on_the_event_loop(mlxrt_tiny_checkpoint, mlxrt_serve):
    """The edge and API-key guards are coroutines: Litestar runs a plain-function guard on a
    worker thread of the event loop's default executor (named ``asyncio_N``), a thread hop on
    every request; none is started here."""
    import threading

    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"api_keys": ["k1"]})
    before = {t.name for t in threading.enumerate()}
    for _ in range(3):
        assert client.get("/v1/models", headers={"x-api-key": "k1"}).status_code == 200
        assert client.get("/v1/models").status_code == 401
    started = {t.name for t in threading.enumerate()} - before
    assert not [name for name in started if name.startswith("asyncio_")], started
