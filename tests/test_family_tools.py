"""Every family's tool calls and reasoning through the OpenAI chat API (official client).

A tiny real-format checkpoint of each family is scripted to emit that family's own markup
(thinking, then two tool calls); the response must carry the reasoning apart, the calls with
schema-typed arguments, and no markup in the content, streamed and not. ``tool_choice``
"required" and a named tool are enforced: the script then holds only what follows the
opening, which the server must force.
"""

from __future__ import annotations

import json

import openai
import pytest
from conftest import shared_tokenizer
from support import openai_client
from tokenizers import Tokenizer

from mlxrt import hookimpl

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "days": {"type": "integer"},
                                          "metric": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
MSG = [{"role": "user", "content": "Weather in Paris and Oslo?"}]
MINICPM5 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}

#: family → (tiny model type, config overrides, request kwargs, scripted output, city of call 1)
FAMILIES = {
    "qwen3": ("qwen3", None, {}, (
        '<think>\nplan it\n</think>\n\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "days": "3"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Oslo", "metric": false}}\n</tool_call>'), "Paris"),
    # Qwen3.5's generation prompt opens <think>: the output starts inside reasoning.
    "qwen3_5": ("qwen3_5", None, {}, (
        "plan it\n</think>\n\nLet me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
        "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=metric>\nfalse\n</parameter>\n"
        "</function>\n</tool_call>"), "Paris"),
    # MiniCPM5 is model_type llama: recognised by its tokenizer and template. Thinking is on
    # (mlx-lm passes enable_thinking=True to a thinking model's template), and MiniCPM5's
    # template then opens <think> in the prompt.
    "minicpm5": ("minicpm", MINICPM5, {}, (
        'plan it\n</think>\n\nLet me check.\n<function name="get_weather"><param name="city">'
        '<![CDATA[Paris <north>]]></param><param name="days">3</param></function>'
        '<function name="get_weather"><param name="city">Oslo</param><param name="metric">false</param>'
        "</function>"), "Paris <north>"),
    "gemma4": ("gemma4_text", None, {"reasoning_effort": "high"}, (
        '<|channel>thought\nplan it<channel|>Let me check.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,'
        'days:3}<tool_call|><|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,metric:false}<tool_call|>'),
        "Paris"),
}
MARKUP = ("<think", "</think", "<tool_call", "tool_call>", "<function", "<param", "<|channel", "<channel|>",
          "call:", "CDATA")


class Script:
    """Claims ``script`` (text) and ``script_ids`` (comma-separated ids).

    Samples the script's tokens, then EOS. A step the server constrained (some logits masked
    to -inf by tool_choice enforcement) takes the best allowed token instead and leaves the
    script where it was, so the script holds only what follows a forced opening.
    """

    @hookimpl
    def mlxrt_request_fields(self, dialect):
        return {"script": str, "script_ids": str} if dialect == "openai" else None

    @hookimpl
    def mlxrt_sampler(self, request, info):
        script, script_ids = request.extra.get("script"), request.extra.get("script_ids")
        if script is None and script_ids is None:
            return None
        import mlx.core as mx

        if script_ids is not None:
            ids = [int(i) for i in script_ids.split(",")]
        else:
            ids = Tokenizer.from_file(str(info.path / "tokenizer.json")).encode(script, add_special_tokens=False).ids
        eos = json.loads((info.path / "generation_config.json").read_text())["eos_token_id"]
        queue = iter([*ids, eos if isinstance(eos, int) else eos[0]])

        def sample(logprobs):
            if int(mx.isinf(logprobs).sum()) > 0:
                return mx.argmax(logprobs, axis=-1).reshape(-1)
            return mx.array([next(queue, 0)])

        return sample


@pytest.fixture
def family_client(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path_factory):
    made = {}

    def start(family, disable=()):
        model_type, overrides, _kw, _script, _city = FAMILIES[family]
        if overrides is None:
            path = mlxrt_tiny_checkpoint(model_type)
        else:
            from mlxrt.testing import write_tiny_checkpoint

            path = write_tiny_checkpoint(tmp_path_factory.mktemp(family) / family, model_type,
                                         config_overrides=overrides)
        made[family] = mlxrt_serve(path, plugins=(Script(),), disable=disable)
        return made[family]

    return start


def expected_calls(family):
    city = FAMILIES[family][4]
    return [("get_weather", {"city": city, "days": 3}), ("get_weather", {"city": "Oslo", "metric": False})]


