"""The engine under concurrency, through real servers: batching without cross-talk, seeded
reproducibility under load, disconnects freeing their rows, admission and back-pressure,
and the prompt cache's exact accounting in both lanes."""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time

import httpx
import openai
import pytest
from support import ServerProcess
from tokenizers import Tokenizer

PROMPTS = [f"Request number {i}: tell me about topic {i * 7 % 11}" for i in range(8)]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(client, prompt: str, **kw) -> str:
    out = client.chat.completions.create(model="default", messages=[{"role": "user", "content": prompt}],
                                         max_tokens=kw.pop("max_tokens", 16), **kw)
    return out.choices[0].message.content


def _stats(server) -> dict:
    return httpx.get(f"{server.url}/stats", timeout=10).json()["engine"]


def _wait_idle(server, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = _stats(server)
        if (stats["running_rows"] == 0 and stats["queue_depth"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


@pytest.fixture(scope="module")
def batch_server(tmp_path_factory):
    from mlxrt.testing import write_tiny_checkpoint

    model = write_tiny_checkpoint(tmp_path_factory.mktemp("batch") / "qwen3", "qwen3")
    server = ServerProcess([str(model), "--prompt-cache-size", "0"])  # the default --batch: 8
    yield server
    server.stop()


def test_eight_concurrent_greedy_requests_each_return_what_they_return_alone(batch_server):
    client = _client(batch_server)
    alone = [_chat(client, p, temperature=0) for p in PROMPTS]
    assert len(set(alone)) > 1  # the prompts lead to different texts: cross-talk would show
    with cf.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: _chat(client, p, temperature=0), PROMPTS))
    assert together == alone
    lanes = _stats(batch_server)["served_by_lane"]
    # Alone, a request decodes in the serial lane's loop; together, at least 7 of 8 shared the batch.
    assert lanes["serial"] >= 8 and lanes["batch"] >= 7 and lanes["serial"] + lanes["batch"] >= 16


def _stream_text(server, prompt: str, max_tokens: int, started: threading.Event | None = None) -> str:
    body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "temperature": 0}
    parts = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                parts += [c["delta"].get("content") or "" for c in json.loads(line[6:])["choices"]]
                if started is not None and len(parts) == 5:
                    started.set()
    return "".join(parts)


def test_a_lone_stream_decodes_serially_and_joins_the_batch_when_another_arrives(batch_server):
    before = _wait_idle(batch_server)["served_by_lane"]
    alone = _stream_text(batch_server, PROMPTS[2], 300)
    lanes = _wait_idle(batch_server)["served_by_lane"]
    assert (lanes["serial"], lanes["batch"]) == (before["serial"] + 1, before["batch"])
    started = threading.Event()
    with cf.ThreadPoolExecutor(1) as pool:
        first = pool.submit(_stream_text, batch_server, PROMPTS[2], 300, started)
        assert started.wait(60)
        second = _chat(_client(batch_server), PROMPTS[3], temperature=0)
        handed_over = first.result(timeout=120)
    # The first stream moved into the batch mid-way, with its cache, and said the same.
    assert handed_over == alone
    assert second
    after = _wait_idle(batch_server)["served_by_lane"]
    assert (after["serial"], after["batch"]) == (lanes["serial"], lanes["batch"] + 2)


def test_a_lone_request_with_a_logit_bias_decodes_serially_and_says_the_same_in_a_batch(batch_server):
    """A logit bias (what ``ignore_eos`` adds) and the penalties keep no state: a lone request with
    them takes the serial lane's loop, as one without; under load it says the same in the batch."""
    client = _client(batch_server)
    plain = _chat(client, PROMPTS[4], temperature=0)
    first = httpx.post(f"{batch_server.url}/tokenize", json={"content": plain}, timeout=10).json()["tokens"][0]
    biased = {"temperature": 0, "logit_bias": {str(first): -100}, "frequency_penalty": 0.5}
    before = _wait_idle(batch_server)["served_by_lane"]
    alone = _chat(client, PROMPTS[4], **biased)
    lanes = _wait_idle(batch_server)["served_by_lane"]
    assert alone != plain  # the bias was applied
    assert (lanes["serial"], lanes["batch"]) == (before["serial"] + 1, before["batch"])
    # beside it in the batch: a row with a logit bias alone (every row's added in one scatter while
    # no row reads its history) and a row with a penalty (each row's processors on its own row)
    bias_only = {"temperature": 0, "logit_bias": {str(first): -100}}
    penalty = {"temperature": 0, "presence_penalty": 1.5}
    others = [(PROMPTS[5], bias_only), (PROMPTS[6], penalty), (PROMPTS[7], {"temperature": 0})]
    others_alone = [_chat(client, p, max_tokens=40, **kw) for p, kw in others]
    with cf.ThreadPoolExecutor(8) as pool:
        noise = [pool.submit(_chat, client, p, max_tokens=40, **kw) for p, kw in others]
        time.sleep(0.05)
        loaded = pool.submit(_chat, client, PROMPTS[4], **biased).result()
        assert [f.result() for f in noise] == others_alone
    assert loaded == alone


