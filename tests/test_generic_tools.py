"""Tools on a model whose chat template renders none (issue 32, item 3).

The tiny ``llama`` checkpoint's template is SmolLM2's (no tools), and no family claims it:
mlxrt renders the tools itself (mlxrt.text.generic_tools), parses the generic
``<tool_call>{json}</tool_call>`` format back, and with the ``structured`` plugin holds the
reply to text or one schema-valid call, so every ``tool_choice`` works on the generic tier.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from support import Scripted, anthropic_client, openai_client

from mlxrt import hookimpl

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                           "parameters": {"type": "object", "additionalProperties": False,
                                                          "required": ["city"], "properties": {
                                                              "city": {"enum": ["Paris", "Oslo"]},
                                                              "days": {"type": "integer", "minimum": 1,
                                                                       "maximum": 7}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {}, "additionalProperties": False}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MSG = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
def generic(mlxrt_tiny_checkpoint, mlxrt_serve):
    def start(**kw):
        return mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=(Scripted(),), **kw)

    return start


def test_the_tools_reach_the_prompt_and_the_self_test_passes(generic):
    client = generic()
    oai = openai_client(client)
    system = [{"role": "system", "content": "Be brief."}, *MSG]  # (else the template adds its own)
    bare = oai.chat.completions.create(model="m", messages=system, max_tokens=1)
    with_tools = oai.chat.completions.create(model="m", messages=system, tools=TOOLS, max_tokens=1)
    assert with_tools.usage.prompt_tokens > bare.usage.prompt_tokens + 80  # the generic tool prompt
    row = client.get("/v1/models").json()["data"][0]
    assert row["tier"] == "generic" and row["self_test"]["tools"] == "pass"
    assert row["self_test"]["tool_result"] == "pass"


def test_a_generic_call_is_parsed_in_every_dialect(generic):
    client = generic(disable=("structured",))  # the script alone writes the call
    script = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": "2"}}\n</tool_call>'
    oai = openai_client(client)
    out = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=100,
                                      extra_body={"script": script})
    (call,) = out.choices[0].message.tool_calls
    assert out.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris", "days": 2})
    assert out.choices[0].message.content.strip() == "Sure."
    msg = anthropic_client(client).messages.create(
        model="m", messages=MSG, max_tokens=100, extra_body={"script": script},
        tools=[{"name": "get_weather", "input_schema": SCHEMAS["get_weather"]}])
    assert msg.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in msg.content if b.type == "tool_use"] == [
        ("get_weather", {"city": "Paris", "days": 2})]
    resp = oai.responses.create(model="m", input="Weather in Paris?", max_output_tokens=100,
                                extra_body={"script": script},
                                tools=[{"type": "function", "name": "get_weather",
                                        "parameters": SCHEMAS["get_weather"]}])
    assert [(i.name, json.loads(i.arguments)) for i in resp.output if i.type == "function_call"] == [
        ("get_weather", {"city": "Paris", "days": 2})]


@pytest.mark.parametrize("choice", ["required", "named", "auto"])
def test_tool_choice_is_enforced_by_grammar(generic, choice):
    """The random model writes under the grammar: "required"/named always a schema-valid call;
    "auto" either text without call markup or a schema-valid call."""
    oai = openai_client(generic())
    tool_choice = {"type": "function", "function": {"name": "get_weather"}} if choice == "named" else choice
    seen_calls = 0
    for seed, stream in ((0, False), (1, True), (2, False), (3, False)):
        out = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, tool_choice=tool_choice,
                                          max_tokens=60, temperature=1.0, seed=seed, stream=stream)
        if stream:
            chunks = list(out)
            calls = [c for ch in chunks for c in (ch.choices[0].delta.tool_calls or [])]
            content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
            finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason][0]
        else:
            calls, content = out.choices[0].message.tool_calls or [], out.choices[0].message.content or ""
            finish = out.choices[0].finish_reason
        assert "<tool_call" not in content and "</tool_call" not in content
        if choice != "auto" or calls:
            assert finish == "tool_calls" and len(calls) == 1, (choice, seed, content)
            name = calls[0].function.name
            assert name == "get_weather" if choice == "named" else name in SCHEMAS
            jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMAS[name])
            seen_calls += 1
    assert seen_calls == 4 or choice == "auto"


def test_past_calls_and_results_are_rendered(generic):
    oai = openai_client(generic())
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*MSG, {"role": "assistant", "content": None, "tool_calls": [call]}]
    result = {"role": "tool", "tool_call_id": "call_1", "content": "sunny sunny sunny sunny"}
    short = oai.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=1)
    full = oai.chat.completions.create(model="m", messages=[*history, result], tools=TOOLS, max_tokens=1)
    assert full.usage.prompt_tokens > short.usage.prompt_tokens + 4


def test_tools_a_template_renders_but_nothing_parses_are_reported(mlxrt_tiny_checkpoint, tmp_path, mlxrt_serve):
    """A generic-tier model whose own template renders tools: mlxrt leaves the rendering to it,
    but no parser can read calls back, so the answer says ``x-mlxrt-ignored: tools`` and an
    enforced ``tool_choice`` is a 400, never silently dropped."""
    import shutil

    path = tmp_path / "llama-tools"
    shutil.copytree(mlxrt_tiny_checkpoint("llama"), path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
                               "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    client = mlxrt_serve(path)
    body = {"model": "m", "messages": MSG, "tools": TOOLS, "max_tokens": 2}
    answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200 and answer.headers["x-mlxrt-ignored"] == "tools"
    assert "x-mlxrt-ignored" not in client.post("/v1/chat/completions", json={**body, "tools": None}).headers
    refused = client.post("/v1/chat/completions", json={**body, "tool_choice": "required"})
    assert refused.status_code == 400 and "cannot be enforced" in refused.json()["error"]["message"]


def test_anthropic_count_tokens_counts_the_tools(generic):
    client = generic()
    body = {"model": "m", "messages": MSG}
    tools = [{"name": "get_weather", "description": "Weather for a city.", "input_schema": SCHEMAS["get_weather"]}]
    bare = client.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
    with_tools = client.post("/v1/messages/count_tokens", json={**body, "tools": tools}).json()["input_tokens"]
    assert with_tools > bare + 50


OPEN_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"], "properties": {
        "city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}]


class Preferred:
    """Claims ``prefer`` (text): samples the text's next token where the server's grammar allows
    it, else the best allowed token, then EOS once the text is spent (where allowed)."""

    @hookimpl
    def mlxrt_request_fields(self, dialect):
        return {"prefer": str}

    @hookimpl
    def mlxrt_sampler(self, request, info):
        text = request.extra.get("prefer")
        if text is None:
            return None
        import mlx.core as mx
        from tokenizers import Tokenizer

        ids = Tokenizer.from_file(str(info.path / "tokenizer.json")).encode(text, add_special_tokens=False).ids
        eos = json.loads((info.path / "generation_config.json").read_text())["eos_token_id"]
        queue = [*ids, eos if isinstance(eos, int) else eos[0]]

        def sample(logprobs):
            want = queue[0] if queue else 0
            if queue and float(logprobs.reshape(-1)[want]) > -1e30:
                queue.pop(0)
                return mx.array([want])
            queue.clear()  # the grammar refused the text: free (best allowed) from here
            return mx.argmax(logprobs, axis=-1).reshape(-1)

        return sample


def test_parallel_calls_and_closed_arguments(mlxrt_tiny_checkpoint, mlxrt_serve):
    """Issue 42, item 9: with ``parallel_tool_calls`` left on, the ``auto`` grammar lets the
    generic tier write two calls in one turn; with it off, the grammar stops the second (one
    call). A key the schema does not name is refused by the grammar although the schema leaves
    ``additionalProperties`` unset."""
    oai = openai_client(mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=(Preferred(),)))

    def call(city, extra=""):
        return (f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"{extra}}}}}\n</tool_call>')

    two = call("Paris") + "\n" + call("Oslo")
    got = {}
    for parallel in (True, False):
        extra = {} if parallel else {"parallel_tool_calls": False}
        out = oai.chat.completions.create(model="m", messages=MSG, tools=OPEN_TOOLS, max_tokens=120,
                                          extra_body={"prefer": two, **extra})
        got[parallel] = [json.loads(c.function.arguments) for c in out.choices[0].message.tool_calls or []]
    assert got == {True: [{"city": "Paris"}, {"city": "Oslo"}], False: [{"city": "Paris"}]}, got
    invented = call("Paris", ', "country": "FR"')
    out = oai.chat.completions.create(model="m", messages=MSG, tools=OPEN_TOOLS, max_tokens=120,
                                      tool_choice="required", extra_body={"prefer": invented})
    (only,) = out.choices[0].message.tool_calls
    assert set(json.loads(only.function.arguments)) <= {"city", "days"}


def test_generic_cuts_give_the_same_answer_streamed_and_not(generic, mlxrt_tiny_checkpoint):
    """Issue 42: the generic format (several tokens per marker on SmolLM2's vocabulary) cut by
    ``max_tokens`` at sampled tokens: streamed equals non-streamed, only finished calls, no
    markup (the full sweep is tests/test_tool_properties.py)."""
    from tokenizers import Tokenizer

    client = generic(disable=("structured",))
    oai = openai_client(client)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>'
    script = "Sure.\n" + call % "Paris" + "\n" + call % "Oslo" + "\nDone."
    ends = [script.index("</tool_call>") + 12, script.rindex("</tool_call>") + 12]
    tok = Tokenizer.from_file(str(mlxrt_tiny_checkpoint("llama") / "tokenizer.json"))
    ids = tok.encode(script, add_special_tokens=False).ids
    for max_tokens in [*range(3, len(ids), 4), len(ids) + 1]:
        answers = []
        for stream in (False, True):
            out = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=max_tokens,
                                              stream=stream, extra_body={"script": script})
            if stream:
                chunks = list(out)
                calls = [(c.function.name, c.function.arguments) for ch in chunks
                         for c in ch.choices[0].delta.tool_calls or []]
                text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
                reason = [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason][0]
            else:
                msg = out.choices[0].message
                calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
                text, reason = msg.content or "", out.choices[0].finish_reason
            answers.append((reason, calls, text))
        assert answers[0] == answers[1], max_tokens
        reason, calls, text = answers[0]
        reached = len(tok.decode(ids[:max_tokens]))
        assert len(calls) == sum(1 for e in ends if e <= reached), (max_tokens, calls)
        assert "<tool" not in text and "tool_call>" not in text and "{" not in text, (max_tokens, text)
        assert reason == ("tool_calls" if max_tokens > len(ids) else "length")
