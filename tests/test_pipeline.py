"""The one request pipeline (mlxrt.api.pipeline): every dialect prepares its request before the
engine, off the event loop; a third-party dialect built on the public contract alone serves
through HTTP like the built-in ones (tests/fixture-plugins/mlxrt-dialect-example)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from support import MLXRT_BIN

from mlxrt import hookimpl

REPO = Path(__file__).resolve().parents[1]
DIALECT_EXAMPLE = REPO / "tests" / "fixture-plugins" / "mlxrt-dialect-example"
ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"enum": ["Paris", "Oslo"]}}}


class Spy:
    """Records, for each prepared request, its dialect, its constraint and where it ran."""

    def __init__(self):
        self.seen = []

    @hookimpl
    def mlxrt_prepare_request(self, request, info, host):
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        self.seen.append({"dialect": request.dialect, "id": request.request_id, "on_loop": on_loop,
                          "thread": threading.current_thread().name,
                          "structured": request.structured.kind if request.structured else None})


def test_every_dialect_prepares_its_request_off_the_loop_before_the_engine(mlxrt_tiny_checkpoint, mlxrt_serve):
    spy = Spy()
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("spy", spy)])
    chat = client.post("/v1/chat/completions", json={"model": "m", "messages": ASK, "max_tokens": 2})
    text = client.post("/v1/completions", json={"model": "m", "prompt": "Paris", "max_tokens": 2})
    # Anthropic's forced tool call: its grammar is planned and prepared here, not compiled lazily
    # on the engine thread when the logits processors are made.
    forced = client.post("/v1/messages", json={
        "model": "m", "max_tokens": 40, "messages": ASK, "tool_choice": {"type": "tool", "name": "get_weather"},
        "tools": [{"name": "get_weather", "input_schema": WEATHER}]})
    response = client.post("/v1/responses", json={"model": "m", "input": "Paris?", "max_output_tokens": 2})
    for answer in (chat, text, forced, response):
        assert answer.status_code == 200, answer.text
    assert [s["dialect"] for s in spy.seen] == ["openai", "openai", "anthropic", "responses"]
    assert [s["id"] for s in spy.seen] == [chat.json()["id"], text.json()["id"], forced.json()["id"],
                                           response.json()["id"]]
    assert spy.seen[2]["structured"] == "lark"  # the whole call, as a grammar
    assert forced.json()["stop_reason"] == "tool_use"
    for seen in spy.seen:
        assert not seen["on_loop"] and seen["thread"] != "mlxrt-engine"


def test_a_refusal_from_prepare_renders_in_each_dialects_shape(mlxrt_tiny_checkpoint, mlxrt_serve):
    from mlxrt.errors import InvalidRequest

    class Gate:
        @hookimpl
        def mlxrt_prepare_request(self, request, info, host):
            raise InvalidRequest("closed for " + request.dialect, param="model")

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("gate", Gate())])
    openai = client.post("/v1/chat/completions", json={"model": "m", "messages": ASK, "max_tokens": 2})
    anthropic = client.post("/v1/messages", json={"model": "m", "messages": ASK, "max_tokens": 2})
    responses = client.post("/v1/responses", json={"model": "m", "input": "x", "max_output_tokens": 2})
    assert openai.status_code == anthropic.status_code == responses.status_code == 400
    assert openai.json()["error"]["message"] == "closed for openai"
    assert anthropic.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                           "message": "closed for anthropic"}}
    assert responses.json()["error"]["message"] == "closed for responses"


# -- A third-party dialect, pip-installed ------------------------------------------------------


@pytest.fixture(scope="module")
def dialect_site(tmp_path_factory):
    target = tmp_path_factory.mktemp("dialect-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(DIALECT_EXAMPLE)],
        check=True, capture_output=True, text=True,
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}


def test_third_party_dialect_is_discovered(dialect_site):
    out = subprocess.run([MLXRT_BIN, "plugins", "--json"], env=dialect_site, capture_output=True, text=True,
                         check=True, cwd="/")
    plain = {row["name"]: row for row in json.loads(out.stdout)}["plain"]
    assert plain["status"] == "loaded" and plain["kind"] == "dialect" and plain["builtin"] is False
    assert plain["dist"] == "mlxrt-dialect-example"


def test_third_party_dialect_uses_only_the_public_contract():
    package = DIALECT_EXAMPLE / "mlxrt_dialect_example"
    imports = {line.split()[1] for path in package.glob("*.py") for line in path.read_text().splitlines()
               if line.startswith(("from mlxrt", "import mlxrt"))}
    assert imports <= {"mlxrt", "mlxrt.api.pipeline", "mlxrt.records", "mlxrt.errors", "mlxrt_dialect_example.routes"}


def test_third_party_dialect_serves_through_the_pipeline(dialect_site, mlxrt_tiny_checkpoint, server_process):
    server = server_process([str(mlxrt_tiny_checkpoint("qwen3"))], env=dialect_site)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        reference = http.post("/v1/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "Tell me a story."}], "max_tokens": 6, "temperature": 0}).json()
        plain = http.post("/v1/plain", json={"model": "m", "text": "Tell me a story.", "max_tokens": 6,
                                             "temperature": 0})
        streamed = http.post("/v1/plain", json={"text": "Tell me a story.", "max_tokens": 6, "temperature": 0,
                                                "stream": True})
        bad = http.post("/v1/plain", json={"text": ""})
        # A max_tokens beyond the window is reduced, not refused: a prompt over it is the refusal.
        too_long = http.post("/v1/plain", json={"text": "x" * (40960 * 32 + 10)})
    assert plain.status_code == 200, plain.text
    body = plain.json()
    assert body["id"].startswith("plain-") and body["tokens"] == reference["usage"]["completion_tokens"]
    # The same chat, template, sampling chain and assembler as OpenAI's route: the same answer.
    assert body["text"] == reference["choices"][0]["message"]["content"]
    assert body["stop_reason"] == reference["choices"][0]["finish_reason"]
    frames = [json.loads(line.removeprefix("data: ")) for line in streamed.text.splitlines() if line]
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert "".join(f.get("text", "") for f in frames) == body["text"]
    assert frames[-1] == {"stop_reason": body["stop_reason"], "tokens": body["tokens"]}
    # Errors, from its decoder and from the pipeline (admission), in the dialect's own shape.
    assert bad.status_code == 400
    assert bad.json() == {"problem": {"status": 400, "message": "text must be a non-empty string", "field": "text"}}
    assert too_long.status_code == 400 and set(too_long.json()) == {"problem"}
