"""llama-server's telemetry on mlxrt's OpenAI-shaped answers (docs/dialects.md, "llama.cpp and
vLLM fields"): ``timings`` on chat and text completions (non-streamed, the finish chunk, every
chunk with ``timings_per_token``), ``prompt_progress`` chunks with ``return_progress``, and
``POST /responses`` (no ``/v1``) with both. Anthropic answers carry neither.
"""

from __future__ import annotations

import json
import math

import pytest
from support import anthropic_client, openai_client

MSG = [{"role": "user", "content": "This is a test. " * 6}]
TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
           "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
STEP = 8  # --prefill-step-size: several prefill chunks for a short prompt


@pytest.fixture
def client(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"prefill_step_size": STEP})


def _events(resp) -> list[dict]:
    assert resp.status_code == 200, resp.text
    return [json.loads(line[6:]) for line in resp.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def _check(timings: dict, *, prompt_tokens: int, cached: int, completion_tokens: int) -> None:
    assert set(timings) == TIMINGS, timings
    assert timings["cache_n"] == cached and timings["prompt_n"] == prompt_tokens - cached
    assert timings["predicted_n"] == completion_tokens
    assert timings["prompt_ms"] > 0 and timings["predicted_ms"] >= 0
    assert math.isclose(timings["prompt_per_second"], timings["prompt_n"] / timings["prompt_ms"] * 1000)
    steps = completion_tokens - 1  # the first token comes with the prompt
    if steps and timings["predicted_ms"] > 0:
        assert math.isclose(timings["predicted_per_token_ms"], timings["predicted_ms"] / steps)


def test_a_chat_answer_carries_timings_matching_its_usage(client):
    out = openai_client(client).chat.completions.create(model="any", messages=MSG, max_tokens=6, temperature=1.0,
                                                        seed=0)
    usage = out.usage
    _check(out.model_extra["timings"], prompt_tokens=usage.prompt_tokens,
           cached=usage.prompt_tokens_details.cached_tokens, completion_tokens=usage.completion_tokens)
    again = openai_client(client).chat.completions.create(model="any", messages=MSG, max_tokens=6, temperature=1.0,
                                                          seed=0)
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the prompt cache answered the repeat
    _check(again.model_extra["timings"], prompt_tokens=again.usage.prompt_tokens,
           cached=again.usage.prompt_tokens_details.cached_tokens, completion_tokens=again.usage.completion_tokens)


def test_a_text_completion_carries_timings(client):
    out = openai_client(client).completions.create(model="any", prompt="Once upon a time", max_tokens=5,
                                                   temperature=1.0, seed=0)
    _check(out.model_extra["timings"], prompt_tokens=out.usage.prompt_tokens,
           cached=out.usage.prompt_tokens_details.cached_tokens, completion_tokens=out.usage.completion_tokens)


@pytest.mark.parametrize("per_token", [False, True])
def test_a_chat_stream_carries_timings_on_its_last_chunks_or_every_chunk(client, per_token):
    chunks = _events(client.post("/v1/chat/completions", json={
        "messages": MSG, "max_tokens": 6, "temperature": 1.0, "seed": 0, "stream": True,
        "stream_options": {"include_usage": True}, "timings_per_token": per_token}))
    first, *rest, usage_chunk = chunks
    assert "timings" not in first and first["choices"][0]["delta"]["role"] == "assistant"
    finish = next(c for c in rest if c["choices"][0]["finish_reason"])
    usage = usage_chunk["usage"]
    for last in (finish["timings"], usage_chunk["timings"]):
        _check(last, prompt_tokens=usage["prompt_tokens"], cached=usage["prompt_tokens_details"]["cached_tokens"],
               completion_tokens=usage["completion_tokens"])
    text_chunks = [c for c in rest if c["choices"][0]["delta"].get("content")]
    assert text_chunks
    if per_token:
        counts = [c["timings"]["predicted_n"] for c in text_chunks]
        assert counts == sorted(counts) and 1 <= counts[0] and counts[-1] <= usage["completion_tokens"]
        assert all(set(c["timings"]) == TIMINGS for c in text_chunks)
    else:
        assert not any("timings" in c for c in text_chunks)


def _progress(chunks: list[dict]) -> list[dict]:
    return [c["prompt_progress"] for c in chunks if "prompt_progress" in c]


@pytest.mark.parametrize("lane", ["serial", "batch"])
def test_return_progress_reports_each_prefill_chunk_in_the_models_tokens(client, lane):
    # A lone stream runs in the serial lane; one with logits processors (a grammar) in the batch lane.
    extra = {"grammar": 'root ::= "a"{1,4}'} if lane == "batch" else {}

    def run() -> tuple[list[dict], dict]:
        chunks = _events(client.post("/v1/chat/completions", json={
            "messages": MSG, "max_tokens": 4, "stream": True, "return_progress": True,
            "stream_options": {"include_usage": True}, **extra}))
        return _progress(chunks), chunks[-1]["usage"]

    reports, usage = run()
    total = usage["prompt_tokens"]
    # before prefill, after each chunk of all tokens but the last, and with the first token
    assert len(reports) == 2 + math.ceil((total - 1) / STEP), reports
    assert [r["processed"] for r in reports] == [0, *range(STEP, total - 1, STEP), total - 1, total]
    assert all(r["total"] == total and r["cache"] == 0 for r in reports)
    times = [r["time_ms"] for r in reports]
    assert times == sorted(times)
    # the repeat starts from the prompt cache: the first report says so, and fewer chunks run
    again, usage = run()
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and again[0]["processed"] == again[0]["cache"] == cached
    assert again[-1]["processed"] == total and len(again) < len(reports)
    # a text completion reports too; a stream that did not ask, or an answer that is not a stream, does not
    text = _events(client.post("/v1/completions", json={"prompt": "Once upon a time there was", "max_tokens": 2,
                                                         "stream": True, "return_progress": True}))
    assert _progress(text)[-1]["processed"] == _progress(text)[-1]["total"]
    assert not _progress(_events(client.post("/v1/chat/completions", json={
        "messages": MSG, "max_tokens": 2, "stream": True})))
    plain = client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "return_progress": True})
    assert plain.status_code == 200 and "prompt_progress" not in plain.json()


