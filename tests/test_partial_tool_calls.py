"""A turn cut short inside a tool call never reports a call (issue 32, item 1).

Each family's tiny checkpoint is scripted to write its own turn (reasoning, one
``get_weather`` call, end of turn). For every ``max_tokens`` that stops the script before the
call's end marker, every dialect (OpenAI chat, Anthropic messages, Responses), streamed and
not, must say the answer was cut (``length`` / ``max_tokens`` / ``incomplete``), carry no tool
call and show no call markup; the non-streamed answer says so in ``x-mlxrt-partial-tool-call``.
With the whole script the call is exact.
"""

from __future__ import annotations

import json

import pytest
from support import Scripted, anthropic_client, openai_client
from tokenizers import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}]
MSG = [{"role": "user", "content": "Weather in Paris?"}]
MINICPM5 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
CALL = ("get_weather", {"city": "Paris", "days": 3})

#: family → (tiny model type, config overrides, extra request fields, the scripted turn)
FAMILIES = {
    "qwen3": ("qwen3", None, {}, '<think>\nplan\n</think>\n\nOK.\n<tool_call>\n{"name": "get_weather", '
              '"arguments": {"city": "Paris", "days": 3}}\n</tool_call>'),
    "qwen3_5": ("qwen3_5", None, {}, "plan\n</think>\n\nOK.\n<tool_call>\n<function=get_weather>\n"
                "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
                "</tool_call>"),
    "minicpm5": ("minicpm", MINICPM5, {}, 'plan\n</think>\n\nOK.\n<function name="get_weather">'
                 '<param name="city">Paris</param><param name="days">3</param></function>'),
    "gemma4": ("gemma4_text", None, {"reasoning_effort": "high"},
               '<|channel>thought\nplan<channel|>OK.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}'
               "<tool_call|>"),
}
MARKUP = ("<think", "</think", "<tool_call", "tool_call>", "tool_call|>", "<function", "</function", "<param",
          "</param", "<|channel", "<channel|>", "call:", "<|\"|>", "<parameter")


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    """One in-process server per family (module scope: each test sends many requests)."""
    from litestar.testing import TestClient

    from mlxrt.cli import build_server
    from mlxrt.host import make_host
    from mlxrt.testing import write_tiny_checkpoint

    made, opened = {}, []

    def get(family):
        if family not in made:
            model_type, overrides, _kw, _script = FAMILIES[family]
            path = write_tiny_checkpoint(tmp_path_factory.mktemp(family) / family, model_type,
                                         config_overrides=overrides)
            host = make_host(extra=(Scripted(),))
            app = build_server(host, str(path), {"host": "127.0.0.1", "port": 0, "model_fallback": True})
            client = TestClient(app, base_url="http://127.0.0.1")
            client.__enter__()
            opened.append((client, app))
            made[family] = (client, path)
        return made[family]

    yield get
    for client, app in opened:
        client.__exit__(None, None, None)
        app.state.models.stop()


def script_tokens(path, script):
    return len(Tokenizer.from_file(str(path / "tokenizer.json")).encode(script, add_special_tokens=False).ids)


def no_markup(text):
    assert not any(m in (text or "") for m in MARKUP), text


def openai_turn(oai, family, script, max_tokens, stream):
    kwargs = FAMILIES[family][2]
    out = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=max_tokens, stream=stream,
                                      extra_body={"script": script}, **kwargs)
    if not stream:
        msg = out.choices[0].message
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []]
        return out.choices[0].finish_reason, calls, msg.content or "", (msg.model_extra or {}).get("reasoning_content")
    content, reasoning, calls, finish = [], [], [], []
    for chunk in out:
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
        calls += [(c.function.name, json.loads(c.function.arguments)) for c in delta.tool_calls or []]
        finish += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
    assert len(finish) == 1
    return finish[0], calls, "".join(content), "".join(reasoning)


def anthropic_turn(ant, family, script, max_tokens, stream):
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 1024}} if family == "gemma4" else {}
    args = dict(model="m", messages=MSG, tools=ANTHROPIC_TOOLS, max_tokens=max_tokens,
                extra_body={"script": script, **thinking})
    if stream:
        with ant.messages.stream(**args) as s:
            msg = s.get_final_message()
    else:
        msg = ant.messages.create(**args)
    calls = [(b.name, b.input) for b in msg.content if b.type == "tool_use"]
    text = "".join(b.text for b in msg.content if b.type == "text")
    reasoning = "".join(b.thinking for b in msg.content if b.type == "thinking")
    return msg.stop_reason, calls, text, reasoning


