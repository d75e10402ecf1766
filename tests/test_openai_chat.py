"""The OpenAI chat dialect through the official openai client (in-process app)."""

from __future__ import annotations

import json

import openai
import pytest
from conftest import shared_tokenizer
from support import openai_client

MSG = [{"role": "user", "content": "Tell me about the sea."}]


def test_non_stream_shape(mlxrt_client):
    client = openai_client(mlxrt_client)
    out = client.chat.completions.create(model="any", messages=MSG, max_tokens=12, temperature=0)
    choice = out.choices[0]
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert out.model == "qwen3-0-gen"  # the served model's id, not the request's
    assert choice.finish_reason in ("length", "stop") and choice.message.role == "assistant"
    assert out.usage.completion_tokens <= 12 and out.usage.prompt_tokens > 5
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert out.usage.prompt_tokens_details.cached_tokens == 0


def test_stream_ends_with_one_finish_chunk_then_done(mlxrt_client):
    resp = mlxrt_client.post("/v1/chat/completions", json={
        "messages": MSG, "max_tokens": 10, "temperature": 0, "stream": True})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in resp.text.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    assert frames[-1] == "data: [DONE]"
    chunks = [json.loads(f[6:]) for f in frames[:-1]]
    finishes = [c for c in chunks if c["choices"][0]["finish_reason"] is not None]
    assert len(finishes) == 1 and finishes[0] is chunks[-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["usage"]["completion_tokens"] <= 10
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}


def test_stream_text_equals_non_stream_text(mlxrt_client):
    client = openai_client(mlxrt_client)
    whole = client.chat.completions.create(model="m", messages=MSG, max_tokens=16, temperature=0)
    parts = client.chat.completions.create(model="m", messages=MSG, max_tokens=16, temperature=0, stream=True)
    text = "".join((c.choices[0].delta.content or "") for c in parts if c.choices)
    assert text == whole.choices[0].message.content


def test_same_seed_same_text(mlxrt_client):
    client = openai_client(mlxrt_client)

    def run(seed):
        return client.chat.completions.create(model="m", messages=MSG, max_tokens=16, temperature=1.0,
                                              seed=seed).choices[0].message.content

    first = run(7)
    assert run(7) == first
    assert any(run(s) != first for s in (8, 9, 10))


def test_default_seeds_differ(mlxrt_client):
    client = openai_client(mlxrt_client)
    texts = {client.chat.completions.create(model="m", messages=MSG, max_tokens=16, temperature=1.0)
             .choices[0].message.content for _ in range(4)}
    assert len(texts) > 1


def test_stop_string_stops_and_is_not_sent(mlxrt_client):
    client = openai_client(mlxrt_client)
    full = client.chat.completions.create(model="m", messages=MSG, max_tokens=16, temperature=0)
    text = full.choices[0].message.content
    assert len(text) > 4
    stop = text[2:4]
    cut = client.chat.completions.create(model="m", messages=MSG, max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


BAD_BODIES = [
    (b"{not json", "invalid JSON body"),
    (b"[1, 2]", "Request should be a JSON dictionary"),
    (b'"text"', "Request should be a JSON dictionary"),
    (b"{}", "Request did not contain messages"),
    (b'{"messages": []}', "messages must contain at least one message"),
    (b'{"messages": "hi"}', "messages must be of type list"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}', "max_tokens must be of type int"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens must be at least 1"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": -1}', "temperature must be at least 0"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
     "temperature must be of type ('float', 'int')"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}', "top_p must be at most 1"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream": "false"}', "stream must be of type bool"),
    (b'{"messages": [{"role": "user", "content": "x"}], "seed": 1.5}', "seed must be of type int"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stop": 5}', "stop must be a string or a list of strings"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stop": [1, 2]}', "stop must be a string or a list of strings"),
    (b'{"messages": [{"role": "robot", "content": "x"}]}', "messages[0].role 'robot' is not one of"),
    (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content must be a string or an array"),
    (b'{"messages": ["hi"]}', "messages[0] must be an object"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 12}', "top_logprobs must be at most 11"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', "n must be at least 1"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 1.5}', "n must be of type int"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": "2"}', "n must be of type int"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 1000000000}', "n must be at most "),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 129}', "n must be at most "),
    (b'{"messages": [{"role": "user", "content": "x"}], "logprobs": "yes"}', "logprobs must be of type bool"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": -5}', "top_logprobs must be at least 0"),
    (b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": [1]}', "logit_bias must be a dict of int to float"),
    (b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"1": "a"}}',
     "logit_bias must be a dict of int to float"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}}',
     "stream_options.include_usage must be of type bool"),
    (b'{"messages": [{"role": "user", "content": "x"}], "xtc_threshold": 1.5}', "xtc_threshold must be at most 1"),
    (b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}',
     "response_format.type must be one of"),
    (b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}',
     "tool_choice 'required' needs at least one tool in tools"),
]


