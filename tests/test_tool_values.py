"""Values that hold the family's own markup, calls to tools that were not offered, and forced
calls whose arguments are objects (issue 42, items 2 and 8), through the served API.

A Qwen3.5 value is raw text, so code that writes ``</tool_call>`` is a value like any other
(vLLM's qwen3_coder parser returns it exactly); a MiniCPM5 CDATA value may hold
``</param></function>``. A call to a tool the request did not offer is text, not a call.
``tool_choice`` forcing a Gemma 4 call with object and array parameters is held to the whole
call by grammar, arguments included.
"""

from __future__ import annotations

import json

import pytest
from support import anthropic_client, openai_client
from test_partial_tool_calls import DIALECTS, MSG, clients, no_markup  # noqa: F401

WRITE = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "write_file", "parameters": WRITE}}]
ANTHROPIC_TOOLS = [{"name": "write_file", "input_schema": WRITE}]
RESPONSES_TOOLS = [{"type": "function", "name": "write_file", "parameters": WRITE}]
CODE = "END = '</tool_call>'\nprint('<function=x>', \"</parameter>\")\n"


def turn(sdk, dialect, family, script, stream):
    """(reason, calls, text) of one scripted turn on ``dialect`` with the write_file tool."""
    extra = {"script": script}
    if dialect == "openai":
        out = sdk.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=400, stream=stream,
                                          extra_body=extra)
        if not stream:
            msg = out.choices[0].message
            return (out.choices[0].finish_reason,
                    [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []],
                    msg.content or "")
        chunks = list(out)
        calls = [(c.function.name, json.loads(c.function.arguments)) for ch in chunks
                 for c in ch.choices[0].delta.tool_calls or []]
        reason = [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason][0]
        return reason, calls, "".join(ch.choices[0].delta.content or "" for ch in chunks)
    if dialect == "anthropic":
        args = dict(model="m", messages=MSG, tools=ANTHROPIC_TOOLS, max_tokens=400, extra_body=extra)
        if stream:
            with sdk.messages.stream(**args) as s:
                msg = s.get_final_message()
        else:
            msg = sdk.messages.create(**args)
        return (msg.stop_reason, [(b.name, b.input) for b in msg.content if b.type == "tool_use"],
                "".join(b.text for b in msg.content if b.type == "text"))
    args = dict(model="m", input=MSG, tools=RESPONSES_TOOLS, max_output_tokens=400, extra_body=extra)
    if stream:
        resp = [e for e in sdk.responses.create(stream=True, **args) if e.type == "response.completed"][0].response
    else:
        resp = sdk.responses.create(**args)
    return (resp.status, [(i.name, json.loads(i.arguments)) for i in resp.output if i.type == "function_call"],
            "".join(c.text for i in resp.output if i.type == "message" for c in i.content if c.type == "output_text"))


def every_dialect(client, family, script, expected_calls, expected_text=None):
    for dialect in DIALECTS:
        sdk = anthropic_client(client) if dialect == "anthropic" else openai_client(client)
        for stream in (False, True):
            reason, calls, text = turn(sdk, dialect, family, script, stream)
            where = (family, dialect, stream)
            assert calls == expected_calls, where
            assert reason == (DIALECTS[dialect][2] if expected_calls else
                              {"openai": "stop", "anthropic": "end_turn", "responses": "completed"}[dialect]), where
            if expected_text is not None:
                assert expected_text in text, (where, text)


def test_a_qwen3_5_value_may_hold_the_end_marker(clients):  # noqa: F811
    """Item 2: the value holds ``</tool_call>``, ``<function=…>`` and ``</parameter>``; the call
    is exact on every dialect, streamed and not."""
    client, _path = clients("qwen3_5")
    script = (f"plan\n</think>\n\n<tool_call>\n<function=write_file>\n<parameter=path>\nend.py\n</parameter>\n"
              f"<parameter=content>\n{CODE}\n</parameter>\n</function>\n</tool_call>")
    every_dialect(client, "qwen3_5", script, [("write_file", {"path": "end.py", "content": CODE})])


