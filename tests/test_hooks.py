"""One test per hook, each through a real plugin object registered with the host.

A scripted sampler (``mlxrt_sampler`` + a claimed ``script`` field from
``mlxrt_request_fields``) makes the random tiny model "write" a chosen text, so the family
hooks' effects on the response are checked exactly.
"""

from __future__ import annotations

import json

import attrs
import click
import pytest
from click.testing import CliRunner
from support import Scripted, openai_client
from tokenizers import Tokenizer

from mlxrt import ThinkingFormat, ToolCall, ToolStreamMode, hookimpl
from mlxrt.cli import build_cli
from mlxrt.errors import PluginError
from mlxrt.hookspecs import PROJECT
from mlxrt.host import make_host


def chat(client, text=None, **kw):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "temperature": 0, **kw}
    if text is not None:
        body["script"] = text
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_hook_mlxrt_sampler(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("scripted", Scripted())])
    out = chat(client, "Hello, world!")
    assert out["choices"][0]["message"]["content"] == "Hello, world!"
    assert out["choices"][0]["finish_reason"] == "stop"


def test_hook_mlxrt_request_fields(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("scripted", Scripted())])
    bad = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "script": 5})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "script must be of type str"


def test_hook_mlxrt_request_fields_with_a_check(mlxrt_tiny_checkpoint, mlxrt_serve):
    """A claimed field's ``validate`` runs while the request is planned: a bad value is a 400,
    streamed or not (before any frame), on a worker thread, never the event loop."""
    import asyncio

    from mlxrt.errors import InvalidRequest
    from mlxrt.records import RequestField

    seen = []

    def check(value):
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        seen.append((value, on_loop))
        if value < 0:
            raise InvalidRequest("budget must be at least 0", param="budget")

    class Budget:
        @hookimpl
        def mlxrt_request_fields(self, dialect):
            return {"budget": RequestField(int, validate=check)} if dialect == "openai" else None

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("scripted", Scripted()), ("budget", Budget())])
    ask = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
    for stream in (False, True):
        bad = client.post("/v1/chat/completions", json={**ask, "budget": -1, "stream": stream})
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["message"] == "budget must be at least 0"
    assert client.post("/v1/chat/completions", json={**ask, "budget": 3}).status_code == 200
    assert client.post("/v1/chat/completions", json={**ask, "budget": "3"}).status_code == 400  # the type
    assert seen == [(-1, False), (-1, False), (3, False)]


def test_hook_mlxrt_request_fields_conflict_is_a_load_error(mlxrt_tiny_checkpoint, mlxrt_serve):
    class Twin(Scripted):
        pass

    with pytest.raises(PluginError, match="already claimed"):
        mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("scripted", Scripted()), ("twin", Twin())])


def test_hook_mlxrt_thinking_format(mlxrt_tiny_checkpoint, mlxrt_serve):
    class Reasoner:
        @hookimpl
        def mlxrt_thinking_format(self, info):
            return ThinkingFormat(open="<r>", close="</r>") if info.model_type == "llama" else None

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("scripted", Scripted()), ("reasoner", Reasoner())])
    message = chat(client, "<r>because</r>the answer")["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "the answer", "reasoning": "because",
                       "reasoning_content": "because"}
    streamed = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "stream": True, "script": "<r>because</r>the answer"})
    deltas = [json.loads(f[6:])["choices"][0]["delta"] for f in streamed.text.split("\n\n")
              if f.startswith("data: {")]
    assert "".join(d.get("reasoning", "") for d in deltas) == "because"
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "because"
    assert "".join(d.get("content", "") for d in deltas) == "the answer"


class Brackets:
    start, end = "[[", "]]"

    def parse(self, text, tools):
        body = text.split("[[", 1)[1].split("]]", 1)[0]
        obj = json.loads(body)
        return [ToolCall(name=obj["name"], arguments=json.dumps(obj["arguments"]))]


TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def test_hook_mlxrt_tool_parser(mlxrt_tiny_checkpoint, mlxrt_serve):
    class Family:
        @hookimpl
        def mlxrt_tool_parser(self, info):
            return Brackets()

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("scripted", Scripted()), ("family", Family())])
    out = openai_client(client).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
        extra_body={"script": 'ok [[{"name": "lookup", "arguments": {"q": "x"}}]]'})
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "ok "
    (call,) = choice.message.tool_calls
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"q": "x"}
    # Without tools in the request the same text is plain content.
    plain = chat(client, 'ok [[{"name": "lookup", "arguments": {}}]]')
    assert plain["choices"][0]["message"]["content"].startswith("ok [[")


def test_hook_mlxrt_tool_stream_mode(mlxrt_tiny_checkpoint, mlxrt_serve):
    class Family:
        @hookimpl
        def mlxrt_tool_parser(self, info):
            return Brackets()

        @hookimpl
        def mlxrt_tool_stream_mode(self, info, has_tools):
            return ToolStreamMode.PLAIN

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("scripted", Scripted()), ("family", Family())])
    out = chat(client, 'ok [[{"name": "lookup", "arguments": {}}]]', tools=TOOLS)
    assert out["choices"][0]["finish_reason"] == "stop"
    assert "[[" in out["choices"][0]["message"]["content"]


def test_hook_mlxrt_load_model(mlxrt_tiny_checkpoint, mlxrt_serve):
    calls = []

    class Loader:
        @hookimpl
        def mlxrt_load_model(self, info, host):
            from mlxrt.loading import mlx_lm_load

            calls.append(info.model_type)
            return mlx_lm_load(info)

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("loader", Loader())])
    assert calls == ["llama"]
    assert client.app.state.models.primary.engine.profile.provenance["load_model"] == "loader"
    assert chat(client)["choices"][0]["message"]["role"] == "assistant"


def test_hook_mlxrt_vision(mlxrt_tiny_checkpoint, mlxrt_serve):
    class Eyes:
        @hookimpl
        def mlxrt_vision(self, info, host):
            class Adapter:
                def splice(self, prompt_ids, images):
                    raise NotImplementedError

            return Adapter()

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("eyes", Eyes())])
    assert client.get("/v1/models").json()["data"][0]["vision"] is True


def test_hook_mlxrt_chat_template_kwargs(mlxrt_tiny_checkpoint, mlxrt_serve):
    seen = []

    class Family:
        @hookimpl
        def mlxrt_chat_template_kwargs(self, info, request):
            seen.append(request.reasoning_effort)
            return {"marker": "MARK " * 20}

    template = "{{ marker }}{% for m in messages %}{{ m.content }}{% endfor %}"
    plain = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), options={"chat_template": template})
    hooked = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("family", Family())], options={"chat_template": template})
    base = chat(plain, max_tokens=1)["usage"]["prompt_tokens"]
    more = chat(hooked, max_tokens=1, reasoning_effort="low")["usage"]["prompt_tokens"]
    assert more >= base + 20 and seen == ["low"]
    # The client's explicit chat_template_kwargs win over the family's.
    override = chat(hooked, max_tokens=1, chat_template_kwargs={"marker": ""})["usage"]["prompt_tokens"]
    assert override == base


def test_hook_mlxrt_prompt_canonicalize(mlxrt_tiny_checkpoint, mlxrt_serve):
    class OneToken:
        @hookimpl
        def mlxrt_prompt_canonicalize(self, request, dialect):
            return attrs.evolve(request, max_tokens=1) if dialect == "openai" else None

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("one", OneToken())])
    assert chat(client, max_tokens=30)["usage"]["completion_tokens"] == 1


def test_hook_mlxrt_logits_processors(mlxrt_tiny_checkpoint, mlxrt_serve):
    target = 300

    class OnlyOne:
        @hookimpl
        def mlxrt_logits_processors(self, request, info):
            import mlx.core as mx

            def force(tokens, logits):
                keep = mx.arange(logits.shape[-1]) == target
                return mx.where(keep, logits, -mx.inf)

            return [force]

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("only", OnlyOne())])
    out = chat(client, max_tokens=5, temperature=1.0)
    tok = Tokenizer.from_file(str(mlxrt_tiny_checkpoint("llama") / "tokenizer.json"))
    assert out["choices"][0]["message"]["content"] == tok.decode([target] * 5)