def reasoning_of(obj):
    extra = obj.model_extra or {}
    return extra.get("reasoning_content") or ""


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tool_calls_and_reasoning(family_client, family):
    oai = openai_client(family_client(family))
    _mt, _ov, kwargs, script, _city = FAMILIES[family]
    out = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=200,
                                      extra_body={"script": script}, **kwargs)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == \
        expected_calls(family)
    assert len({c.id for c in choice.message.tool_calls}) == 2
    assert reasoning_of(choice.message).strip() == "plan it"
    assert choice.message.model_extra["reasoning"] == choice.message.model_extra["reasoning_content"]
    assert (choice.message.content or "").strip() == "Let me check."
    assert not any(m in (choice.message.content or "") for m in MARKUP)

    stream = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=200, stream=True,
                                         extra_body={"script": script}, **kwargs)
    content, reasoning, calls, reasons = [], [], [], []
    for chunk in stream:
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        reasoning.append(reasoning_of(delta))
        calls += delta.tool_calls or []
        reasons.append(chunk.choices[0].finish_reason)
    assert [r for r in reasons if r] == ["tool_calls"]
    assert "".join(reasoning).strip() == "plan it"
    assert "".join(content).strip() == "Let me check."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == expected_calls(family)
    assert [c.index for c in calls] == [0, 1]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tool_result_round_trips_through_the_template(family_client, family):
    """An assistant call and the role "tool" result render (the result text reaches the prompt)."""
    oai = openai_client(family_client(family))
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}
    history = [*MSG, {"role": "assistant", "content": None, "tool_calls": [call]}]
    result = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny sunny sunny"}
    short = oai.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=1)
    full = oai.chat.completions.create(model="m", messages=[*history, result], tools=TOOLS, max_tokens=1)
    assert full.usage.prompt_tokens > short.usage.prompt_tokens + 2


def test_malformed_call_is_content_with_no_tool_calls(family_client):
    oai = openai_client(family_client("qwen3"))
    script = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {broken\n</tool_call>'
    out = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=100,
                                      extra_body={"script": script})
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == script


def test_without_tools_markup_is_plain_content(family_client):
    oai = openai_client(family_client("gemma4"))
    script = '<|tool_call>call:get_time{}<tool_call|>'
    out = oai.chat.completions.create(model="m", messages=MSG, max_tokens=50, extra_body={"script": script})
    assert out.choices[0].finish_reason == "stop" and not out.choices[0].message.tool_calls
    assert out.choices[0].message.content.strip() == script


#: family → the continuation a forced ``get_weather`` opening needs to be a complete call
FORCED = {
    "qwen3": '{"city": "Rome"}}\n</tool_call>',
    "qwen3_5": "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>",
    "minicpm5": '<param name="city">Rome</param></function>',
    "gemma4": 'city:<|"|>Rome<|"|>}<tool_call|>',
}


@pytest.mark.parametrize("family", list(FORCED))
def test_named_tool_choice_is_enforced_by_its_opening_without_the_grammar_plugin(family_client, family):
    """Without the structured plugin (no grammar), the call's opening is forced and the model
    (here the script) writes the rest."""
    oai = openai_client(family_client(family, disable=("structured",)))
    kwargs = {k: v for k, v in FAMILIES[family][2].items() if k != "reasoning_effort"}
    choice = {"type": "function", "function": {"name": "get_weather"}}
    free = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=80,
                                       extra_body={"script": FORCED[family]}, **kwargs)
    assert not free.choices[0].message.tool_calls  # left free, the script alone is no call
    for stream in (False, True):
        out = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, tool_choice=choice, max_tokens=80,
                                          stream=stream, extra_body={"script": FORCED[family]}, **kwargs)
        if stream:
            calls = [c for chunk in out for c in (chunk.choices[0].delta.tool_calls or [])]
        else:
            calls = out.choices[0].message.tool_calls
            assert out.choices[0].finish_reason == "tool_calls"
            assert not (out.choices[0].message.content or "").strip()
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == \
            [("get_weather", {"city": "Rome"})]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_required_tool_choice_yields_a_call(family_client, family):
    """With "required" the model picks among the tools' names; the script then closes the call
    (the opening-only enforcement: no grammar plugin)."""
    oai = openai_client(family_client(family, disable=("structured",)))
    tail = {"qwen3": "{}}\n</tool_call>", "qwen3_5": "</function>\n</tool_call>"}[family]
    out = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, tool_choice="required", max_tokens=80,
                                      extra_body={"script": tail})
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name in {"get_weather", "get_time"}
    assert json.loads(call.function.arguments) == {}
    assert out.choices[0].finish_reason == "tool_calls"
    assert not reasoning_of(out.choices[0].message).strip()  # Qwen3.5's open think was closed first


