"""The engine as HTTP sees it: the prompt-cache header, back-pressure (429 + Retry-After),
and requests cancelled when their client leaves, streaming or not."""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest
from support import openai_client

from mlxrt import hookimpl
from mlxrt.errors import QueueFull

MSG = [{"role": "user", "content": "Tell me about the sea."}]
CACHE = re.compile(r"^(hit|partial|miss|off); cached=(\d+); prompt=(\d+)(; diverged_at=\d+)?(; reason=[a-z ]+)?$")


def _cache(headers: httpx.Headers) -> tuple[str, int, int]:
    match = CACHE.match(headers["x-mlxrt-cache"])
    assert match, headers["x-mlxrt-cache"]
    return match[1], int(match[2]), int(match[3])


def test_cache_header_on_non_stream_chat_and_completions(mlxrt_client):
    client = openai_client(mlxrt_client)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=MSG, max_tokens=4, temperature=0)
    out = raw.parse()
    _status, cached, prompt = _cache(raw.headers)
    assert prompt == out.usage.prompt_tokens and cached == out.usage.prompt_tokens_details.cached_tokens
    raw = client.completions.with_raw_response.create(model="m", prompt="The sea is", max_tokens=4, temperature=0)
    out = raw.parse()
    _status, cached, prompt = _cache(raw.headers)
    assert prompt == out.usage.prompt_tokens and cached == out.usage.prompt_tokens_details.cached_tokens


def test_cache_header_on_streams_and_cached_tokens_in_stream_usage(mlxrt_client):
    client = openai_client(mlxrt_client)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=MSG, max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True})
    _status, cached, prompt = _cache(raw.headers)
    usage = [c.usage for c in raw.parse() if c.usage is not None][-1]
    assert prompt == usage.prompt_tokens and cached == usage.prompt_tokens_details.cached_tokens
    raw = client.completions.with_raw_response.create(model="m", prompt="The sea is", max_tokens=4,
                                                      temperature=0, stream=True)
    _status, cached, prompt = _cache(raw.headers)
    usage = [c.usage for c in raw.parse() if c.usage is not None][-1]
    assert prompt == usage.prompt_tokens and cached == usage.prompt_tokens_details.cached_tokens


def test_cache_header_merges_with_the_ignored_fields_header(mlxrt_client):
    resp = mlxrt_client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "frobnicate": 1})
    assert resp.headers["x-mlxrt-ignored"] == "frobnicate"
    _cache(resp.headers)


class Busy:
    """Refuses every request the way a full engine queue does."""

    @hookimpl
    def mlxrt_prompt_canonicalize(self, request, dialect):
        raise QueueFull("the server is busy; 4 requests are waiting", retry_after=7)


@pytest.mark.parametrize("stream", [False, True])
def test_queue_full_is_a_429_with_retry_after(mlxrt_tiny_checkpoint, mlxrt_serve, stream):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("busy", Busy())])
    for path, body in [("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": "x"})]:
        resp = client.post(path, json={**body, "max_tokens": 3, "stream": stream})
        assert resp.status_code == 429
        assert resp.headers["retry-after"] == "7"
        assert resp.headers["content-type"].startswith("application/json")
        assert resp.json() == {"error": {"message": "the server is busy; 4 requests are waiting",
                                         "type": "rate_limit_error", "param": None, "code": "queue_full"}}


def test_queue_full_raises_rate_limit_error_in_the_openai_client(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = openai_client(mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("busy", Busy())]))
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="m", messages=MSG, max_tokens=3)
    assert caught.value.status_code == 429 and caught.value.code == "queue_full"
    assert caught.value.response.headers["retry-after"] == "7"
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="m", messages=MSG, max_tokens=3, stream=True)
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model="m", prompt="x", max_tokens=3)


def _wait_cancelled(http: httpx.Client, count: int) -> dict:
    deadline = time.monotonic() + 30
    stats = http.get("/stats").json()
    while stats["engine"]["requests_cancelled"] < count and time.monotonic() < deadline:
        time.sleep(0.1)
        stats = http.get("/stats").json()
    return stats


# Greedy, so the run is the same every time (this prompt never samples EOS in 30000 tokens).
LONG_CHAT = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 30000, "temperature": 0}
LONG_TEXT = {"prompt": "go", "max_tokens": 30000, "temperature": 0}


def test_non_streaming_requests_are_cancelled_when_the_client_leaves(mlxrt_tiny_checkpoint, server_process):
    # A real server: the in-process test client never disconnects.
    server = server_process([str(mlxrt_tiny_checkpoint("qwen3"))])
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for n, (path, body) in enumerate([("/v1/chat/completions", LONG_CHAT), ("/v1/completions", LONG_TEXT)], 1):
            # The client gives up after 1 s of silence and closes the connection.
            with pytest.raises(httpx.ReadTimeout):
                http.post(path, json=body, timeout=httpx.Timeout(60, read=1.0))
            stats = _wait_cancelled(http, n)
            assert stats["engine"]["requests_cancelled"] == n, path
        ok = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
        assert ok.status_code == 200 and "x-mlxrt-cache" in ok.headers


def test_streamed_text_completion_is_cancelled_when_the_client_leaves(mlxrt_tiny_checkpoint, server_process):
    server = server_process([str(mlxrt_tiny_checkpoint("qwen3"))])
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json={**LONG_TEXT, "stream": True}) as resp:
            assert "x-mlxrt-cache" in resp.headers
            for line in resp.iter_lines():
                if '"text":"' in line and '"text":""' not in line:
                    break  # generated text: the request is running on the engine
        assert _wait_cancelled(http, 1)["engine"]["requests_cancelled"] == 1