def responses_turn(oai, family, script, max_tokens, stream):
    kwargs = {"reasoning": {"effort": "high"}} if family == "gemma4" else {}
    args = dict(model="m", input=MSG, tools=RESPONSES_TOOLS, max_output_tokens=max_tokens,
                extra_body={"script": script}, **kwargs)
    if stream:
        events = list(oai.responses.create(stream=True, **args))
        done = [e for e in events if e.type in ("response.completed", "response.incomplete")]
        assert len(done) == 1
        resp = done[0].response
    else:
        resp = oai.responses.create(**args)
    calls = [(i.name, json.loads(i.arguments)) for i in resp.output if i.type == "function_call"]
    text = "".join(c.text for i in resp.output if i.type == "message" for c in i.content if c.type == "output_text")
    reasoning = "".join(c.text for i in resp.output if i.type == "reasoning" for c in (i.content or []))
    return resp.status, calls, text, reasoning


DIALECTS = {"openai": (openai_turn, "length", "tool_calls"),
            "anthropic": (anthropic_turn, "max_tokens", "tool_use"),
            "responses": (responses_turn, "incomplete", "completed")}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_every_cut_inside_the_turn_is_no_call(clients, family, dialect):
    client, path = clients(family)
    script = FAMILIES[family][3]
    n = script_tokens(path, script)
    sdk = anthropic_client(client) if dialect == "anthropic" else openai_client(client)
    turn, cut_reason, call_reason = DIALECTS[dialect]
    for stream in (False, True):
        reason, calls, text, reasoning = turn(sdk, family, script, n + 1, stream)  # the whole turn, and EOS
        assert (reason, calls) == (call_reason, [CALL]), (family, dialect, stream)
        assert text.strip() == "OK." and (reasoning or "").strip() == "plan"
        # Every cut before the call's last token; streamed on the other dialects, every third
        # cut and the last ones (the stream framing is theirs, the routing is shared).
        cuts = range(1, n) if not stream or dialect == "openai" else [*range(1, n - 3, 3), *range(n - 3, n)]
        for max_tokens in cuts:
            reason, calls, text, reasoning = turn(sdk, family, script, max_tokens, stream)
            where = (family, dialect, stream, max_tokens)
            assert reason == cut_reason and calls == [], where
            no_markup(text)
            no_markup(reasoning)
            assert "plan".startswith((reasoning or "").strip()) or (reasoning or "").strip() == "plan", where


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_header_says_a_partial_call_was_dropped(clients, family, caplog):
    client, path = clients(family)
    script = FAMILIES[family][3]
    n = script_tokens(path, script)
    body = {"model": "m", "messages": MSG, "tools": TOOLS, "script": script, **FAMILIES[family][2]}
    cut = client.post("/v1/chat/completions", json={**body, "max_tokens": n - 1})
    assert cut.status_code == 200 and cut.headers["x-mlxrt-partial-tool-call"] == "dropped"
    assert cut.json()["choices"][0]["finish_reason"] == "length"
    assert any("dropped an unfinished tool call" in r.getMessage() for r in caplog.records)
    whole = client.post("/v1/chat/completions", json={**body, "max_tokens": n + 1})
    assert "x-mlxrt-partial-tool-call" not in whole.headers
    before = client.post("/v1/chat/completions", json={**body, "max_tokens": 2})  # inside the reasoning
    assert "x-mlxrt-partial-tool-call" not in before.headers


def test_calls_closed_before_the_cut_are_kept(clients):
    """Two calls, cut inside the second: the first is returned, the answer says ``length``."""
    client, path = clients("qwen3")
    first = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    script = first + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os'
    oai = openai_client(client)
    for stream in (False, True):
        reason, calls, text, _reasoning = openai_turn(oai, "qwen3", script, script_tokens(path, script), stream)
        assert (reason, calls) == ("length", [CALL]) and not text.strip()


def test_a_stop_string_inside_a_call_is_no_call(clients):
    """A stop string that ends the turn inside a call: no call, no markup, and ``length`` (the
    turn did not end where the model meant it to), as for ``max_tokens`` (issue 32)."""
    client, _path = clients("qwen3")
    script = FAMILIES["qwen3"][3]
    oai = openai_client(client)
    for stream in (False, True):
        out = oai.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=200, stop=["Paris"],
                                          stream=stream, extra_body={"script": script})
        if stream:
            chunks = list(out)
            assert not any(c.choices[0].delta.tool_calls for c in chunks)
            assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
            no_markup("".join(c.choices[0].delta.content or "" for c in chunks))
        else:
            assert out.choices[0].finish_reason == "length" and not out.choices[0].message.tool_calls
            no_markup(out.choices[0].message.content)