@pytest.mark.parametrize(("body", "message"), BAD_BODIES)
def test_bad_input_is_a_400_and_the_server_keeps_serving(mlxrt_client, body, message):
    resp = mlxrt_client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["message"].startswith(message)
    assert set(error) == {"message", "type", "param", "code"}
    ok = mlxrt_client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2})
    assert ok.status_code == 200


def test_sdk_raises_bad_request(mlxrt_client):
    client = openai_client(mlxrt_client)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=[], max_tokens=2)
    assert "at least one message" in str(err.value)


def test_a_max_tokens_over_the_context_is_reduced_to_what_fits(mlxrt_client):
    resp = mlxrt_client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 10**8})
    assert resp.status_code == 200, resp.text
    window = mlxrt_client.get("/stats").json()["engine"]["admission"]["context_ceiling"]
    prompt = resp.json()["usage"]["prompt_tokens"]
    assert resp.headers["x-mlxrt-max-tokens"] == f"asked={10**8}; granted={window - prompt}"


def test_health_exact_bytes(mlxrt_client):
    resp = mlxrt_client.get("/health")
    assert resp.status_code == 200 and resp.content == b'{"status": "ok"}'
    assert resp.headers["content-type"].startswith("application/json")


def test_models(mlxrt_client):
    models = openai_client(mlxrt_client).models.list()
    (row,) = models.data
    assert row.id == "qwen3-0-gen"
    extra = row.model_extra
    assert extra["reasoning"] is True and extra["vision"] is False and extra["context_window"] > 0
    assert mlxrt_client.get("/v1/models/qwen3-0-gen").json()["id"] == "qwen3-0-gen"
    missing = mlxrt_client.get("/v1/models/nope")  # answered by the served model (tests/test_models.py)
    assert missing.json()["id"] == "qwen3-0-gen" and missing.headers["x-mlxrt-model-fallback"] == "nope"


def test_index_lists_registered_routes(mlxrt_client):
    index = mlxrt_client.get("/v1").json()
    assert index["name"] == "mlxrt" and index["model"] == "qwen3-0-gen"
    assert {"POST /v1/chat/completions", "GET /v1/models", "GET /health", "GET /v1"} <= set(index["endpoints"])


def test_unknown_route_is_a_json_404(mlxrt_client):
    resp = mlxrt_client.get("/v1/nothing-here")
    assert resp.status_code == 404
    assert resp.json() == {"error": {"message": "not found", "type": "not_found_error", "param": None, "code": None}}


def test_wrong_method_is_json(mlxrt_client):
    resp = mlxrt_client.get("/v1/chat/completions")
    assert resp.status_code == 405 and "error" in resp.json()


def test_openapi_schema_is_served_and_valid(mlxrt_client):
    from openapi_spec_validator import validate

    resp = mlxrt_client.get("/schema/openapi.json")
    assert resp.status_code == 200
    schema = resp.json()
    validate(schema)
    assert "/v1/chat/completions" in schema["paths"]


def test_tool_call_history_renders_through_the_template(mlxrt_tiny_checkpoint, mlxrt_serve):
    """tools + an assistant tool call + a role "tool" answer render with Qwen3's real template."""
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3", tokenizer_dir=shared_tokenizer("qwen3")))
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    ]
    oai = openai_client(client)
    with_history = oai.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=1)
    bare = oai.chat.completions.create(model="m", messages=messages[:2], tools=tools, max_tokens=1)
    without_tools = oai.chat.completions.create(model="m", messages=messages[:2], max_tokens=1)
    assert with_history.usage.prompt_tokens > bare.usage.prompt_tokens > without_tools.usage.prompt_tokens
    bad = client.post("/v1/chat/completions", json={"messages": [
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]})
    assert bad.status_code == 400 and "arguments is not valid JSON" in bad.json()["error"]["message"]