#: Tools whose every call is finite (enums, booleans, no extra keys): a random model under the
#: grammar must finish its call well within max_tokens.
GRAMMAR_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["city", "unit"],
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Rome"]},
                       "metric": {"type": "boolean"},
                       "unit": {"enum": ["c", "f"]}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "additionalProperties": False, "properties": {"zone": {"enum": ["utc", "cet"]}}}}},
]


@pytest.mark.parametrize("family", list(FORCED))
@pytest.mark.parametrize("choice", ["named", "required"])
def test_forced_tool_choice_is_a_schema_valid_call_by_grammar(family_client, family, choice):
    """The random model writes the whole call under the family's call grammar: markup its
    parser reads, arguments valid under the tool's schema, in every family's markup."""
    import jsonschema

    oai = openai_client(family_client(family))
    kwargs = {k: v for k, v in FAMILIES[family][2].items() if k != "reasoning_effort"}
    tool_choice = ({"type": "function", "function": {"name": "get_weather"}} if choice == "named"
                   else "required")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in GRAMMAR_TOOLS}
    for stream, temperature in ((False, 0.0), (True, 1.0), (False, 1.0)):
        out = oai.chat.completions.create(model="m", messages=MSG, tools=GRAMMAR_TOOLS, tool_choice=tool_choice,
                                          max_tokens=120, stream=stream, temperature=temperature, seed=7, **kwargs)
        if stream:
            chunks = list(out)
            calls = [c for chunk in chunks for c in (chunk.choices[0].delta.tool_calls or [])]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        else:
            calls, finish = out.choices[0].message.tool_calls, [out.choices[0].finish_reason]
        assert finish == ["tool_calls"] and len(calls) == 1, (family, calls)
        name = calls[0].function.name
        assert name == "get_weather" if choice == "named" else name in schemas
        jsonschema.validate(json.loads(calls[0].function.arguments), schemas[name])


def test_forced_tool_choice_cannot_also_take_a_response_format(family_client):
    oai = openai_client(family_client("qwen3"))
    with pytest.raises(openai.BadRequestError, match="cannot be combined with response_format"):
        oai.chat.completions.create(model="m", messages=MSG, tools=GRAMMAR_TOOLS, tool_choice="required",
                                    max_tokens=8, response_format={"type": "json_object"})


def test_tool_choice_none_renders_no_tools(family_client):
    oai = openai_client(family_client("qwen3"))
    script = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    free = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=1)
    none = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, tool_choice="none", max_tokens=60,
                                       extra_body={"script": script})
    assert none.usage.prompt_tokens < free.usage.prompt_tokens
    assert not none.choices[0].message.tool_calls and none.choices[0].message.content == script


def test_tool_choice_errors(family_client):
    oai = openai_client(family_client("qwen3"))
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=1,
                                    tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="tool_choice must be"):
        oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=1, tool_choice="always")


@pytest.mark.parametrize("stream", [False, True])
def test_qwen_low_ids_are_plain_text(mlxrt_tiny_checkpoint, mlxrt_serve, stream):
    """Ids 48/49/100/101 are Gemma 4's sentinels, but ordinary pieces of a Qwen vocabulary."""
    path = mlxrt_tiny_checkpoint("qwen3", tokenizer_dir=shared_tokenizer("qwen3"))
    oai = openai_client(mlxrt_serve(path, plugins=(Script(),)))
    ids = [48, 49, 100, 101, 48]
    text = Tokenizer.from_file(str(path / "tokenizer.json")).decode(ids, skip_special_tokens=False)
    out = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=20, stream=stream,
                                      extra_body={"script_ids": ",".join(map(str, ids))})
    if stream:
        chunks = list(out)
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert not any(c.choices[0].delta.tool_calls for c in chunks)
        assert not any(reasoning_of(c.choices[0].delta) for c in chunks)
    else:
        content = out.choices[0].message.content
        assert not out.choices[0].message.tool_calls and not reasoning_of(out.choices[0].message)
    assert content == text and len(text) >= 5


def test_gemma_sentinel_ids_route(family_client):
    """On the Gemma tokenizer the same ids are the sentinels: 100…101 is reasoning."""
    client = family_client("gemma4")
    tok = Tokenizer.from_file(str(client.app.state.models.primary.engine.info.path / "tokenizer.json"))
    ids = [100, *tok.encode("thought\nhmm", add_special_tokens=False).ids, 101,
           *tok.encode("ok", add_special_tokens=False).ids]
    out = openai_client(client).chat.completions.create(model="m", messages=MSG, max_tokens=20,
                                                        extra_body={"script_ids": ",".join(map(str, ids))})
    assert reasoning_of(out.choices[0].message).strip() == "hmm"
    assert out.choices[0].message.content.strip() == "ok"