def test_hook_mlxrt_routes(mlxrt_tiny_checkpoint, mlxrt_serve):
    from litestar import get, post

    @get("/example/ping")
    async def ping() -> dict:
        return {"pong": True}

    @post("/v1/chat/completions", status_code=200)
    async def hijack() -> dict:
        return {"hijacked": True}

    class Endpoints:
        @hookimpl
        def mlxrt_routes(self, host):
            return [ping, hijack]

    class Second:
        @hookimpl
        def mlxrt_routes(self, host):
            @get("/example/ping")
            async def again() -> dict:
                return {"second": True}

            return [again]

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("endpoints", Endpoints()), ("second", Second())])
    # Third-party plugins run before built-ins: "second" was registered last, so it wins the path.
    assert client.get("/example/ping").json() == {"second": True}
    conflicts = client.app.state.host.route_conflicts
    assert any(c.startswith("endpoints: GET /example/ping") for c in conflicts)
    assert "GET /example/ping" in client.get("/v1").json()["endpoints"]


def test_hook_mlxrt_startup(mlxrt_tiny_checkpoint):
    events = []

    class Life:
        @hookimpl
        def mlxrt_startup(self, model):
            async def later():
                events.append(("startup", model.info.model_type))

            return later()

    class Broken:
        @hookimpl
        def mlxrt_startup(self, host):
            raise RuntimeError("no database")

        @hookimpl
        def mlxrt_routes(self, host):
            from litestar import get

            @get("/broken/ping", sync_to_thread=False)
            def ping() -> dict:
                return {"ok": True}

            return [ping]

    from litestar.testing import TestClient

    from mlxrt.cli import build_server

    host = make_host(extra=[("life", Life()), ("broken", Broken())])
    app = build_server(host, str(mlxrt_tiny_checkpoint("llama")), {})
    assert events == []
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert events == [("startup", "llama")]  # after the model loaded, before the first request
        assert client.get("/broken/ping").status_code == 503  # the failed plugin's routes
        assert host.records["broken"].status == "failed" and "no database" in host.records["broken"].error
        assert client.get("/health").status_code == 200  # the server started without it
    app.state.models.stop()


def test_hook_mlxrt_shutdown(mlxrt_tiny_checkpoint):
    events = []

    class Flush:
        @hookimpl
        def mlxrt_shutdown(self, model):
            async def later():
                events.append(("flush", model.info.model_type))  # the model is still there

            return later()

    class Broken:
        @hookimpl
        def mlxrt_shutdown(self, host):
            events.append(("broken", None))
            raise RuntimeError("disk gone")

    from litestar.testing import TestClient

    from mlxrt.cli import build_server

    host = make_host(extra=[("flush", Flush()), ("broken", Broken())])
    app = build_server(host, str(mlxrt_tiny_checkpoint("llama")), {})
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert client.get("/health").status_code == 200
        assert events == []
    # Last registered first; the one that raised does not keep the others from shutting down.
    assert events == [("broken", None), ("flush", "llama")]
    assert host.records["broken"].status == "failed" and "disk gone" in host.records["broken"].error
    app.state.models.stop()


def test_hook_mlxrt_serve_options(tmp_path):
    class Cli:
        @hookimpl
        def mlxrt_serve_options(self):
            return [click.Option(["--example-knob"], default="off", help="An example plugin knob.")]

    host = make_host(extra=[("cli", Cli())])
    runner = CliRunner()
    assert "--example-knob" in runner.invoke(build_cli(host), ["serve", "--help"]).output
    result = runner.invoke(build_cli(host), ["serve", str(tmp_path / "missing"), "--example-knob", "on"])
    assert result.exit_code != 0 and host.options["example_knob"] == "on"


def test_hook_mlxrt_register_commands():
    class Cli:
        @hookimpl
        def mlxrt_register_commands(self, cli):
            @cli.command()
            def hello():
                """Say hello."""
                click.echo("hello from a plugin")

    host = make_host(extra=[("cli", Cli())])
    runner = CliRunner()
    assert "Say hello." in runner.invoke(build_cli(host), ["--help"]).output
    assert runner.invoke(build_cli(host), ["hello"]).output == "hello from a plugin\n"


