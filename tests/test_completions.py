"""``POST /v1/completions`` and ``stream_options.include_usage``, through the openai client."""

from __future__ import annotations

import json

import openai
import pytest
from support import openai_client
from tokenizers import Tokenizer

MSG = [{"role": "user", "content": "Tell me about the sea."}]
PROMPT = "Once upon a time"


def _frames(resp):
    frames = [f for f in resp.text.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    assert frames[-1] == "data: [DONE]"
    return [json.loads(f[6:]) for f in frames[:-1]]


def test_non_stream_shape(mlxrt_client):
    out = openai_client(mlxrt_client).completions.create(model="any", prompt=PROMPT, max_tokens=8, temperature=0)
    assert out.object == "text_completion" and out.id.startswith("cmpl-") and out.model == "qwen3-0-gen"
    choice = out.choices[0]
    assert choice.index == 0 and isinstance(choice.text, str) and choice.finish_reason in ("length", "stop")
    assert choice.logprobs is None
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert out.usage.completion_tokens <= 8


def test_prompt_is_tokenized_raw_without_a_chat_template(mlxrt_tiny_checkpoint, mlxrt_client):
    tok = Tokenizer.from_file(str(mlxrt_tiny_checkpoint("qwen3") / "tokenizer.json"))
    out = openai_client(mlxrt_client).completions.create(model="m", prompt=PROMPT, max_tokens=1)
    assert out.usage.prompt_tokens == len(tok.encode(PROMPT).ids)


def test_alias_and_stream_equals_non_stream(mlxrt_client):
    client = openai_client(mlxrt_client)
    whole = client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0)
    parts = list(client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in parts if c.choices) == whole.choices[0].text
    assert all(c.object == "text_completion" for c in parts)
    assert parts[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    alias = mlxrt_client.post("/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0})
    assert alias.status_code == 200 and alias.json()["choices"][0]["text"] == whole.choices[0].text


def test_stream_grammar(mlxrt_client):
    chunks = _frames(mlxrt_client.post("/v1/completions", json={
        "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True}))
    *deltas, last = chunks
    assert all(c["choices"][0]["text"] and c["choices"][0]["finish_reason"] is None for c in deltas)
    assert all("usage" not in c for c in deltas)
    assert last["choices"][0]["text"] == "" and last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 6


def test_default_max_tokens_is_512_and_the_flag_overrides_it(mlxrt_tiny_checkpoint, mlxrt_serve, mlxrt_client):
    out = mlxrt_client.post("/v1/completions", json={"prompt": PROMPT, "logit_bias": {"5": 100}}).json()
    assert out["usage"]["completion_tokens"] == 512 and out["choices"][0]["finish_reason"] == "length"
    flagged = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"max_tokens": 7})
    out = flagged.post("/v1/completions", json={"prompt": PROMPT, "logit_bias": {"5": 100}}).json()
    assert out["usage"]["completion_tokens"] == 7
    chat = flagged.post("/v1/chat/completions", json={"messages": MSG, "logit_bias": {"5": 100}}).json()
    assert chat["usage"]["completion_tokens"] == 7


def test_same_seed_same_text(mlxrt_client):
    client = openai_client(mlxrt_client)

    def run(seed):
        return client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=1.0,
                                         seed=seed).choices[0].text

    assert run(4) == run(4)


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", {"messages": MSG}),
                                            ("/v1/completions", {"prompt": PROMPT})])
def test_include_usage_sends_a_last_chunk_without_choices(mlxrt_client, path, body):
    kind = "chat.completion.chunk" if "chat" in path else "text_completion"
    chunks = _frames(mlxrt_client.post(path, json={
        **body, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}))
    *rest, finish, usage = chunks
    assert usage["choices"] == [] and usage["object"] == kind and usage["usage"]["completion_tokens"] == 5
    assert finish["choices"][0]["finish_reason"] == "length" and "usage" not in finish
    assert all("usage" not in c for c in rest)
    plain = _frames(mlxrt_client.post(path, json={**body, "max_tokens": 5, "stream": True,
                                                  "stream_options": {"include_usage": False}}))
    assert plain[-1]["choices"][0]["finish_reason"] == "length" and plain[-1]["usage"]["completion_tokens"] == 5


def test_the_sdk_reads_include_usage_streams(mlxrt_client):
    client = openai_client(mlxrt_client)
    chunks = list(client.chat.completions.create(model="m", messages=MSG, max_tokens=4, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    chunks = list(client.completions.create(model="m", prompt=PROMPT, max_tokens=4, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4


BAD = [
    (b"{not json", "invalid JSON body"),
    (b"[1]", "Request should be a JSON dictionary"),
    (b"{}", "Request did not contain a prompt"),
    (b'{"prompt": null}', "Request did not contain a prompt"),
    (b'{"prompt": ""}', "prompt (a non-empty string) is required (token-array prompts are not accepted, "
                        "matching mlx_lm.server)"),
    (b'{"prompt": [1, 2, 3]}', "prompt (a non-empty string) is required"),
    (b'{"prompt": ["a", "b"]}', "prompt (a non-empty string) is required"),
    (b'{"prompt": 5}', "prompt (a non-empty string) is required"),
    (b'{"prompt": "x", "max_tokens": 0}', "max_tokens must be at least 1"),
    (b'{"prompt": "x", "temperature": "hot"}', "temperature must be of type ('float', 'int')"),
    (b'{"prompt": "x", "stream": 1}', "stream must be of type bool"),
    (b'{"prompt": "x", "stop": [1]}', "stop must be a string or a list of strings"),
    (b'{"prompt": "x", "logprobs": 5}', "logprobs must be of type bool"),
    (b'{"prompt": "x", "top_logprobs": 12}', "top_logprobs must be at most 11"),
    (b'{"prompt": "x", "logit_bias": {"x": 1}}', "logit_bias must be a dict of int to float"),
    (b'{"prompt": "x", "n": 0}', "n must be at least 1"),
    (b'{"prompt": "x", "n": 1.5}', "n must be of type int"),
    (b'{"prompt": "x", "n": "2"}', "n must be of type int"),
    (b'{"prompt": "x", "n": 1000000000}', "n must be at most "),
    (b'{"prompt": "x", "n": 129}', "n must be at most "),
    (b'{"prompt": "x", "echo": true}', "echo is not supported by this server yet"),
    (b'{"prompt": "x", "suffix": "end"}', "suffix is not supported by this server yet"),
    (b'{"prompt": "x", "best_of": 3}', "best_of is not supported by this server yet"),
    (b'{"prompt": "x", "stream_options": {"include_usage": "yes"}}',
     "stream_options.include_usage must be of type bool"),
    (b'{"prompt": "x", "stream_options": 1}', "stream_options must be of type dict"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_bad_input_is_a_400_and_the_server_keeps_serving(mlxrt_client, body, message):
    resp = mlxrt_client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["message"].startswith(message)
    assert set(error) == {"message", "type", "param", "code"}
    assert mlxrt_client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_sdk_raises_bad_request(mlxrt_client):
    with pytest.raises(openai.BadRequestError, match="token-array prompts are not accepted"):
        openai_client(mlxrt_client).completions.create(model="m", prompt=[1, 2, 3], max_tokens=2)


def test_completions_is_in_the_index_and_schema(mlxrt_client):
    assert "POST /v1/completions" in mlxrt_client.get("/v1").json()["endpoints"]
    assert "/v1/completions" in mlxrt_client.get("/schema/openapi.json").json()["paths"]
