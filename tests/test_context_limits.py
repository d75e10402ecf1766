"""Limits the way clients expect them (issue 43), through the official SDKs on default flags:

- a ``max_tokens`` (``max_completion_tokens``, ``max_output_tokens``) larger than what fits is
  reduced to it on every dialect, said in ``x-mlxrt-max-tokens``; the answer ends with
  ``length`` when the window is full;
- only a prompt that does not fit by itself is refused, in the dialect's own words and code,
  the ones agent CLIs recognise as overflow (Claude Code's patterns, read from its 2.1.332
  release; Codex matches the ``context_length_exceeded`` code).
"""

from __future__ import annotations

import re

import anthropic
import openai
import pytest
from support import Scripted, anthropic_client, openai_client

from mlxrt.engine.admission import plan_max_tokens
from mlxrt.errors import ContextOverflow

#: Claude Code 2.1.332 (cli.js in its binary): the exact Anthropic text it knows, and how it
#: reads the two numbers to decide how much to compact.
CLAUDE_CODE_EXACT = re.compile(r"^prompt is too long: \d+ tokens > \d+ maximum$")
CLAUDE_CODE_NUMBERS = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)
#: A few of the phrases Claude Code (and most OpenAI-compatible clients) take as overflow.
OPENAI_PHRASES = ("maximum context length", "context_length_exceeded", "reduce the length of the messages")
ASKED = 32000
WINDOW = 8192  # the tiny llama's max_position_embeddings, SmolLM2's window


def test_admission_reduces_max_tokens_and_refuses_only_the_prompt():
    assert plan_max_tokens(100, 32000, 512, 8192) == 8092
    assert plan_max_tokens(100, None, 512, 8192) == 512
    assert plan_max_tokens(8000, None, 512, 8192) == 192
    assert plan_max_tokens(8191, 32000, 512, 8192) == 1
    assert plan_max_tokens(100, 32000, 512, None) == 32000
    with pytest.raises(ContextOverflow) as err:
        plan_max_tokens(8192, 1, 512, 8192, window=8192)
    assert err.value.message == ("This model's maximum context length is 8192 tokens. However, your messages "
                                 "resulted in 8192 tokens. Please reduce the length of the messages.")
    assert (err.value.status, err.value.type, err.value.code) == (400, "invalid_request_error", "context_length_exceeded")
    with pytest.raises(ContextOverflow, match=r"is 3000 tokens on this server \(the server's memory budget; "
                                              r"the model's own window is 8192 tokens\)"):
        plan_max_tokens(3000, None, 512, 3000, window=8192)


@pytest.fixture
def server(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("scripted", Scripted())])


def _granted(headers) -> None:
    prompt = int(re.search(r"prompt=(\d+)", headers["x-mlxrt-cache"]).group(1))  # the prompt, any dialect
    assert headers["x-mlxrt-max-tokens"] == f"asked={ASKED}; granted={WINDOW - prompt}"


def test_max_tokens_beyond_the_window_answers_on_every_dialect(server):
    """32,000 on an 8k model (agent CLIs' default) answers 200 on chat, completions, Responses
    and Messages; the header says what was asked and granted."""
    oa = openai_client(server)
    chat = oa.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=ASKED, extra_body={"script": "ok"})
    assert chat.parse().choices[0].message.content == "ok"
    _granted(chat.headers)
    newer = oa.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=ASKED,
        extra_body={"script": "ok"})
    _granted(newer.headers)
    text = oa.completions.with_raw_response.create(model="m", prompt="hi", max_tokens=ASKED,
                                                    extra_body={"script": "ok"})
    _granted(text.headers)
    responses = oa.responses.with_raw_response.create(model="m", input="hi", max_output_tokens=ASKED,
                                                      extra_body={"script": "ok"})
    assert responses.parse().output_text == "ok"
    _granted(responses.headers)
    messages = anthropic_client(server).messages.with_raw_response.create(
        model="m", max_tokens=ASKED, messages=[{"role": "user", "content": "hi"}], extra_body={"script": "ok"},
        timeout=60)  # else the SDK insists on streaming so large a max_tokens
    _granted(messages.headers)
    fits = oa.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5, extra_body={"script": "ok"})
    assert "x-mlxrt-max-tokens" not in fits.headers


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """A model with a 64-token window, so filling it is quick."""
    from mlxrt.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("small") / "llama", "llama",
                                 config_overrides={"max_position_embeddings": 64})