def test_a_seeded_request_returns_the_same_text_alone_and_under_load(batch_server):
    client = _client(batch_server)
    seeded = {"temperature": 1.0, "seed": 1234, "max_tokens": 24}
    alone = _chat(client, PROMPTS[0], **seeded)
    assert _chat(client, PROMPTS[0], **seeded) == alone
    with cf.ThreadPoolExecutor(8) as pool:
        noise = [pool.submit(_chat, client, p, temperature=1.0, max_tokens=40) for p in PROMPTS[1:]]
        time.sleep(0.05)  # the seeded request joins a batch that is already decoding
        loaded = pool.submit(_chat, client, PROMPTS[0], **seeded).result()
        [f.result() for f in noise]
    assert loaded == alone
    # Without a seed, two identical requests draw different defaults.
    unseeded = {_chat(client, PROMPTS[0], temperature=1.0, max_tokens=24) for _ in range(3)}
    assert len(unseeded) > 1


def _stream(server, i: int, disconnect: bool) -> tuple[str, str] | None:
    """One streaming chat (seeded, so its text is known in advance); ``(text, finish_reason)``,
    or ``None`` for a client that leaves mid-stream."""
    body = {"model": "default", "messages": [{"role": "user", "content": PROMPTS[i % 8]}],
            "max_tokens": 60 if not disconnect else 1500, "stream": True, "temperature": 0.7, "seed": i,
            "stream_options": {"include_usage": True}}
    finish, parts = None, []
    with httpx.Client(base_url=server.url, timeout=120) as http, \
            http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        chunks = 0
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunks += 1
            if disconnect and chunks >= 5:
                return None  # leaving the block closes the connection mid-stream
            for choice in json.loads(line[6:]).get("choices", []):
                parts.append(choice["delta"].get("content") or "")
                finish = choice.get("finish_reason") or finish
    return "".join(parts), finish


def test_thirty_two_streams_with_eight_disconnects(batch_server):
    client = _client(batch_server)
    # What each finishing stream must say: its seeded text, computed alone beforehand.
    expected = {i: _chat(client, PROMPTS[i % 8], temperature=0.7, seed=i, max_tokens=60)
                for i in range(32) if i % 4 != 0}
    before = _wait_idle(batch_server)
    baseline_memory = before["mlx_active_bytes"]
    with cf.ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(_stream, batch_server, i, i % 4 == 0) for i in range(32)]
        results = [f.result(timeout=300) for f in futures]
    finished = {i: r for i, r in enumerate(results) if i % 4 != 0}
    assert all(r is not None and r[1] in ("stop", "length") for r in finished.values())
    # No cross-talk: every stream got exactly its own text.
    assert {i: r[0] for i, r in finished.items()} == expected
    after = _wait_idle(batch_server)
    assert after["running_rows"] == 0 and after["reserved_tokens"] == 0 and after["queue_depth"] == 0
    assert after["requests_cancelled"] - before["requests_cancelled"] == 8
    assert httpx.get(f"{batch_server.url}/health").status_code == 200
    # Every row's KV was freed (the prompt cache is off on this server, so nothing is kept).
    assert after["mlx_active_bytes"] <= baseline_memory * 1.05 + (1 << 20)
    assert _chat(client, "still there?", temperature=0)


def test_memory_budget_refuses_an_over_budget_prompt_before_any_token(mlxrt_tiny_checkpoint, server_process):
    """A max_tokens over the budget's safe context is reduced to it; a prompt over it is refused
    in OpenAI's words, naming the memory budget and the model's own window."""
    server = server_process([str(mlxrt_tiny_checkpoint("qwen3")), "--memory-budget", "0.004"])
    stats = _stats(server)
    safe = stats["admission"]["safe_context"]
    assert 256 <= safe < 100000
    prompt = [{"role": "user", "content": "hello"}]
    reduced = httpx.post(f"{server.url}/v1/chat/completions",
                         json={"messages": prompt, "max_tokens": safe + 10, "stop": ["e"]}, timeout=60)
    assert reduced.status_code == 200, reduced.text
    used = reduced.json()["usage"]["prompt_tokens"]
    assert reduced.headers["x-mlxrt-max-tokens"] == f"asked={safe + 10}; granted={safe - used}"
    stats = _stats(server)
    resp = httpx.post(f"{server.url}/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hello " * safe}], "max_tokens": 4}, timeout=30)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "context_length_exceeded"
    window = 40960  # the tiny Qwen3's max_position_embeddings
    assert error["message"].startswith(f"This model's maximum context length is {safe} tokens on this server "
                                       f"(the server's memory budget; the model's own window is {window} tokens). "
                                       "However, your messages resulted in "), error["message"]
    assert _stats(server)["tokens_generated"] == stats["tokens_generated"]  # nothing ran
    ok = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": prompt, "max_tokens": 4}, timeout=30)
    assert ok.status_code == 200