def test_every_hook_has_a_test_and_is_documented():
    """Each hookspec has ``def test_hook_<name>`` in this module, a section in
    docs/plugins/hooks.md and a docstring whose ``versionadded`` names a released-or-current
    version (no marker may promise a version the package has not reached)."""
    import ast
    import re
    from pathlib import Path

    import mlxrt
    import mlxrt.hookspecs as specs

    hooks = sorted(n for n in dir(specs) if n.startswith(f"{PROJECT}_"))
    assert len(hooks) >= 19
    tests = {node.name for node in ast.parse(Path(__file__).read_text()).body if isinstance(node, ast.FunctionDef)}
    docs = (Path(__file__).resolve().parents[1] / "docs" / "plugins" / "hooks.md").read_text()
    current = tuple(int(part) for part in mlxrt.__version__.split(".")[:2])
    for name in hooks:
        assert f"test_hook_{name}" in tests, f"no def test_hook_{name} in tests/test_hooks.py"
        assert f"`{name}(" in docs, f"{name} missing from docs/plugins/hooks.md"
        doc = getattr(specs, name).__doc__
        assert doc, f"{name} has no docstring"
        added = re.findall(r"\.\. versionadded:: (\d+)\.(\d+)", doc)
        assert len(added) == 1, f"{name}: one versionadded marker, not {len(added)}"
        assert tuple(map(int, added[0])) <= current, f"{name}: versionadded names an unreleased version"
    for text in (Path(specs.__file__).read_text(), docs):
        for found in re.findall(r"(?:[Aa]dded in|versionadded::|[Nn]ew in) v?(\d+)\.(\d+)", text):
            assert tuple(map(int, found)) <= current, f"a version marker names {'.'.join(found)}"


def test_hook_mlxrt_prepare_request(mlxrt_tiny_checkpoint, mlxrt_serve):
    from mlxrt.errors import InvalidRequest

    seen = []

    class Gate:
        @hookimpl
        def mlxrt_prepare_request(self, request, info, host):
            seen.append(request.request_id)
            if "forbidden" in request.stop:
                raise InvalidRequest("forbidden stop string", param="stop")

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("gate", Gate())])
    msg = [{"role": "user", "content": "x"}]
    ok = client.post("/v1/chat/completions", json={"messages": msg, "max_tokens": 2})
    assert ok.status_code == 200 and seen and seen[-1] == ok.json()["id"]
    bad = client.post("/v1/chat/completions", json={"messages": msg, "max_tokens": 2, "stop": ["forbidden"]})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "forbidden stop string"


def test_hook_mlxrt_capabilities(mlxrt_tiny_checkpoint, mlxrt_serve):
    """Structured outputs are a declared capability: implementing ``mlxrt_prepare_request``
    (as the grammar plugin also does) does not make the server accept ``response_format``."""
    from mlxrt.records import Capabilities

    class Gate:
        @hookimpl
        def mlxrt_prepare_request(self, request, info, host):
            return None

    class Declares:
        def __init__(self):
            self.seen = []

        @hookimpl
        def mlxrt_capabilities(self):
            return ["structured_outputs"]

        @hookimpl
        def mlxrt_prepare_request(self, request):
            self.seen.append(request.structured)

    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
            "response_format": {"type": "json_object"}}
    model = mlxrt_tiny_checkpoint("llama")
    builtin = mlxrt_serve(model)
    assert builtin.app.state.models.primary.model.capabilities == Capabilities(structured_outputs=True)
    undeclared = mlxrt_serve(model, plugins=[("gate", Gate())], disable=("structured",))
    assert undeclared.app.state.models.primary.model.capabilities == Capabilities()
    refused = undeclared.post("/v1/chat/completions", json=body)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "response_format is not supported by this server yet"
    declares = Declares()
    declared = mlxrt_serve(model, plugins=[("declares", declares)], disable=("structured",))
    assert declared.post("/v1/chat/completions", json=body).status_code == 200
    assert [s.kind for s in declares.seen] == ["json_object"]


