"""The Ollama dialect (plugins/ollama) through Ollama's official Python client and LangChain's
ChatOllama, against a live server of a tiny Qwen3 checkpoint scripted by :class:`Script` (its
template takes tools, so the answers are known), with a tiny Qwen3-Embedding beside it."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from agent_clients import RAN, AgentScript, AgentServer

ollama = pytest.importorskip("ollama")

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


class Script(AgentScript):
    """Calls get_weather when offered it; answers JSON about Ada, a thought, or a greeting."""

    def reply(self, prompt: str) -> str:
        if "Ada" in prompt and RAN not in prompt:
            return json.dumps({"name": "Ada", "age": 36}, separators=(",", ":"))
        if "Think first" in prompt:
            return "<think>pondering</think>42"
        return super().reply(prompt)


@pytest.fixture(scope="module")
def server(mlxrt_tiny_checkpoint):
    script = Script("", {"get_weather": lambda _: {"city": "Paris"}}, done="It is 21 C in Paris.",
                    other="Hello there, friend.")
    live = AgentServer(mlxrt_tiny_checkpoint("qwen3"), script, {"max_models": 2})
    yield live
    live.stop()


@pytest.fixture(scope="module")
def embedder(mlxrt_tiny_checkpoint):
    return str(mlxrt_tiny_checkpoint("qwen3_embedding"))


@pytest.fixture
def client(server):
    return ollama.Client(host=server.url)


def test_list_show_and_version(client, server):
    names = [m.model for m in client.list().models]
    assert names[0] == "qwen3-0-gen:latest"
    shown = client.show("qwen3-0-gen:latest")
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert shown.details.family == "qwen3" and shown.modelinfo["general.architecture"] == "qwen3"
    assert shown.template  # the chat template clients display
    assert httpx.get(f"{server.url}/api/version").json()["version"].count(".") == 2


def test_chat_plain_and_streamed(client):
    out = client.chat(model="qwen3-0-gen:latest", messages=[{"role": "user", "content": "hi"}], stream=False)
    assert out.message.role == "assistant" and out.message.content == "Hello there, friend."
    assert out.done and out.done_reason == "stop" and out.model == "qwen3-0-gen:latest"
    assert out.eval_count > 0 and out.prompt_eval_count > 0 and out.total_duration >= out.eval_duration > 0
    parts = list(client.chat(model="qwen3-0-gen", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert len(parts) > 2 and not any(p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == "Hello there, friend."
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == out.eval_count


def test_chat_tool_loop(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat(model="qwen3-0-gen", messages=messages, tools=[WEATHER_TOOL])
    calls = first.message.tool_calls
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    messages += [first.message, {"role": "tool", "content": f"21 C ({RAN})", "tool_name": "get_weather"}]
    second = client.chat(model="qwen3-0-gen", messages=messages, tools=[WEATHER_TOOL])
    assert second.message.content == "It is 21 C in Paris." and not second.message.tool_calls
    streamed = list(client.chat(model="qwen3-0-gen", messages=messages[:1], tools=[WEATHER_TOOL], stream=True))
    assert [c.function.name for p in streamed for c in p.message.tool_calls or ()] == ["get_weather"]


def test_chat_json_schema_format(client):
    out = client.chat(model="qwen3-0-gen", messages=[{"role": "user", "content": "Ada Lovelace, 36."}],
                      format=PERSON, options={"temperature": 0, "num_predict": 40})
    assert json.loads(out.message.content) == {"name": "Ada", "age": 36}


def test_think_returns_thinking(client):
    out = client.chat(model="qwen3-0-gen", messages=[{"role": "user", "content": "Think first: 6*7?"}], think=True)
    assert out.message.thinking == "pondering" and out.message.content == "42"
    gen = client.generate(model="qwen3-0-gen", prompt="Think first: 6*7?", think=True)
    assert gen.thinking == "pondering" and gen.response == "42"


def test_generate(client):
    out = client.generate(model="qwen3-0-gen", prompt="hi", system="Be brief.", options={"num_predict": 50})
    assert out.response == "Hello there, friend." and out.done_reason == "stop"
    parts = list(client.generate(model="qwen3-0-gen", prompt="hi", stream=True))
    assert "".join(p.response for p in parts) == "Hello there, friend." and parts[-1].done
    cut = client.generate(model="qwen3-0-gen", prompt="hi", options={"num_predict": 2})
    assert cut.done_reason == "length" and cut.eval_count == 2


def test_embed_on_an_embedding_model(client, embedder):
    out = client.embed(model=embedder, input=["The sea is blue.", "hi"])
    assert len(out.embeddings) == 2 and len(out.embeddings[0]) == 64 and out.prompt_eval_count > 2
    assert out.embeddings[0] != out.embeddings[1]
    one = client.embed(model=embedder, input="The sea is blue.")
    assert one.embeddings[0] == pytest.approx(out.embeddings[0], abs=1e-6)
    old = client.embeddings(model=embedder, prompt="The sea is blue.")
    assert list(old.embedding) == pytest.approx(out.embeddings[0], abs=1e-6)
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="qwen3-0-gen", input="hi")
    assert refused.value.status_code == 400 and "does not support embeddings" in refused.value.error


def test_ps_and_keep_alive_unload(client, embedder):
    client.embed(model=embedder, input="warm", keep_alive=-1)
    running = {m.model: m for m in client.ps().models}
    assert {"qwen3-0-gen:latest"} <= set(running) and running["qwen3-0-gen:latest"].size > 0
    emb = next(m for name, m in running.items() if name != "qwen3-0-gen:latest")
    assert emb.expires_at.year > 2200  # keep_alive -1: never unloaded
    unloaded = client.generate(model=emb.model, keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert [m.model for m in client.ps().models] == ["qwen3-0-gen:latest"]
    client.embed(model=embedder, input="warm", keep_alive="1s")  # unloaded after a second unused
    assert emb.model in [m.model for m in client.ps().models]
    deadline = time.monotonic() + 10
    while emb.model in [m.model for m in client.ps().models] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [m.model for m in client.ps().models] == ["qwen3-0-gen:latest"]


def test_pull_offline_is_a_clear_error(client, monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ollama.ResponseError) as streamed:
        list(client.pull("hf.co/mlx-community/not-here-at-all", stream=True))
    assert "offline" in streamed.value.error.lower()
    with pytest.raises(ollama.ResponseError) as plain:
        client.pull("mlx-community/not-here-at-all")
    assert "offline" in plain.value.error.lower()
    with pytest.raises(ollama.ResponseError) as library:
        client.pull("smollm2")
    assert library.value.status_code == 400 and "Hugging Face" in library.value.error


def test_errors_are_ollama_shaped(server):
    bad = httpx.post(f"{server.url}/api/chat", json={"model": "m", "messages": [{"role": "robot", "content": "x"}]})
    assert bad.status_code == 400 and set(bad.json()) == {"error"}
    opts = httpx.post(f"{server.url}/api/generate", json={"prompt": "hi", "options": {"temperature": "hot"}})
    assert opts.status_code == 400 and "options.temperature" in opts.json()["error"]
    ignored = httpx.post(f"{server.url}/api/chat", json={"messages": [{"role": "user", "content": "hi"}],
                                                         "stream": False, "options": {"num_gpu": 1}, "bogus": 1})
    assert ignored.status_code == 200 and ignored.headers["x-mlxrt-ignored"] == "bogus, options.num_gpu"
    streamed = httpx.post(f"{server.url}/api/chat", json={"messages": [{"role": "user", "content": "hi"}]})
    assert streamed.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line)["done"] for line in streamed.text.splitlines()][-1] is True


def test_langchain_chat_ollama_tool_loop(server):
    pytest.importorskip("langchain_ollama")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_ollama import ChatOllama

    @tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        return f"{city}: 21 C ({RAN})"

    llm = ChatOllama(model="qwen3-0-gen", base_url=server.url, num_predict=64).bind_tools([get_weather])
    messages = [HumanMessage("What is the weather in Paris?")]
    first = llm.invoke(messages)
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("get_weather", {"city": "Paris"})]
    call = first.tool_calls[0]
    messages += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    second = llm.invoke(messages)
    assert second.content == "It is 21 C in Paris." and not second.tool_calls
