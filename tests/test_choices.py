"""OpenAI's ``n`` (several choices per request) on chat and text completions, streamed and not,
and ``system_fingerprint``, through the official openai client."""

from __future__ import annotations

import json

import pytest
from support import Scripted, openai_client

from mlxrt.engine.sampling import choice_seed

MSG = [{"role": "user", "content": "Tell me about the sea."}]
SAMPLED = {"temperature": 1.0, "max_tokens": 6}


def counts(usage) -> tuple[int, int, int]:
    """Usage without cache reads (a repeated prompt is served from the prompt cache)."""
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


@pytest.mark.parametrize("batch", [1, 4])
def test_chat_choices_are_seeded_per_choice_and_reproducible(mlxrt_tiny_checkpoint, mlxrt_serve, batch):
    """Choice i runs on ``choice_seed(seed, i)``: choice 0 is what n=1 answers, the others
    differ, the same request gives the same choices, and usage counts the prompt once (in the
    serial lane, one choice after another, and in the batch lane, side by side)."""
    client = openai_client(mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"batch": batch}))
    both = client.chat.completions.create(model="m", messages=MSG, n=2, seed=7, **SAMPLED)
    again = client.chat.completions.create(model="m", messages=MSG, n=2, seed=7, **SAMPLED)
    alone = [client.chat.completions.create(model="m", messages=MSG, n=1, seed=choice_seed(7, i), **SAMPLED)
             for i in (0, 1)]
    assert choice_seed(7, 0) == 7
    assert [c.index for c in both.choices] == [0, 1]
    texts = [c.message.content for c in both.choices]
    assert texts == [a.choices[0].message.content for a in alone]
    assert texts == [c.message.content for c in again.choices]
    assert texts[0] != texts[1]
    assert both.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert both.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert both.usage.total_tokens == both.usage.prompt_tokens + both.usage.completion_tokens


def test_chat_choices_carry_their_own_logprobs(mlxrt_client):
    out = openai_client(mlxrt_client).chat.completions.create(model="m", messages=MSG, n=2, seed=2, logprobs=True,
                                                              top_logprobs=2, **SAMPLED)
    for choice in out.choices:
        assert "".join(e.token for e in choice.logprobs.content) == choice.message.content
        assert all(len(e.top_logprobs) == 2 for e in choice.logprobs.content)


def test_chat_choices_stream(mlxrt_client):
    client = openai_client(mlxrt_client)
    whole = client.chat.completions.create(model="m", messages=MSG, n=3, seed=11, **SAMPLED)
    chunks = list(client.chat.completions.create(model="m", messages=MSG, n=3, seed=11, stream=True,
                                                 stream_options={"include_usage": True}, **SAMPLED))
    texts, finished = {0: "", 1: "", 2: ""}, {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason is not None:
            finished[choice.index] = choice.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finished == {c.index: c.finish_reason for c in whole.choices}
    assert chunks[-1].choices == [] and counts(chunks[-1].usage) == counts(whole.usage)


def test_chat_choices_stream_usage_on_the_last_finish_chunk(mlxrt_client):
    """Without include_usage, the last choice to finish carries the usage of them all."""
    resp = mlxrt_client.post("/v1/chat/completions", json={"messages": MSG, "n": 2, "seed": 3, "stream": True,
                                                           **SAMPLED})
    frames = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
    assert resp.text.count("data: [DONE]") == 1
    finishes = [f for f in frames if f["choices"][0]["finish_reason"] is not None]
    assert sorted(f["choices"][0]["index"] for f in finishes) == [0, 1]
    assert "usage" not in finishes[0] and finishes[1]["usage"]["completion_tokens"] >= 2


def test_completions_choices(mlxrt_client):
    client = openai_client(mlxrt_client)
    both = client.completions.create(model="m", prompt="Once upon a time", n=2, seed=5, **SAMPLED)
    alone = [client.completions.create(model="m", prompt="Once upon a time", seed=choice_seed(5, i), **SAMPLED)
             for i in (0, 1)]
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == [a.choices[0].text for a in alone]
    assert both.choices[0].text != both.choices[1].text
    assert both.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert both.usage.prompt_tokens == alone[0].usage.prompt_tokens
    stream = list(client.completions.create(model="m", prompt="Once upon a time", n=2, seed=5, stream=True,
                                            stream_options={"include_usage": True}, **SAMPLED))
    texts = {0: "", 1: ""}
    for chunk in stream[:-1]:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts == {c.index: c.text for c in both.choices}
    assert counts(stream[-1].usage) == counts(both.usage)


def test_n_beyond_admission_is_a_400(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"max_queue": 2})
    for path, body in (("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": "hi"})):
        resp = client.post(path, json={**body, "n": 11, "max_tokens": 2})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["message"] == \
            "n must be at most 10: this server admits 10 requests at once (--batch 8 + --max-queue 2)"
        assert resp.json()["error"]["param"] == "n"
        assert client.post(path, json={**body, "n": 10, "max_tokens": 2}).status_code == 200


