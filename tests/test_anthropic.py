"""The Anthropic Messages dialect through the official anthropic client (in-process app)."""

from __future__ import annotations

import json
import uuid

import anthropic
import pytest
from support import Scripted, anthropic_client

MSG = [{"role": "user", "content": "Tell me about the sea."}]
TOOLS = [{"name": "get_weather", "description": "Weather for a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def client_for(http_client) -> anthropic.Anthropic:
    return anthropic_client(http_client)


@pytest.fixture
def scripted(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("scripted", Scripted())])


def frames(text: str) -> list[tuple[str, dict]]:
    out = []
    for raw in text.split("\n\n"):
        if not raw:
            continue
        event_line, data_line = raw.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        event, data = event_line[7:], json.loads(data_line[6:])
        assert data["type"] == event
        out.append((event, data))
    return out


def test_non_stream_shape(mlxrt_client):
    out = client_for(mlxrt_client).messages.create(model="claude-x", max_tokens=12, messages=MSG, extra_body={"temperature": 0})
    assert out.type == "message" and out.role == "assistant" and out.id.startswith("msg_")
    assert out.model == "qwen3-0-gen"
    assert out.stop_reason in ("end_turn", "max_tokens")
    assert 0 < out.usage.output_tokens <= 12 and out.usage.input_tokens > 5
    assert out.usage.cache_read_input_tokens == 0
    assert all(b.type in ("text", "thinking") for b in out.content)


def test_stream_event_grammar(mlxrt_client):
    resp = mlxrt_client.post("/v1/messages", json={"messages": MSG, "max_tokens": 10, "temperature": 0,
                                                   "stream": True}, headers={"anthropic-version": "2023-06-01"})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = frames(resp.text)
    names = [e for e, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 5
    # Blocks: start → deltas → stop, indexed 0, 1 … in order, never interleaved.
    open_index, next_index = None, 0
    for name, data in events[2:-2]:
        if name == "content_block_start":
            assert open_index is None and data["index"] == next_index
            open_index, next_index = data["index"], next_index + 1
        elif name == "content_block_delta":
            assert data["index"] == open_index
        else:
            assert name == "content_block_stop" and data["index"] == open_index
            open_index = None
    assert open_index is None and next_index >= 1
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens") and delta["usage"]["output_tokens"] <= 10


def test_stream_text_equals_non_stream_text(mlxrt_client):
    client = client_for(mlxrt_client)
    whole = client.messages.create(model="m", max_tokens=16, messages=MSG, extra_body={"temperature": 0})
    with client.messages.stream(model="m", max_tokens=16, messages=MSG, extra_body={"temperature": 0}) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_stop_reasons(mlxrt_client, scripted):
    client = client_for(mlxrt_client)
    assert client.messages.create(model="m", max_tokens=1, messages=MSG).stop_reason == "max_tokens"
    full = client.messages.create(model="m", max_tokens=16, messages=MSG, extra_body={"temperature": 0})
    text = "".join(b.text for b in full.content if b.type == "text") or "".join(
        b.thinking for b in full.content if b.type == "thinking")
    ended = client_for(scripted).messages.create(model="m", max_tokens=20, messages=MSG,
                                                 extra_body={"script": "plain answer"})
    assert ended.stop_reason == "end_turn" and ended.stop_sequence is None
    assert [b.text for b in ended.content] == ["plain answer"]
    cut = client_for(scripted).messages.create(model="m", max_tokens=20, messages=MSG, stop_sequences=["ans"],
                                               extra_body={"script": "plain answer"})
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == "ans"
    assert [b.text for b in cut.content] == ["plain "]
    assert text  # the random model says something


def test_thinking_blocks(scripted):
    client = client_for(scripted)
    out = client.messages.create(model="m", max_tokens=30, messages=MSG, thinking={"type": "enabled",
                                                                                   "budget_tokens": 1024},
                                 extra_body={"script": "<think>hmm</think>the answer"})
    assert [b.type for b in out.content] == ["thinking", "text"]
    assert out.content[0].thinking == "hmm" and out.content[1].text == "the answer"
    resp = scripted.post("/v1/messages", json={"messages": MSG, "max_tokens": 30, "stream": True,
                                               "script": "<think>hmm</think>the answer"})
    deltas = [d["delta"]["type"] for e, d in frames(resp.text) if e == "content_block_delta"]
    assert deltas[0] == "thinking_delta" and "signature_delta" in deltas and deltas[-1] == "text_delta"
    with client.messages.stream(model="m", max_tokens=30, messages=MSG,
                                extra_body={"script": "<think>hmm</think>the answer"}) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]


def test_tool_use_round_trip(scripted):
    client = client_for(scripted)
    out = client.messages.create(model="m", max_tokens=60, messages=[{"role": "user", "content": "Paris?"}],
                                 tools=TOOLS, extra_body={"script": "Let me check." + CALL})
    assert out.stop_reason == "tool_use"
    text, call = out.content
    assert text.type == "text" and text.text == "Let me check."
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"}
    assert call.id.startswith("toolu_")
    follow = client.messages.create(model="m", max_tokens=20, tools=TOOLS, messages=[
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in out.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "21 C"}]},
    ], extra_body={"script": "It is 21 C."})
    assert follow.stop_reason == "end_turn" and follow.content[0].text == "It is 21 C."
    assert follow.usage.input_tokens + follow.usage.cache_read_input_tokens > out.usage.input_tokens
    # Streamed: the call arrives as a tool_use block with one input_json_delta.
    with client.messages.stream(model="m", max_tokens=60, messages=[{"role": "user", "content": "Paris?"}],
                                tools=TOOLS, extra_body={"script": CALL}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].input == {"city": "Paris"}
    # tool_choice none: the same markup is plain text.
    none = client.messages.create(model="m", max_tokens=60, messages=[{"role": "user", "content": "Paris?"}],
                                  tools=TOOLS, tool_choice={"type": "none"}, extra_body={"script": CALL})
    assert none.stop_reason == "end_turn" and none.content[0].text.startswith("<tool_call>")


