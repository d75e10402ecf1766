"""logprobs / top_logprobs in OpenAI's shape, and stop strings matched on decoded text,
through the official openai client (chat and text completions, sync and streaming).

A scripted sampler (a plugin claiming the ``script`` field) makes the random tiny model
"write" a chosen text, so stop strings inside and across tokens are checked exactly.
"""

from __future__ import annotations

import json

import pytest
from support import Scripted, openai_client
from tokenizers import Tokenizer

from mlxrt import hookimpl
from mlxrt.assembly import LogprobTrail
from mlxrt.records import FinishEvent, FinishReason, TokenEvent

MSG = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture
def scripted(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("scripted", Scripted())])


def _ids(entries):
    return [e.model_extra["id"] for e in entries]


# -- the shape and the invariants ------------------------------------------------------------------


def test_entries_concatenate_to_the_content_and_greedy_is_top_one(mlxrt_client):
    out = openai_client(mlxrt_client).chat.completions.create(
        model="m", messages=MSG, max_tokens=16, temperature=0, logprobs=True, top_logprobs=5)
    choice = out.choices[0]
    entries = choice.logprobs.content
    assert "".join(e.token for e in entries) == choice.message.content
    assert len(entries) == out.usage.completion_tokens  # no EOS at max_tokens
    for e in entries:
        assert bytes(e.bytes).decode() == e.token
        assert len(e.top_logprobs) == 5
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
        best = e.top_logprobs[0]
        assert best.model_extra["id"] == e.model_extra["id"] and best.logprob == pytest.approx(e.logprob)
        assert e.logprob <= 0


def test_logprobs_alone_has_empty_top_lists_and_off_is_null(mlxrt_client):
    client = openai_client(mlxrt_client)
    out = client.chat.completions.create(model="m", messages=MSG, max_tokens=4, temperature=0, logprobs=True)
    assert [e.top_logprobs for e in out.choices[0].logprobs.content] == [[]] * 4
    assert client.chat.completions.create(model="m", messages=MSG, max_tokens=4).choices[0].logprobs is None
    raw = mlxrt_client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 3, "top_logprobs": 2})
    assert len(raw.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2  # as mlx_lm.server


def test_logprobs_describe_the_emitted_token_when_sampling(mlxrt_client):
    out = openai_client(mlxrt_client).chat.completions.create(
        model="m", messages=MSG, max_tokens=16, temperature=1.5, seed=5, logprobs=True, top_logprobs=11)
    entries = out.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == out.choices[0].message.content
    # Some sampled token is not the likeliest one: its own logprob is reported, not top[0]'s.
    assert any(e.model_extra["id"] != e.top_logprobs[0].model_extra["id"] for e in entries)
    for e in entries:
        if e.model_extra["id"] in _ids(e.top_logprobs):
            match = e.top_logprobs[_ids(e.top_logprobs).index(e.model_extra["id"])]
            assert match.logprob == pytest.approx(e.logprob)
        else:
            assert e.logprob <= e.top_logprobs[-1].logprob


def test_logprobs_are_the_distribution_after_logits_processors(mlxrt_tiny_checkpoint, mlxrt_client):
    dog = Tokenizer.from_file(str(mlxrt_tiny_checkpoint("qwen3") / "tokenizer.json")).encode("dog").ids[0]
    out = openai_client(mlxrt_client).chat.completions.create(
        model="m", messages=MSG, max_tokens=3, temperature=0, logprobs=True, logit_bias={str(dog): 100})
    assert all(e.token == "dog" and e.logprob > -1e-3 for e in out.choices[0].logprobs.content)


def test_stream_chunks_carry_the_entries_of_their_text(mlxrt_client):
    client = openai_client(mlxrt_client)
    whole = client.chat.completions.create(model="m", messages=MSG, max_tokens=16, temperature=0,
                                           logprobs=True, top_logprobs=2)
    chunks = list(client.chat.completions.create(model="m", messages=MSG, max_tokens=16, temperature=0,
                                                 logprobs=True, top_logprobs=2, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole.choices[0].logprobs.content]
    for c in chunks:
        if c.choices and c.choices[0].logprobs and c.choices[0].delta.content:
            assert "".join(e.token for e in c.choices[0].logprobs.content) == c.choices[0].delta.content


def test_completions_logprobs_have_both_shapes(mlxrt_client):
    client = openai_client(mlxrt_client)
    out = client.completions.create(model="m", prompt="Once upon a time", max_tokens=8, temperature=0,
                                    extra_body={"logprobs": True, "top_logprobs": 3})
    lp = out.choices[0].logprobs
    content = lp.model_extra["content"]
    assert "".join(e["token"] for e in content) == out.choices[0].text == "".join(lp.tokens)
    assert lp.token_logprobs == [e["logprob"] for e in content]
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(top) <= 3 for top in lp.top_logprobs)
    streamed = list(client.completions.create(model="m", prompt="Once upon a time", max_tokens=8, temperature=0,
                                              stream=True, extra_body={"logprobs": True}))
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert "".join(tokens) == out.choices[0].text


def test_reasoning_tokens_are_in_logprobs_too(mlxrt_tiny_checkpoint, mlxrt_serve):
    from mlxrt import ThinkingFormat

    class Reasoner:
        @hookimpl
        def mlxrt_thinking_format(self, info):
            return ThinkingFormat(open="<r>", close="</r>")

    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("scripted", Scripted()), ("reasoner", Reasoner())])
    body = {"messages": MSG, "script": "<r>because</r>the answer", "logprobs": True}
    out = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert out["message"] == {"role": "assistant", "content": "the answer", "reasoning": "because",
                       "reasoning_content": "because"}
    assert "".join(e["token"] for e in out["logprobs"]["content"]) == "<r>because</r>the answer"