def test_choices_share_the_memory_budget():
    """Each of n choices gets 1/n of the safe context; the context window still caps each."""
    from mlxrt.engine.admission import choice_ceiling, plan_max_tokens
    from mlxrt.errors import ContextOverflow

    assert choice_ceiling(4096, 3000, 1) == 3000
    assert choice_ceiling(4096, 3000, 3) == 1000
    assert choice_ceiling(512, 3000, 2) == 512
    assert choice_ceiling(None, None, 4) is None
    assert plan_max_tokens(100, None, 65536, choice_ceiling(4096, 3000, 3), choices=3) == 900
    assert plan_max_tokens(100, 950, 65536, choice_ceiling(4096, 3000, 3), choices=3) == 900
    with pytest.raises(ContextOverflow, match="memory budget, shared by the request's n=3 choices"):
        plan_max_tokens(1000, 950, 65536, choice_ceiling(4096, 3000, 3), choices=3, window=4096)


def test_choices_share_the_memory_budget_over_http(mlxrt_tiny_checkpoint, mlxrt_serve):
    """Under --memory-budget, n=2 choices each get half the safe context: a max_tokens that
    fits one answer alone is reduced for two, a prompt over half is refused naming n."""
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("scripted", Scripted())], options={"memory_budget": 0.004})
    safe = client.get("/stats").json()["engine"]["admission"]["safe_context"]
    body = {"messages": MSG, "script": "ok"}
    prompt = client.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
    half = safe // 2 - prompt + 1  # one token more than half the budget holds with the prompt
    alone = client.post("/v1/chat/completions", json={**body, "max_tokens": half})
    assert alone.status_code == 200, alone.text
    assert "x-mlxrt-max-tokens" not in alone.headers
    both = client.post("/v1/chat/completions", json={**body, "max_tokens": half, "n": 2})
    assert both.status_code == 200 and both.headers["x-mlxrt-max-tokens"] == f"asked={half}; granted={half - 1}"
    assert [c["message"]["content"] for c in both.json()["choices"]] == ["ok", "ok"]
    long = [{"role": "user", "content": "hello " * (safe // 2)}]
    over = client.post("/v1/chat/completions", json={"messages": long, "script": "ok", "n": 2})
    assert over.status_code == 400
    error = over.json()["error"]
    assert error["code"] == "context_length_exceeded" and f"maximum context length is {safe // 2} tokens" in error["message"]
    assert "shared by the request's n=2 choices" in error["message"]


def test_system_fingerprint_is_stable_and_names_the_configuration(mlxrt_tiny_checkpoint, mlxrt_serve, mlxrt_client):
    client = openai_client(mlxrt_client)
    chat = client.chat.completions.create(model="m", messages=MSG, max_tokens=2)
    chunks = list(client.chat.completions.create(model="m", messages=MSG, max_tokens=2, stream=True,
                                                 stream_options={"include_usage": True}))
    text = client.completions.create(model="m", prompt="hi", max_tokens=2)
    text_chunks = list(client.completions.create(model="m", prompt="hi", max_tokens=2, stream=True))
    fingerprint = chat.system_fingerprint
    assert fingerprint.startswith("fp_") and len(fingerprint) == 15
    assert {c.system_fingerprint for c in chunks} == {fingerprint}
    assert text.system_fingerprint == fingerprint
    assert {c.system_fingerprint for c in text_chunks} == {fingerprint}
    other = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"temp": 0.7})
    assert openai_client(other).chat.completions.create(
        model="m", messages=MSG, max_tokens=2).system_fingerprint != fingerprint


def test_every_choice_is_cancelled_when_the_client_leaves(mlxrt_tiny_checkpoint, server_process):
    """A real server (the in-process client never disconnects): n=2, streamed or not, chat or
    text, and the client gives up; both engine requests are cancelled, the running one and the
    waiting one."""
    import time

    import httpx

    def cancelled(http: httpx.Client, count: int) -> int:
        deadline = time.monotonic() + 30
        while (seen := http.get("/stats").json()["engine"]["requests_cancelled"]) < count \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        return seen

    server = server_process([str(mlxrt_tiny_checkpoint("qwen3"))])
    long = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 30000, "temperature": 0, "n": 2}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=long, timeout=httpx.Timeout(60, read=1.0))
        assert cancelled(http, 2) == 2
        with http.stream("POST", "/v1/completions", json={"prompt": "go", "max_tokens": 30000, "temperature": 0,
                                                          "n": 2, "stream": True}) as resp:
            for line in resp.iter_lines():
                if '"text":"' in line and '"text":""' not in line:
                    break  # generated text: a choice is running on the engine
        assert cancelled(http, 4) == 4
        with http.stream("POST", "/v1/chat/completions", json={**long, "stream": True}) as resp:
            for line in resp.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    break
        assert cancelled(http, 6) == 6
        ok = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
                                                     "n": 2})
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