@pytest.fixture
def small(small_model, mlxrt_serve):
    return mlxrt_serve(small_model, plugins=[("scripted", Scripted())])


def test_a_full_window_ends_with_length(small):
    oa = openai_client(small)
    long = " ".join(["word"] * 200)  # longer than the window: only the window ends it
    chat = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=ASKED,
                                      extra_body={"script": long})
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == 64
    message = anthropic_client(small).messages.create(model="m", max_tokens=ASKED, extra_body={"script": long}, timeout=60,
                                                      messages=[{"role": "user", "content": "hi"}])
    assert message.stop_reason == "max_tokens"
    usage = message.usage  # input_tokens are the prompt's tokens not read from the cache
    assert usage.input_tokens + usage.cache_read_input_tokens + usage.output_tokens == 64


def test_a_prompt_over_the_window_is_the_dialects_own_overflow(small):
    over = " ".join(["word"] * 80)
    oa = openai_client(small)
    calls = {
        "chat": lambda: oa.chat.completions.create(model="m", messages=[{"role": "user", "content": over}], max_tokens=4),
        "completions": lambda: oa.completions.create(model="m", prompt=over, max_tokens=4),
        "responses": lambda: oa.responses.create(model="m", input=over),
        "chat, streamed": lambda: oa.chat.completions.create(model="m", messages=[{"role": "user", "content": over}],
                                                            stream=True),  # refused before the stream starts
    }
    for name, call in calls.items():
        with pytest.raises(openai.BadRequestError) as err:
            call()
        error = err.value.body
        assert err.value.code == "context_length_exceeded" and error["type"] == "invalid_request_error", name
        assert re.fullmatch(r"This model's maximum context length is 64 tokens\. However, your messages resulted "
                            r"in \d+ tokens\. Please reduce the length of the messages\.", error["message"]), error
        assert all(phrase in f"{error['message']} {error['code']}".lower() for phrase in OPENAI_PHRASES)
    with pytest.raises(anthropic.BadRequestError) as err:
        anthropic_client(small).messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": over}])
    error = err.value.body["error"]
    assert error["type"] == "invalid_request_error" and CLAUDE_CODE_EXACT.match(error["message"]), error
    actual, limit = map(int, CLAUDE_CODE_NUMBERS.search(error["message"]).groups())
    assert actual > limit == 64
    assert small.post("/v1/messages/count_tokens", json={"model": "m", "messages": [
        {"role": "user", "content": over}]}).json()["input_tokens"] == actual


def test_a_body_too_long_to_tokenize_is_the_same_overflow(small):
    """The early character check (no tokenizing) answers the same words, as a lower bound."""
    huge = "a" * (64 * 32 + 100)
    resp = small.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": huge}]})
    assert resp.status_code == 400
    assert CLAUDE_CODE_NUMBERS.search(resp.json()["error"]["message"]), resp.json()
    chat = small.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": huge}]})
    assert chat.json()["error"]["code"] == "context_length_exceeded"
    assert "resulted in at least 67 tokens" in chat.json()["error"]["message"]


def test_max_items_and_max_length_keep_a_structured_answer_whole(mlxrt_tiny_checkpoint, mlxrt_serve):
    """docs/structured-outputs.md, "Keeping structured outputs short": the grammar closes the
    list at maxItems and each string at maxLength, whatever a (here random) model would say."""
    import json

    server = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"))
    schema = {"type": "object", "additionalProperties": False, "required": ["items"], "properties": {
        "items": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 3}}}}
    for seed in range(3):
        resp = openai_client(server).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "list"}], max_tokens=400, seed=seed, temperature=1,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
        choice = resp.choices[0]
        assert choice.finish_reason == "stop", choice
        items = json.loads(choice.message.content)["items"]
        assert len(items) <= 2 and all(len(item) <= 3 for item in items), items
