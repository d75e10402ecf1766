"""llama-server's request fields and helper endpoints on mlxrt (docs/dialects.md, "llama.cpp
and vLLM fields"): ``grammar`` (GBNF), ``json_schema``, ``response_format`` ``json_object`` with a
``schema``, ``continue_final_message`` / ``add_generation_prompt``, ``verbose``; ``/tokenize``,
``/detokenize``, ``/apply-template``, ``/v1/chat/completions/input_tokens``; and a
``--chat-template`` that renders tools itself.

Tiny random checkpoints write garbage unless a grammar holds them, so every matching answer
here is the constraint's doing.
"""

from __future__ import annotations

import json
import re

import openai
import pytest
from support import openai_client

MSG = [{"role": "user", "content": "Say something."}]


@pytest.fixture
def client(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"))


def _chat(client, **extra):
    return openai_client(client).chat.completions.create(model="any", messages=extra.pop("messages", MSG),
                                                         max_tokens=extra.pop("max_tokens", 12), temperature=1.0,
                                                         seed=extra.pop("seed", 0), extra_body=extra)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_gbnf_grammar_holds_the_answer(client, seed):
    out = _chat(client, grammar='root ::= "a"{3,3} ("b" | "c")', seed=seed)
    assert re.fullmatch("aaa[bc]", out.choices[0].message.content)
    assert out.choices[0].finish_reason == "stop"


def test_the_grammar_holds_a_text_completion_too(client):
    out = openai_client(client).completions.create(model="any", prompt="x", max_tokens=8, temperature=1.0,
                                                   extra_body={"grammar": 'root ::= [0-9] [0-9]'})
    assert re.fullmatch("[0-9]{2}", out.choices[0].text)


@pytest.mark.parametrize("extra", [
    {"json_schema": {"const": "42"}},
    {"response_format": {"type": "json_object", "schema": {"const": "42"}}},
])
def test_llama_json_schema_shorthands(client, extra):
    assert json.loads(_chat(client, **extra).choices[0].message.content) == "42"


@pytest.mark.parametrize("extra,param", [
    ({"grammar": "root ::= this is (not valid GBNF"}, "grammar"),
    ({"grammar": "   "}, "grammar"),
    ({"grammar": 5}, "grammar"),
    ({"json_schema": {"type": "hiccup"}}, "json_schema"),
    ({"json_schema": "x"}, "json_schema"),
    ({"response_format": {"type": "json_object", "schema": 123}}, "response_format"),
    ({"grammar": 'root ::= "a"', "json_schema": {"const": 1}}, "grammar"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar"),
])
def test_bad_constraints_are_400s_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, **extra)
    assert err.value.body["param"].split(".")[0] == param, err.value.body


def _prompt(client, **body):
    resp = client.post("/apply-template", json={"messages": MSG, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()["prompt"]


def test_continue_final_message_continues_the_last_message(client):
    prefill = [*MSG, {"role": "assistant", "content": "Whill"}]
    continued = _prompt(client, messages=prefill, continue_final_message=True)
    closed = _prompt(client, messages=prefill)
    assert continued.endswith("Whill") and closed.rstrip().endswith("<|im_start|>assistant")
    assert closed.startswith(continued)
    bare = _prompt(client, add_generation_prompt=False)
    assert _prompt(client).startswith(bare) and not bare.rstrip().endswith("<|im_start|>assistant")
    # the answer continues the prefill: its prompt is the continued one
    out = _chat(client, messages=prefill, continue_final_message=True, add_generation_prompt=False, verbose=True,
                max_tokens=2)
    assert out.model_extra["__verbose"]["prompt"] == continued


@pytest.mark.parametrize("extra", [
    {"continue_final_message": True, "add_generation_prompt": True},
    {"continue_final_message": True, "messages": [*MSG, {"role": "assistant", "content": ""}]},
    {"continue_final_message": "yes"},
])
def test_bad_continuations_are_400s(client, extra):
    extra.setdefault("messages", [*MSG, {"role": "assistant", "content": "Hi"}])
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, **extra)
    assert err.value.body["param"] == "continue_final_message"


def test_verbose_returns_the_rendered_prompt_only_when_asked(client):
    out = _chat(client, verbose=True, max_tokens=2)
    assert out.model_extra["__verbose"]["prompt"] == _prompt(client)
    assert "__verbose" not in (_chat(client, verbose=False, max_tokens=2).model_extra or {})


def test_input_tokens_counts_the_prompt_a_chat_runs_with(client):
    counted = client.post("/v1/chat/completions/input_tokens", json={"messages": MSG}).json()["input_tokens"]
    assert counted == _chat(client, max_tokens=1).usage.prompt_tokens
    assert client.post("/chat/completions/input_tokens", json={"messages": []}).status_code == 400


def test_tokenize_and_detokenize_round_trip(client):
    ids = client.post("/tokenize", json={"content": "hello world"}).json()["tokens"]
    assert ids and all(isinstance(i, int) for i in ids)
    pieces = client.post("/tokenize", json={"content": "hello world", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids and "".join(p["piece"] for p in pieces) == "hello world"
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"content": "hello world"}
    for path, body in [("/tokenize", {}), ("/tokenize", {"content": 5}), ("/detokenize", {"tokens": [-1]}),
                       ("/detokenize", {"tokens": [10 ** 9]}), ("/detokenize", {"tokens": "ab"})]:
        resp = client.post(path, json=body)
        assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error", (path, body)


def test_logit_bias_from_tokenize_ids_bans_those_tokens(client):
    (x,) = client.post("/tokenize", json={"content": "x"}).json()["tokens"]  # the one token writing "x"
    free = {_chat(client, grammar='root ::= "x" | "y"', seed=seed).choices[0].message.content for seed in range(6)}
    assert free == {"x", "y"}  # these seeds pick both: the bias below is what rules "x" out
    for seed in range(6):
        banned = _chat(client, grammar='root ::= "x" | "y"', logit_bias={str(x): -100}, seed=seed)
        assert banned.choices[0].message.content == "y"


def test_a_chat_template_that_renders_tools_takes_over_from_the_generic_tool_prompt(mlxrt_tiny_checkpoint, mlxrt_serve):
    from mlxrt.testing._tokenizer_factory import CHAT_TEMPLATES

    tools = [{"type": "function", "function": {"name": "list_files", "parameters": {"type": "object"}}}]
    loop = [{"role": "user", "content": "Fix the bug"},
            {"role": "assistant", "content": "", "reasoning_content": "Check the tree first.",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "list_files", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "main.py"}]
    plain = mlxrt_serve(mlxrt_tiny_checkpoint("llama"))  # SmolLM2's template: no tools, no reasoning
    assert "Check the tree first." not in _prompt(plain, messages=loop, tools=tools)
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"chat_template": CHAT_TEMPLATES["qwen3"]})
    prompt = _prompt(client, messages=loop, tools=tools)
    assert "<tools>" in prompt and "<think>\nCheck the tree first.\n</think>" in prompt


def test_ignore_eos_generates_past_the_end_of_sequence_to_max_tokens(client):
    # llama-server's and vLLM's ignore_eos: the end-of-sequence ids are banned, so an answer runs
    # to max_tokens (a benchmark's fixed length). A logit bias makes the model end at once first.
    oai = openai_client(client)
    (eos_id,) = client.post("/tokenize", json={"content": "<|im_end|>"}).json()["tokens"]
    ends = oai.completions.create(model="m", prompt="Once upon", max_tokens=12, temperature=0,
                                  logit_bias={str(eos_id): 100})
    assert ends.choices[0].finish_reason == "stop" and ends.usage.completion_tokens <= 1
    goes_on = oai.completions.create(model="m", prompt="Once upon", max_tokens=12, temperature=0,
                                     logit_bias={str(eos_id): 100}, extra_body={"ignore_eos": True})
    assert goes_on.choices[0].finish_reason == "length" and goes_on.usage.completion_tokens == 12
    chat = _chat(client, max_tokens=12, logit_bias={str(eos_id): 100}, ignore_eos=True)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 12
    assert "x-mlxrt-ignored" not in client.post("/v1/completions", json={
        "prompt": "Once upon", "max_tokens": 1, "ignore_eos": True}).headers
    bad = client.post("/v1/completions", json={"prompt": "Once upon", "ignore_eos": "yes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "ignore_eos"