LOGPROB_BAD = [
    ({"logprobs": 1}, "logprobs must be of type bool"),
    ({"logprobs": "true"}, "logprobs must be of type bool"),
    ({"top_logprobs": 1.5}, "top_logprobs must be of type int"),
    ({"top_logprobs": True}, "top_logprobs must be of type int"),
    ({"top_logprobs": -2}, "top_logprobs must be at least 0"),
    ({"top_logprobs": 12}, "top_logprobs must be at most 11"),
]


@pytest.mark.parametrize(("fields", "message"), LOGPROB_BAD)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bad_logprob_fields_exact_texts(mlxrt_client, fields, message, path):
    body = {"messages": MSG} if "chat" in path else {"prompt": "Once"}
    resp = mlxrt_client.post(path, json={**body, "max_tokens": 2, **fields})
    assert resp.status_code == 400 and resp.json()["error"]["message"] == message
    assert mlxrt_client.post(path, json={**body, "max_tokens": 2, "top_logprobs": -1}).status_code == 200


# -- the trail, unit-level ------------------------------------------------------------------------


def _ev(piece, text):
    return TokenEvent(token=0, text=text, logprob=-1.0, piece=piece)


def test_trail_holds_entries_with_their_text_and_trims_at_a_stop():
    trail = LogprobTrail()
    assert [e.piece for e in trail.feed(_ev("the", "the"))] == ["the"]
    assert trail.feed(_ev(" dog", " d")) == []  # "og" held as a possible stop start
    assert trail.feed(_ev(" b", "")) == []
    out = trail.finish(FinishEvent(finish_reason=FinishReason.STOP, prompt_tokens=1, completion_tokens=3))
    assert [e.piece for e in out] == [" d"]  # trimmed; the token wholly inside the stop is dropped


def test_trail_releases_held_entries_on_a_false_start():
    trail = LogprobTrail()
    assert trail.feed(_ev(" dog", " ")) == []
    assert [e.piece for e in trail.feed(_ev(" b", "dog b"))] == [" dog", " b"]
    assert trail.feed(TokenEvent(token=1, text="x")) == []  # no logprobs asked for


# -- stop strings (decoded text, inside tokens, never leaked) -------------------------------------

SCRIPT = "the dog barks"  # tokens: the | Ġdog | Ġb | ar | k | s


def _stream_text(client, path, body):
    resp = client.post(path, json={**body, "stream": True})
    frames = [json.loads(f[6:]) for f in resp.text.split("\n\n") if f.startswith("data: {")]
    key = "delta" if "chat" in path else None
    parts = [(c["choices"][0]["delta"].get("content") or "") if key else c["choices"][0]["text"]
             for c in frames if c["choices"]]
    return parts, frames


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stop_inside_a_token_stops_there(scripted, path):
    body = {"messages": MSG} if "chat" in path else {"prompt": "x"}
    body = {**body, "script": SCRIPT, "stop": ["og b"], "logprobs": True}
    out = scripted.post(path, json=body).json()["choices"][0]
    text = out["message"]["content"] if "chat" in path else out["text"]
    assert text == "the d" and out["finish_reason"] == "stop"
    assert "".join(e["token"] for e in out["logprobs"]["content"]) == "the d"
    parts, frames = _stream_text(scripted, path, body)
    assert "".join(parts) == "the d"
    entries = [e for f in frames if f["choices"] and f["choices"][0]["logprobs"]
               for e in f["choices"][0]["logprobs"]["content"]]
    assert "".join(e["token"] for e in entries) == "the d"  # the stop leaks through logprobs neither
    assert bytes(b for e in entries for b in e["bytes"]) == b"the d"
    assert frames[-1]["choices"][0]["finish_reason"] == "stop"


def test_stop_is_excluded_and_generation_ends(scripted):
    out = openai_client(scripted).chat.completions.create(
        model="m", messages=MSG, stop="bark", extra_body={"script": SCRIPT + " and then more words"})
    assert out.choices[0].message.content == "the dog " and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens <= 5  # stopped at "bark", not after the 10-token script


def test_partial_match_is_held_back_then_released_on_a_false_start(scripted):
    parts, _ = _stream_text(scripted, "/v1/chat/completions",
                            {"messages": MSG, "script": SCRIPT, "stop": ["dog!", "barn"]})
    assert "".join(parts) == SCRIPT
    assert any(p.startswith("dog") for p in parts)  # " dog" waited for " b" to rule out "dog!"
    assert not any(p.endswith("d") for p in parts)


def test_earliest_of_several_stops_wins_and_more_than_four_are_accepted(scripted):
    stops = ["zzz", "yyy", "xxx", "www", "ks", "dog"]
    out = openai_client(scripted).chat.completions.create(model="m", messages=MSG, stop=stops,
                                                          extra_body={"script": SCRIPT})
    assert out.choices[0].message.content == "the "


def test_stop_via_the_sdk_stream_never_leaks(scripted):
    chunks = list(openai_client(scripted).chat.completions.create(
        model="m", messages=MSG, stop=["arks"], stream=True, extra_body={"script": SCRIPT}))
    text = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert text == "the dog b"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
