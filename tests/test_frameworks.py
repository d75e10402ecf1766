"""Python frameworks people point at a local server, against a live mlxrt on loopback.

LangChain's ChatOpenAI with bound tools (a full tool loop), instructor's structured output into a
pydantic model, and Simon Willison's ``llm`` CLI through an extra-openai-models.yaml. A tiny
Qwen3 checkpoint (its template takes tools) is scripted by AgentScript, so the answers are known.
Each test skips when its package is not installed (all three are in the ``test`` extra).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_clients import RAN, AgentScript, AgentServer


@pytest.fixture
def live(mlxrt_tiny_checkpoint):
    servers = []

    def start(script: AgentScript) -> AgentServer:
        servers.append(AgentServer(mlxrt_tiny_checkpoint("qwen3"), script))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_langchain_bind_tools_loop(live):
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        return f"{city}: 21 C ({RAN})"

    server = live(AgentScript("", {"get_weather": lambda _: {"city": "Paris"}}, done="It is 21 C in Paris."))
    llm = ChatOpenAI(base_url=f"{server.url}/v1", api_key="unused", model="gpt-4o", max_retries=0,
                     max_tokens=64).bind_tools([get_weather])
    messages = [HumanMessage("What is the weather in Paris?")]
    first = llm.invoke(messages)
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("get_weather", {"city": "Paris"})]
    call = first.tool_calls[0]
    messages += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    second = llm.invoke(messages)
    assert second.content == "It is 21 C in Paris." and not second.tool_calls
    # The tool's declaration reached the server, and its result came back in turn 2.
    posts = server.generations("/v1/chat/completions")
    assert posts[0]["body"]["tools"][0]["function"]["name"] == "get_weather"
    assert any(m["role"] == "tool" and RAN in m["content"] for m in posts[1]["body"]["messages"])


def test_instructor_structured_output(live):
    instructor = pytest.importorskip("instructor")
    import openai
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    # Compact: the server's JSON grammar (response_format json_object) takes no space after "{".
    answer = json.dumps({"name": "Ada", "age": 36}, separators=(",", ":"))
    server = live(AgentScript("", {}, other=answer))
    client = instructor.from_openai(openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0),
                                    mode=instructor.Mode.JSON)
    person = client.chat.completions.create(model="gpt-4o", response_model=Person, max_tokens=64, max_retries=0,
                                            messages=[{"role": "user", "content": "Ada Lovelace, 36."}])
    assert isinstance(person, Person) and person.model_dump() == {"name": "Ada", "age": 36}
    body = server.generations("/v1/chat/completions")[0]["body"]
    assert body["response_format"]["type"] == "json_object"


def test_llm_cli_with_extra_openai_models(live, tmp_path):
    pytest.importorskip("llm")
    server = live(AgentScript("", {}))  # answers "ok" to every request
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: mlxrt\n  model_name: default\n  api_base: \"{server.url}/v1\"\n")
    # LLM_LOAD_PLUGINS="": no third-party llm plugins that happen to be installed.
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "LLM_LOAD_PLUGINS": ""}
    llm_bin = Path(sys.executable).with_name("llm")
    out = subprocess.run([str(llm_bin), "-m", "mlxrt", "--key", "unused", "--no-log", "-o", "max_tokens", "16",
                          "Say ok."], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    posts = server.generations("/v1/chat/completions")
    assert len(posts) == 1 and posts[0]["status"] == 200 and posts[0]["body"]["model"] == "default"
