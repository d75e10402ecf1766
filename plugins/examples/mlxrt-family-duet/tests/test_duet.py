"""The Duet plugin's own tests, written only with what mlxrt ships for plugin authors (the
``mlxrt_*`` pytest fixtures, ``mlxrt.testing.check_family``) and the official ``openai`` client.

Run them with the plugin installed (``pip install -e .`` then ``pytest``): the fixtures' host
loads it through its entry point, as ``mlxrt serve`` does. Each test serves the tiny random
checkpoint :func:`mlxrt_family_duet.checkpoint.write_tiny_duet` writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from mlxrt_family_duet.checkpoint import write_tiny_duet
from mlxrt_family_duet.tools import DuetToolParser

from mlxrt.testing import check_family

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "required": ["city", "days"], "additionalProperties": False, "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
ASK = [{"role": "user", "content": "What is the weather in Rome?"}]


@pytest.fixture(scope="session")
def duet_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_duet(tmp_path_factory.mktemp("duet") / "duet")


@pytest.fixture
def duet_http(mlxrt_serve: Callable[..., Any], duet_checkpoint: Path) -> Any:
    """The whole app serving the Duet checkpoint in process (a Litestar ``TestClient``), with
    float32 weights so greedy answers compare exactly with mlx-lm's on any device."""
    return mlxrt_serve(duet_checkpoint, options={"dtype": "float32"})


@pytest.fixture
def oai(duet_http: Any) -> openai.OpenAI:
    """The official OpenAI client over that app."""
    return openai.OpenAI(base_url=f"{duet_http.base_url}/v1", api_key="unused", http_client=duet_http,
                         max_retries=0)


def test_the_host_registers_the_plugin(mlxrt_host: Any) -> None:
    record = mlxrt_host.records["duet"]
    assert record.status == "loaded" and record.dist == "mlxrt-family-duet"
    assert sorted(record.hooks) == ["mlxrt_load_model", "mlxrt_thinking_format", "mlxrt_tool_parser"]


def test_duet_conforms(tmp_path: Path, duet_checkpoint: Path) -> None:
    """The load-time self-test through the real template: a rendered call parses back to the
    same name and typed arguments, a tool result renders, reasoning splits back out."""
    check = check_family("duet", checkpoint=duet_checkpoint, workdir=tmp_path, expect=["tools", "thinking"])
    assert check.results["tool_result"] == "pass"
    assert check.results["parity"] == "n/a"  # mlx-lm cannot load Duet: test_greedy_text_equals_mlx_lm does it
    for aspect in ("load_model", "tool_parser", "thinking_format"):
        assert check.provenance[aspect] == "duet"


def test_the_parser_reads_every_call_typed_by_the_schema() -> None:
    """Several calls, the last unclosed (generation ended on EOS); a value the model wrote as a
    string where the schema says integer comes back an integer; text without a call is refused
    (mlxrt then returns it as content)."""
    text = '<|call|>get_weather {"city": "Rome", "days": "3"}<|/call|><|call|>get_weather {"city": "Oslo", "days": 1}'
    calls = DuetToolParser().parse(text, [WEATHER])
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Rome", "days": 3}), ("get_weather", {"city": "Oslo", "days": 1})]
    with pytest.raises(ValueError):
        DuetToolParser().parse("no call here", [WEATHER])


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_choice_comes_back_as_a_parsed_call(oai: openai.OpenAI, stream: bool) -> None:
    """The random model writes a whole call because the grammar (the built-in ``structured``
    plugin over the parser's ``call_grammar``) holds it to Duet's markup and the tool's schema;
    the parser then reads it back as a typed call."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    out = oai.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice=choice,
                                      max_tokens=60, temperature=0, stream=stream)
    if stream:
        chunks = list(out)
        calls = [c for chunk in chunks for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices]
        content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        finish = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
        assert finish == ["tool_calls"]
        name = "".join(c.function.name or "" for c in calls)
        arguments = json.loads("".join(c.function.arguments or "" for c in calls))
    else:
        message = out.choices[0].message
        assert out.choices[0].finish_reason == "tool_calls"
        (call,) = message.tool_calls
        name, arguments, content = call.function.name, json.loads(call.function.arguments), message.content or ""
    assert name == "get_weather"
    assert arguments["city"] in {"Paris", "Rome", "Oslo"} and isinstance(arguments["days"], int)
    assert 1 <= arguments["days"] <= 7
    assert "<|call|>" not in content and not content.strip()


def test_reasoning_effort_opens_the_thinking_span(oai: openai.OpenAI) -> None:
    """Thinking on (``reasoning_effort``), the template opens ``<|think|>`` and everything the
    model writes until ``<|/think|>`` is reasoning (this random model does not close it in 12
    tokens); thinking off (the default for Duet's vocabulary), the same question is content."""
    plain = oai.chat.completions.create(model="m", messages=ASK, max_tokens=12, temperature=0).choices[0].message
    thought = oai.chat.completions.create(model="m", messages=ASK, max_tokens=12, temperature=0,
                                          reasoning_effort="high").choices[0].message
    assert plain.content and not (plain.model_extra or {}).get("reasoning")
    assert thought.model_extra["reasoning"] and not thought.content


def test_prompt_cache_and_batched_choices(oai: openai.OpenAI, duet_http: Any) -> None:
    """The standard KV caches at work: the same prompt again reuses all but its last token and
    answers the same; two choices decode side by side in the batch lane (which takes only
    models whose caches merge), as one alone does."""
    first = oai.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=0)
    again = oai.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    both = oai.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=0, n=2)
    assert [c.message.content for c in both.choices] == [first.choices[0].message.content] * 2
    engine = duet_http.get("/stats").json()["engine"]
    assert engine["served_by_lane"]["batch"] == 2  # the two choices (a request alone may run serially)


def test_greedy_text_equals_mlx_lm(oai: openai.OpenAI, duet_checkpoint: Path) -> None:
    """The served model is the model module: mlx-lm's own ``generate`` over the same classes
    and weights writes the same greedy text as mlxrt's engine."""
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler
    from mlxrt_family_duet.model import Model, ModelArgs

    from mlxrt.loading import mlx_lm_load
    from mlxrt.loading.resolve import ModelSource, read_model_info

    prompt = "The capital of France is"
    ours = oai.completions.create(model="m", prompt=prompt, max_tokens=10, temperature=0).choices[0].text
    info = read_model_info(ModelSource(duet_checkpoint, "duet", "folder"))
    loaded = mlx_lm_load(info, (Model, ModelArgs))
    theirs = mlx_lm.generate(loaded.model, loaded.tokenizer, prompt=prompt, max_tokens=10,
                             sampler=make_sampler(temp=0.0))
    assert ours == theirs and ours
