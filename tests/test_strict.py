"""``--strict`` refuses only fields that would change the answer and that mlxrt cannot honour;
hints and bookkeeping (``include: []``, ``prompt_cache_key``, ``client_metadata``, Claude Code's
``context_management`` that clears nothing …) are accepted and named in ``x-mlxrt-ignored``
(issue 43; docs/usage.md, "Fields nobody reads").

The OpenAI Agents SDK (``openai-agents``) always sends ``include: []`` on Responses. Its exact
first request (0.24.0, recorded against mlxrt) is replayed here; with the SDK installed, its
``Runner`` also runs a tool loop against a strict server. The SDK is not in the test extra: it
pulls mcp, starlette, cryptography and websockets, far heavier than what it checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import Scripted

from mlxrt.errors import InvalidRequest
from mlxrt.plugins.anthropic.decode import decode_messages
from mlxrt.plugins.openai.decode import decode_chat
from mlxrt.plugins.responses.decode import decode_response

CLIENTS = Path(__file__).parent / "fixtures" / "clients"
#: The OpenAI Agents SDK 0.24.0's first Responses request for an agent with one function tool.
AGENTS_SDK_BODY = {
    "include": [], "input": [{"content": "Run it.", "role": "user"}], "instructions": "Be brief.", "model": "m",
    "tools": [{"name": "run_shell", "parameters": {
        "properties": {"command": {"title": "Command", "type": "string"}}, "required": ["command"],
        "title": "run_shell_args", "type": "object", "additionalProperties": False},
        "strict": True, "type": "function", "description": "Run a shell command."}],
}
MSG = [{"role": "user", "content": "hi"}]


def test_hints_pass_strict_and_are_reported():
    hints = {"prompt_cache_key": "k", "safety_identifier": "s", "user": "u", "metadata": {"a": "b"},
             "service_tier": "auto", "store": False}
    chat = decode_chat({"messages": MSG, **hints}, strict=True)
    assert set(chat.options.ignored) == {"prompt_cache_key", "safety_identifier", "service_tier", "store", "metadata"}
    assert "prompt_cache_key" in chat.options.headers["x-mlxrt-ignored"]
    responses = decode_response({"input": "hi", "include": ["reasoning.encrypted_content"], **hints}, strict=True)
    assert "include" in responses.ignored
    decode_messages({"model": "m", "max_tokens": 4, "messages": MSG, "context_management": {
        "edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}, strict=True)


@pytest.mark.parametrize(("decode", "body", "field"), [
    (decode_chat, {"messages": MSG, "frobnicate": 1}, "frobnicate"),
    (decode_response, {"input": "hi", "include": ["message.output_text.logprobs"]}, "include"),
    (decode_response, {"input": "hi", "include": "reasoning.encrypted_content"}, "include"),
    (decode_messages, {"model": "m", "max_tokens": 4, "messages": MSG, "context_management": {
        "edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_management"),
])
def test_strict_still_refuses_what_would_change_the_answer(decode, body, field):
    with pytest.raises(InvalidRequest, match=f"unknown field: {field} \\(the server runs with --strict\\)"):
        decode(body, strict=True)
    decode(body, strict=False)  # listed, not refused, without --strict


@pytest.mark.parametrize("path", sorted(CLIENTS.glob("*/*.json")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_agent_clients_requests_pass_strict(path):
    captured = json.loads(path.read_text())
    decode = decode_response if captured["path"] == "/v1/responses" else decode_messages
    decode(captured["body"], strict=True)


def test_a_strict_server_answers_the_agents_sdk_request(mlxrt_tiny_checkpoint, mlxrt_serve):
    server = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("scripted", Scripted())], options={"strict": True})
    resp = server.post("/v1/responses", json={**AGENTS_SDK_BODY, "script": "ok"})  # script: a claimed field
    assert resp.status_code == 200, resp.text
    assert resp.json()["output"][-1]["content"][0]["text"] == "ok"
    assert resp.headers["x-mlxrt-ignored"] == "include"
    refused = server.post("/v1/responses", json={**AGENTS_SDK_BODY, "script": "ok", "include": ["file_search_call.results"]})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "unknown_parameter"


def test_the_agents_sdk_runs_a_tool_loop_on_a_strict_server(mlxrt_tiny_checkpoint):
    agents = pytest.importorskip("agents", reason="needs openai-agents (not in the test extra: heavy)")
    from agent_clients import RAN, AgentScript, AgentServer
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # no trace export to OpenAI
    script = AgentScript("echo MLXRT-TOOL-$((6*7))-RAN", {"run_shell": lambda c: {"command": c}})
    server = AgentServer(mlxrt_tiny_checkpoint("qwen3"), script, options={"strict": True})
    ran = []

    @agents.function_tool
    def run_shell(command: str) -> str:
        """Run a shell command."""
        ran.append(command)
        return RAN

    try:
        client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        agent = agents.Agent(name="a", instructions="Be brief.", tools=[run_shell],
                             model=agents.OpenAIResponsesModel(model="m", openai_client=client))
        result = agents.Runner.run_sync(agent, "Run it.")
    finally:
        server.stop()
    posts = server.generations("/v1/responses")
    assert [e["status"] for e in posts] == [200, 200], [e.get("error") for e in posts]
    assert all(e["body"]["include"] == [] for e in posts)
    assert ran and result.final_output == "All done."