def test_a_qwen3_json_string_may_hold_the_end_marker(clients):  # noqa: F811
    client, _path = clients("qwen3")
    call = json.dumps({"name": "write_file", "arguments": {"path": "end.py", "content": CODE}})
    script = f"<think>\nplan\n</think>\n\n<tool_call>\n{call}\n</tool_call>"
    every_dialect(client, "qwen3", script, [("write_file", {"path": "end.py", "content": CODE})])


def test_a_minicpm5_cdata_value_may_hold_the_close_markup(clients):  # noqa: F811
    """Item 8: a CDATA value holding ``</param></function>`` is the value (it used to give a
    call named ``]]``)."""
    client, _path = clients("minicpm5")
    value = "x = '</param></function>' & y < 2\n"
    script = (f'plan\n</think>\n\n<function name="write_file"><param name="path">a.py</param>'
              f'<param name="content"><![CDATA[{value}]]></param></function>')
    every_dialect(client, "minicpm5", script, [("write_file", {"path": "a.py", "content": value})])


def test_a_gemma4_string_may_hold_the_end_marker(clients):  # noqa: F811
    client, _path = clients("gemma4")
    value = "a <tool_call|> b {c} [d]"
    script = (f'<|channel>thought\nplan<channel|><|tool_call>call:write_file{{path:<|"|>a.txt<|"|>,'
              f'content:<|"|>{value}<|"|>}}<tool_call|>')
    for dialect in DIALECTS:  # Gemma's reasoning is asked for per dialect
        sdk = anthropic_client(client) if dialect == "anthropic" else openai_client(client)
        _reason, calls, _text = turn(sdk, dialect, "gemma4", script, False)
        assert calls == [("write_file", {"path": "a.txt", "content": value})], dialect


@pytest.mark.parametrize("family", ["qwen3", "minicpm5"])
def test_a_call_to_a_tool_not_offered_is_text(clients, family):  # noqa: F811
    """Item 8: the model calls ``rm_rf``, which the request did not offer: no call; its markup
    comes back as the text it is, with the turn's own end reason."""
    client, _path = clients(family)
    if family == "qwen3":
        markup = '<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/"}}\n</tool_call>'
        script = f"<think>\nplan\n</think>\n\n{markup}"
    else:
        markup = '<function name="rm_rf"><param name="path">/</param></function>'
        script = f"plan\n</think>\n\n{markup}"
    every_dialect(client, family, script, [], expected_text="rm_rf")


GEMMA_TOOLS = [{"type": "function", "function": {"name": "plan_trip", "parameters": {
    "type": "object", "required": ["trip", "tags"], "additionalProperties": False, "properties": {
        "trip": {"type": "object", "required": ["to", "nights"], "additionalProperties": False,
                 "properties": {"to": {"enum": ["Rome", "Oslo"]}, "nights": {"type": "integer"}}},
        "tags": {"type": "array", "items": {"enum": ["sea", "city"]}}}}}}]


def test_forced_gemma4_call_with_object_and_array_parameters(mlxrt_tiny_checkpoint, mlxrt_serve):
    """Item 8: ``tool_choice`` forcing a Gemma 4 call whose parameters are an object and an
    array holds the random model to the whole call, arguments included (only the opening was
    forced: the random model then wrote no parseable call)."""
    import jsonschema

    oai = openai_client(mlxrt_serve(mlxrt_tiny_checkpoint("gemma4_text")))
    schema = GEMMA_TOOLS[0]["function"]["parameters"]
    for seed, stream in ((1, False), (2, True), (3, False)):
        out = oai.chat.completions.create(model="m", messages=MSG, tools=GEMMA_TOOLS, tool_choice="required",
                                          max_tokens=200, temperature=1.0, seed=seed, stream=stream)
        if stream:
            chunks = list(out)
            calls = [c for ch in chunks for c in ch.choices[0].delta.tool_calls or []]
            finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason]
        else:
            calls, finish = out.choices[0].message.tool_calls or [], [out.choices[0].finish_reason]
        assert finish == ["tool_calls"] and len(calls) == 1, (seed, finish, calls)
        assert calls[0].function.name == "plan_trip"
        jsonschema.validate(json.loads(calls[0].function.arguments), schema)