def test_hook_mlxrt_turn_finished(mlxrt_tiny_checkpoint, mlxrt_serve):
    import threading

    turns, threads = [], []

    class Observer:
        @hookimpl
        def mlxrt_turn_finished(self, turn, host):
            threads.append(threading.current_thread())
            turns.append(turn)

    class Faulty:
        @hookimpl
        def mlxrt_turn_finished(self, turn):
            raise RuntimeError("observer broke")

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("scripted", Scripted()), ("observer", Observer()),
                                                     ("faulty", Faulty())])
    ask = [{"role": "user", "content": "Capital of France?"}]
    assert chat(client, "Paris.", messages=ask)["choices"][0]["message"]["content"] == "Paris."
    stream = client.post("/v1/chat/completions", json={"messages": ask, "max_tokens": 40, "stream": True,
                                                       "script": "Lyon."})
    assert stream.status_code == 200 and "data: [DONE]" in stream.text
    anthropic = client.post("/v1/messages", json={"model": "m", "max_tokens": 40, "messages": ask,
                                                  "script": "Nice.", "stream": True})
    assert anthropic.status_code == 200 and "message_stop" in anthropic.text
    responses = client.post("/v1/responses", json={"model": "m", "input": "Capital of France?",
                                                   "script": "Lille."})
    assert responses.status_code == 200, responses.text
    # Text completions are not chat turns.
    assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    # Observers run off the event loop, on one thread, in order: wait for the fourth.
    import time

    deadline = time.monotonic() + 10
    while len(turns) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threads and all(t is not threading.main_thread() and t.name.startswith("mlxrt-turn-observers")
                           for t in threads)
    assert [(t.dialect, t.content, t.finish_reason) for t in turns] == [
        ("openai", "Paris.", "stop"), ("openai", "Lyon.", "stop"), ("anthropic", "Nice.", "stop"),
        ("responses", "Lille.", "stop")]
    assert all(t.messages[-1]["content"] == "Capital of France?" for t in turns)
    assert turns[0].request_id.startswith("chatcmpl-") and turns[0].model


PROMPT_TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
                {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
TOOL_MSG = [{"role": "user", "content": "Time?"}]


class ToolPromptPlugin:
    """A family's own tool prompt (``mlxrt_tool_prompt``): calls as ``[CALL]{json}[/CALL]``."""

    class Parser:
        start, end = "[CALL]", "[/CALL]"

        def parse(self, text, tools):
            from mlxrt import ToolCall

            body = json.loads(text[len(self.start):text.index(self.end)])
            return [ToolCall(name=body["name"], arguments=json.dumps(body["arguments"]))]

    class Prompt:
        def __init__(self):
            self.parser = ToolPromptPlugin.Parser()

        def render(self, messages, tools):
            names = ", ".join(t["function"]["name"] for t in tools)
            return [{"role": "system", "content": f"PLUGIN TOOLS: {names}"}, *messages]

    @hookimpl
    def mlxrt_tool_prompt(self, info):
        return self.Prompt()


def test_hook_mlxrt_tool_prompt(mlxrt_tiny_checkpoint, mlxrt_serve):
    """A model whose template renders no tools gets the plugin's own tool prompt and parser."""
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("scripted", Scripted()), ("prompt", ToolPromptPlugin())])
    oai = openai_client(client)
    script = '[CALL]{"name": "get_time", "arguments": {}}[/CALL]'
    out = oai.chat.completions.create(model="m", messages=TOOL_MSG, tools=PROMPT_TOOLS, max_tokens=60,
                                      extra_body={"script": script})
    assert [(c.function.name, c.function.arguments) for c in out.choices[0].message.tool_calls] == [("get_time", "{}")]
    system = [{"role": "system", "content": "Be brief."}, *TOOL_MSG]  # (else the template adds its own)
    bare = oai.chat.completions.create(model="m", messages=system, max_tokens=1)
    with_tools = oai.chat.completions.create(model="m", messages=system, tools=PROMPT_TOOLS, max_tokens=1)
    assert 4 < with_tools.usage.prompt_tokens - bare.usage.prompt_tokens < 40  # its short text, not ours