def test_tool_choice_tool_forces_a_call_opening(mlxrt_client):
    raw = client_for(mlxrt_client).messages.with_raw_response.create(
        model="m", max_tokens=40, messages=[{"role": "user", "content": "Paris?"}], tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    out = raw.parse()
    # The random model cannot be relied on to close the JSON; the opening is forced either way:
    # a whole call, or a call cut by max_tokens (dropped, said in a header, no markup shown).
    if out.stop_reason == "tool_use":
        assert out.content[-1].name == "get_weather"
    else:
        assert out.stop_reason == "max_tokens" and raw.headers.get("x-mlxrt-partial-tool-call") == "dropped"
        assert not any("<tool_call>" in getattr(block, "text", "") for block in out.content)


def test_count_tokens_matches_the_prompt(mlxrt_client):
    client = client_for(mlxrt_client)
    counted = client.messages.count_tokens(model="m", messages=MSG, system="Be brief.", tools=TOOLS)
    ran = client.messages.create(model="m", max_tokens=1, messages=MSG, system="Be brief.", tools=TOOLS)
    assert counted.input_tokens == ran.usage.input_tokens + ran.usage.cache_read_input_tokens
    assert client.messages.count_tokens(model="m", messages=MSG).input_tokens < counted.input_tokens


def _claude_code_body(cch: str, messages: list[dict]) -> dict:
    system = [
        {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.177.{cch[:3]}; cc_entrypoint=cli; "
                                 f"cch={cch};"},
        {"type": "text", "text": "You are Claude Code, an interactive CLI tool. " * 30,
         "cache_control": {"type": "ephemeral"}},
    ]
    return {"model": "claude-sonnet-4-5", "max_tokens": 4, "system": system, "tools": TOOLS,
            "messages": messages, "metadata": {"user_id": "u1"}, "temperature": 0}


def test_claude_code_billing_header_keeps_the_prompt_cache(mlxrt_client):
    turn1 = [{"role": "user", "content": [{"type": "text", "text": "List the files."}]}]
    first = mlxrt_client.post("/v1/messages", json=_claude_code_body(uuid.uuid4().hex[:5], turn1))
    assert first.status_code == 200, first.text
    body1 = first.json()
    prompt1 = body1["usage"]["input_tokens"] + body1["usage"]["cache_read_input_tokens"]
    turn2 = [*turn1, {"role": "assistant", "content": body1["content"] or [{"type": "text", "text": "ok"}]},
             {"role": "user", "content": "Now the tests."}]
    second = mlxrt_client.post("/v1/messages", json=_claude_code_body(uuid.uuid4().hex[:5], turn2))
    assert second.status_code == 200, second.text
    usage2 = second.json()["usage"]
    assert usage2["cache_read_input_tokens"] >= 0.9 * prompt1
    assert second.headers["x-mlxrt-cache"].startswith(("hit", "partial"))
    # The canonical prompt does not depend on the header's hash at all.
    count = [mlxrt_client.post("/v1/messages/count_tokens", json=_claude_code_body(cch, turn1)).json()
             for cch in ("aaaaa", "0f3c9")]
    assert count[0] == count[1] == {"input_tokens": prompt1}


def test_billing_header_strip_is_anchored():
    from mlxrt.plugins.anthropic.canonical import strip_billing_header

    assert strip_billing_header("x-anthropic-billing-header: a; cch=1;\nYou are") == "You are"
    assert strip_billing_header("<|im_start|>system\nx-anthropic-billing-header: cch=2;\nHi") == \
        "<|im_start|>system\nHi"
    quoted = "user says x-anthropic-billing-header: keep"
    assert strip_billing_header(quoted) == quoted


BAD = [
    ({"messages": MSG}, "max_tokens: Field required"),
    ({"max_tokens": 5}, "messages: Field required"),
    ({"max_tokens": 5, "messages": []}, "messages: at least one message is required"),
    ({"max_tokens": 0, "messages": MSG}, "max_tokens must be at least 1"),
    ({"max_tokens": 5, "messages": MSG, "temperature": 1.5}, "temperature must be at most 1"),
    ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
     "messages.0.role: Input should be 'user', 'assistant' or 'system'"),
    # System entries inside messages (current Claude Code): a string or text blocks only.
    ({"max_tokens": 5, "messages": [*MSG, {"role": "system", "content": 5}]},
     "messages.1.content: a system entry's content must be a string or a list of text blocks"),
    ({"max_tokens": 5, "messages": [*MSG, {"role": "system"}]},
     "messages.1.content: a system entry's content must be a string or a list of text blocks"),
    ({"max_tokens": 5, "messages": [*MSG, {"role": "system", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]},
     "messages.1.content.0: a system entry takes text blocks only (got 'image')"),
    ({"max_tokens": 5, "messages": [*MSG, {"role": "system", "content": [{"type": "text"}]}]},
     "messages.1.content.0.text: Field required"),
    ({"max_tokens": 5, "messages": [*MSG, {"role": "system", "content": ["hi"]}]},
     "messages.1.content.0: a system entry takes text blocks only (got an object without a type)"),
    ({"max_tokens": 5, "messages": MSG, "output_config": {"effort": "extreme"}},
     "output_config.effort: Input should be 'low', 'medium', 'high' or 'max'"),
    ({"max_tokens": 5, "messages": MSG, "output_config": "high"}, "output_config must be of type dict"),
    ({"max_tokens": 5, "messages": MSG, "output_config": {"effort": {"level": 1}}},
     "output_config.effort: Input should be 'low', 'medium', 'high' or 'max'"),
    ({"max_tokens": 5, "messages": MSG, "stop_sequences": [1]}, "stop_sequences: must be a list of strings"),
    ({"max_tokens": 5, "messages": MSG, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"max_tokens": 5, "messages": MSG, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice.name: no tool named 'nope'"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages.0.content.0: the served model has no vision input"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_bad_input_is_an_anthropic_400(mlxrt_client, body, message):
    resp = mlxrt_client.post("/v1/messages", json=body)
    assert resp.status_code == 400, resp.text
    out = resp.json()
    assert set(out) == {"type", "error"} and out["type"] == "error"
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["message"].startswith(message)


def test_max_tokens_is_a_ceiling(scripted):
    """Claude Code asks for 32k tokens whatever the model; admission caps it to the context."""
    out = scripted.post("/v1/messages", json={"max_tokens": 10**8, "messages": MSG, "script": "ok"})
    assert out.status_code == 200 and out.json()["stop_reason"] == "end_turn"


def test_tool_result_images_follow_the_user_turn_rule(scripted):
    """An image a tool returned is refused on a text-only model, as in a user turn (never
    silently dropped); other block kinds become a note."""
    def ask(block):
        return scripted.post("/v1/messages", json={"max_tokens": 10, "tools": TOOLS, "script": "ok", "messages": [
            {"role": "user", "content": "Look"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "text", "text": "see"}, block]}]}]})

    image = ask({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}})
    assert image.status_code == 400, image.text
    assert image.json()["error"]["message"] == \
        "messages.2.content.0.content.1: the served model has no vision input"
    document = ask({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}})
    assert document.status_code == 200 and document.json()["content"][0]["text"] == "ok"


def test_sdk_raises_bad_request_and_invalid_json(mlxrt_client):
    with pytest.raises(anthropic.BadRequestError) as err:
        client_for(mlxrt_client).messages.create(model="m", max_tokens=0, messages=MSG)
    assert err.value.body["error"]["type"] == "invalid_request_error"
    raw = mlxrt_client.post("/v1/messages", content=b"{nope", headers={"content-type": "application/json"})
    assert raw.status_code == 400 and raw.json()["error"]["message"] == "invalid JSON body"