def test_a_budget_that_cannot_hold_the_model_refuses_to_load(mlxrt_tiny_checkpoint):
    with pytest.raises(RuntimeError, match="memory budget of 0.00 GB cannot serve this model"):
        ServerProcess([str(mlxrt_tiny_checkpoint("qwen3")), "--memory-budget", "0.0001"])


def _no_eos(model) -> dict[str, float]:
    import json

    eos = json.loads((model / "generation_config.json").read_text())["eos_token_id"]
    return {str(t): -100.0 for t in (eos if isinstance(eos, list) else [eos])}


def test_a_full_queue_answers_429_with_retry_after(mlxrt_tiny_checkpoint, server_process):
    model = mlxrt_tiny_checkpoint("qwen3")
    server = server_process([str(model), "--max-queue", "1", "--batch", "1"])  # one row: the next request waits
    msgs = [{"role": "user", "content": "go"}]
    long = {"messages": msgs, "max_tokens": 20000, "temperature": 0.7, "stream": True, "logit_bias": _no_eos(model)}
    with httpx.Client(base_url=server.url, timeout=60) as http, \
            http.stream("POST", "/v1/chat/completions", json=long) as running:
        assert running.status_code == 200
        lines = running.iter_lines()  # kept: a discarded iterator would close the response
        next(lines)  # running: it holds the only row
        with cf.ThreadPoolExecutor(1) as pool:
            # Waits for the row (its response starts only once it is admitted).
            waiting = pool.submit(httpx.post, f"{server.url}/v1/chat/completions",
                                  json={"messages": msgs, "max_tokens": 3}, timeout=60)
            deadline = time.monotonic() + 10
            while _stats(server)["queue_depth"] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            refused = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": msgs, "max_tokens": 3},
                                 timeout=30)
            assert refused.status_code == 429
            assert int(refused.headers["retry-after"]) >= 1
            assert refused.json()["error"]["code"] == "queue_full"
            assert not waiting.done()
            running.close()  # the running client leaves: the waiting request gets the row
            assert waiting.result(timeout=60).status_code == 200
    stats = _wait_idle(server)
    assert stats["requests_rejected"] == 1 and stats["requests_cancelled"] == 1


def test_a_request_past_the_request_timeout_ends_with_length_and_says_so(mlxrt_tiny_checkpoint, server_process):
    """A generation that runs into --request-timeout ends there like a full window: finish_reason
    length, what it generated so far, x-mlxrt-finish (issue 43: before, a 504 lost the text)."""
    model = mlxrt_tiny_checkpoint("qwen3")
    server = server_process([str(model), "--request-timeout", "1.5"])
    long = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 20000, "temperature": 0.7,
            "logit_bias": _no_eos(model)}
    started = time.monotonic()
    resp = httpx.post(f"{server.url}/v1/chat/completions", json=long, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    assert 0 < resp.json()["usage"]["completion_tokens"] < 20000
    assert resp.headers["x-mlxrt-finish"] == "request_timeout"
    assert time.monotonic() - started < 10
    stream = httpx.post(f"{server.url}/v1/chat/completions", json={**long, "stream": True}, timeout=60)
    assert stream.status_code == 200 and '"finish_reason": "length"' in stream.text.replace('":"', '": "')
    assert _wait_idle(server)["running_rows"] == 0
    ok = httpx.post(f"{server.url}/v1/chat/completions", json={**long, "max_tokens": 3}, timeout=30)
    assert ok.status_code == 200 and "x-mlxrt-finish" not in ok.headers


@pytest.mark.parametrize("batch", ["1", "4"])
def test_prompt_cache_reports_exact_cached_tokens(mlxrt_tiny_checkpoint, server_process, batch):
    model = mlxrt_tiny_checkpoint("qwen3")
    server = server_process([str(model), "--batch", batch])
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    base = "The quick brown fox jumps over the lazy dog. " * 6
    first, second = base + "Alpha beta gamma", base + "Delta epsilon"
    ids1, ids2 = tok.encode(first, add_special_tokens=False).ids, tok.encode(second, add_special_tokens=False).ids
    common = next(i for i, (x, y) in enumerate(zip(ids1, ids2, strict=False)) if x != y)
    http = httpx.Client(base_url=server.url, timeout=60)

    def complete(prompt):
        r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200
        return r.json()["usage"], r.headers["x-mlxrt-cache"]

    usage, header = complete(first)
    assert header.startswith("miss; cached=0")
    usage, header = complete(first)  # the same prompt again: all but the last token reused
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert header.startswith("hit; ")
    usage, header = complete(second)  # diverges inside the first prompt
    assert usage["prompt_tokens"] == len(ids2)
    assert usage["prompt_tokens_details"]["cached_tokens"] == common
    assert header == f"partial; cached={common}; prompt={len(ids2)}; diverged_at={common}; reason=prompt diverged"
    stats = _stats(server)
    assert stats["prompt_cache"]["last_miss"]["diverged_at"] == common
    # /stats is shared: counts only, never the prompt text or the request id.
    assert stats["prompt_cache"]["last_miss"] == {"status": "partial", "diverged_at": common,
                                                  "prompt_tokens": len(ids2), "cached_tokens": common,
                                                  "reason": "prompt diverged"}