def test_bad_telemetry_switches_are_400s(client):
    for field in ("timings_per_token", "return_progress"):
        resp = client.post("/v1/chat/completions", json={"messages": MSG, field: "yes"})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == field, resp.text


def test_responses_without_v1_streams_progress_and_timings(client):
    resp = client.post("/responses", json={"input": "This is a test" * 5, "max_output_tokens": 6, "stream": True,
                                           "temperature": 1.0, "seed": 0,
                                           "timings_per_token": True, "return_progress": True})
    events = _events(resp)
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("timings" in e and e["timings"]["predicted_n"] >= 1 for e in deltas)
    (completed,) = [e for e in events if e["type"] in ("response.completed", "response.incomplete")]
    usage = completed["response"]["usage"]
    _check(completed["timings"], prompt_tokens=usage["input_tokens"],
           cached=usage["input_tokens_details"]["cached_tokens"], completion_tokens=usage["output_tokens"])
    # the official client reaches /responses from a base URL without /v1, and ignores the extras
    import openai

    sdk = openai.OpenAI(base_url=str(client.base_url), api_key="unused", http_client=client, max_retries=0)
    out = sdk.responses.create(model="any", input="Hi", max_output_tokens=4)
    assert out.status in ("completed", "incomplete") and out.usage.output_tokens >= 1


def test_anthropic_answers_carry_no_llama_telemetry(client):
    out = anthropic_client(client).messages.create(model="any", max_tokens=4, messages=MSG)
    assert "timings" not in (out.model_extra or {})
