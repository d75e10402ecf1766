"""The OpenAI Responses dialect through the official openai client (in-process app)."""

from __future__ import annotations

import json

import openai
import pytest
from support import Scripted, openai_client

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def scripted(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("scripted", Scripted())])


def events_of(text: str) -> list[dict]:
    out = []
    for raw in filter(None, text.split("\n\n")):
        event_line, data_line = raw.split("\n")
        data = json.loads(data_line[len("data: "):])
        assert event_line == f"event: {data['type']}"
        out.append(data)
    return out


def test_non_stream_shape(mlxrt_client):
    out = openai_client(mlxrt_client).responses.create(model="m", input="Tell me about the sea.",
                                                       max_output_tokens=12, temperature=0)
    assert out.object == "response" and out.id.startswith("resp_") and out.model == "qwen3-0-gen"
    assert out.status in ("completed", "incomplete")
    assert out.usage.output_tokens <= 12 and out.usage.input_tokens > 5
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    assert out.output[-1].type == "message"


def test_incomplete_at_max_output_tokens(mlxrt_client):
    out = openai_client(mlxrt_client).responses.create(model="m", input="hi", max_output_tokens=1)
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"


def test_stream_events_and_sequence_numbers(scripted):
    resp = scripted.post("/v1/responses", json={"input": "hi", "stream": True,
                                                "script": "<think>hmm</think>the answer"})
    assert resp.status_code == 200
    events = events_of(resp.text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "response.reasoning_text.delta" in types
    text_at = types.index("response.output_text.delta")
    assert types[text_at - 2: text_at] == ["response.output_item.added", "response.content_part.added"]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][1]["content"][0]["text"] == "the answer"
    # The SDK's stream helper accepts the same stream.
    client = openai_client(scripted)
    with client.responses.stream(model="m", input="hi", extra_body={"script": "plain words"}) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "plain words" == final.output_text


def test_stream_text_equals_non_stream_text(mlxrt_client):
    client = openai_client(mlxrt_client)
    whole = client.responses.create(model="m", input="Tell me about the sea.", max_output_tokens=16, temperature=0)
    stream = client.responses.create(model="m", input="Tell me about the sea.", max_output_tokens=16,
                                     temperature=0, stream=True)
    done = [e for e in stream if e.type in ("response.completed", "response.incomplete")]
    assert done[0].response.output_text == whole.output_text


def test_two_turns_through_previous_response_id(scripted):
    client = openai_client(scripted)
    first = client.responses.create(model="m", instructions="Be brief.", input="My name is Ada.",
                                    extra_body={"script": "Hello Ada."})
    second = client.responses.create(model="m", instructions="Be brief.", previous_response_id=first.id,
                                     input="What is my name?", extra_body={"script": "Ada."})
    assert second.previous_response_id == first.id and second.output_text == "Ada."
    # The resumed prompt starts with the first turn's prompt and answer: the prompt cache serves it.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 2
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def test_function_call_round_trip(scripted):
    client = openai_client(scripted)
    out = client.responses.create(model="m", input="Weather in Paris?", tools=TOOLS,
                                  extra_body={"script": CALL})
    (call,) = [i for i in out.output if i.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    follow = client.responses.create(model="m", previous_response_id=out.id, tools=TOOLS, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}],
        extra_body={"script": "It is 21 C."})
    assert follow.output_text == "It is 21 C."
    # The same through the stream: arguments arrive in function_call_arguments events.
    resp = scripted.post("/v1/responses", json={"input": "Weather?", "tools": TOOLS, "stream": True,
                                                "script": CALL})
    events = events_of(resp.text)
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0]["arguments"]) == {"city": "Paris"}
    # Full history sent by the client (no store) works too.
    manual = client.responses.create(model="m", store=False, tools=TOOLS, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": "get_weather", "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}],
        extra_body={"script": "Warm."})
    assert manual.output_text == "Warm."
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(manual.id)


def test_tool_choice_required_forces_a_call_opening(mlxrt_client):
    out = openai_client(mlxrt_client).responses.create(
        model="m", input="Weather?", tools=TOOLS, tool_choice="required", max_output_tokens=40, temperature=0)
    calls = [i for i in out.output if i.type == "function_call"]
    # The random model cannot be relied on to close the JSON; the opening is forced either way.
    assert (calls and calls[0].name == "get_weather") or out.output_text.startswith(
        '<tool_call>\n{"name": "get_weather"')


def test_retrieve_and_delete(scripted):
    client = openai_client(scripted)
    out = client.responses.create(model="m", input="hi", extra_body={"script": "hello"})
    assert client.responses.retrieve(out.id).output_text == "hello"
    client.responses.delete(out.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(out.id)
    gone = scripted.delete(f"/v1/responses/{out.id}")
    assert gone.status_code == 404 and set(gone.json()["error"]) == {"message", "type", "param", "code"}


def test_unknown_previous_response_is_a_404(mlxrt_client):
    resp = mlxrt_client.post("/v1/responses", json={"input": "hi", "previous_response_id": "resp_nope"})
    assert resp.status_code == 404
    error = resp.json()["error"]
    assert error["param"] == "previous_response_id" and error["code"] == "previous_response_not_found"


def test_store_ttl_and_byte_cap():
    from mlxrt.plugins.responses.store import ResponseStore

    now = [0.0]
    store = ResponseStore(ttl_s=10, max_bytes=150, clock=lambda: now[0])
    store.put("a", (), {"x": "a" * 50})
    store.put("b", (), {"x": "b" * 50})
    assert store.get("a") is not None  # a is now the most recently used
    store.put("c", (), {"x": "c" * 50})
    assert store.get("b") is None and store.get("a") is not None and store.stats()["evicted"] == 1
    now[0] = 11
    assert store.get("a") is None and store.stats()["entries"] == 0


def test_store_options_reach_the_store(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("scripted", Scripted())],
                       options={"response_store_bytes": 1})
    oai = openai_client(client)
    first = oai.responses.create(model="m", input="hi", extra_body={"script": "one"})
    second = oai.responses.create(model="m", input="hi", extra_body={"script": "two"})
    assert oai.responses.retrieve(second.id).output_text == "two"
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(first.id)  # over the byte cap: the least recently used went
    assert client.app.state.host.plugin_states["responses"].stats()["evicted"] == 1
    assert client.get("/stats").json()["responses"]["evicted"] == 1  # the store reports in /stats


BAD = [
    ({}, "input is required"),
    ({"input": 5}, "input must be of type ('str', 'list')"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens must be at least 1"),
    ({"input": "x", "stream": "yes"}, "stream must be of type bool"),
    ({"input": [{"type": "mystery"}]}, "input[0].type 'mystery' is not supported"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role must be one of"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice must be"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type must be one of"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]},
     "input[0].arguments is not valid JSON"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_bad_input_is_an_openai_400(mlxrt_client, body, message):
    resp = mlxrt_client.post("/v1/responses", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"].startswith(message)


def test_an_error_mid_stream_is_the_next_numbered_event(mlxrt_tiny_checkpoint, mlxrt_serve):
    """The stream catches its own errors: the ``error`` event carries the next sequence number."""
    from support import Exploding

    http = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("exploding", Exploding())])
    resp = http.post("/v1/responses", json={"input": "hi", "stream": True, "max_output_tokens": 8,
                                            "temperature": 0, "explode": 3})
    events = events_of(resp.text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "error" and "exploded" in events[-1]["message"], events[-1]
    assert "response.output_text.delta" in [e["type"] for e in events]  # mid-stream, not at its start
