"""Where a turn ends decides its calls, the same on every dialect, streamed or not (issue 42).

Each family's tiny checkpoint is scripted (``Scripted``: the script's tokens, then EOS) to
write two calls with text around them. A turn cut by ``max_tokens`` after the first call says
``length`` (items 3); a cut inside the next call's opening leaks none of it (item 4); a model
that ends its turn inside a call keeps the finished call and drops the unfinished one without
markup (item 5); text between two calls is content (item 8); an empty answer opens no empty
Anthropic text block (item 8).
"""

from __future__ import annotations

import json

import pytest
from support import anthropic_client, openai_client
from test_partial_tool_calls import (  # the scripted servers and the dialects' readers
    DIALECTS,
    MSG,
    TOOLS,
    clients,  # noqa: F401  (the module's server fixture)
    no_markup,
    script_tokens,
)
from tokenizers import Tokenizer

CALL1 = ("get_weather", {"city": "Paris", "days": 3})
CALL2 = ("get_weather", {"city": "Oslo", "days": 1})
Q = '<|"|>'


def _qwen3(city, days):
    return f'<tool_call>\n{json.dumps({"name": "get_weather", "arguments": {"city": city, "days": days}})}\n</tool_call>'


def _xml(city, days):
    return (f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n<parameter=days>\n{days}\n"
            "</parameter>\n</function>\n</tool_call>")


def _cpm(city, days):
    return f'<function name="get_weather"><param name="city">{city}</param><param name="days">{days}</param></function>'


def _gemma(city, days):
    return f"<|tool_call>call:get_weather{{city:{Q}{city}{Q},days:{days}}}<tool_call|>"


#: family → (reasoning prefix, one call's markup, separator between two calls)
TURNS = {
    "qwen3": ("<think>\nplan\n</think>\n\n", _qwen3, "\n"),
    "qwen3_5": ("plan\n</think>\n\n", _xml, "\n"),
    "minicpm5": ("plan\n</think>\n\n", _cpm, ""),
    "gemma4": ("<|channel>thought\nplan<channel|>", _gemma, ""),
}


def two_calls(family, between=None, after=""):
    lead, call, sep = TURNS[family]
    middle = sep if between is None else f"\n{between}\n"
    return lead + "OK.\n" + call("Paris", 3) + middle + call("Oslo", 1) + after


@pytest.mark.parametrize("family", list(TURNS))
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_a_cut_after_a_finished_call_says_length(clients, family, dialect):  # noqa: F811
    """Item 3: ``max_tokens`` ending the turn between two calls, or in the text after them, is
    ``length`` (mlx-lm and vLLM), with the finished calls kept and no markup in content."""
    client, path = clients(family)
    script = two_calls(family, after="\n\nDone.")
    sdk = anthropic_client(client) if dialect == "anthropic" else openai_client(client)
    turn, cut_reason, call_reason = DIALECTS[dialect]
    n = script_tokens(path, script)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = tok.encode(script, add_special_tokens=False).ids
    first_end = len(TURNS[family][0] + "OK.\n" + TURNS[family][1]("Paris", 3))
    after_first = next(k for k in range(1, n + 1) if len(tok.decode(ids[:k], skip_special_tokens=False)) >= first_end)
    for stream in (False, True):
        for max_tokens, calls in ((after_first, [CALL1]), (after_first + 1, [CALL1]), (n - 1, [CALL1, CALL2])):
            reason, got, text, _reasoning = turn(sdk, family, script, max_tokens, stream)
            where = (family, dialect, stream, max_tokens)
            assert (reason, got) == (cut_reason, calls), where
            no_markup(text)
        reason, got, text, _reasoning = turn(sdk, family, script, n + 1, stream)
        assert (reason, got) == (call_reason, [CALL1, CALL2]) and "Done." in text


@pytest.mark.parametrize("family", list(TURNS))
def test_a_cut_inside_the_next_opening_leaks_nothing(clients, family):  # noqa: F811
    """Item 4: every cut inside the second call's opening (``<function name=`` is several
    tokens on MiniCPM5) keeps the first call, says ``length`` and shows none of the opening."""
    client, path = clients(family)
    script = two_calls(family)
    lead, call, sep = TURNS[family]
    second = lead + "OK.\n" + call("Paris", 3) + sep
    opening = {"qwen3": "<tool_call>\n{", "qwen3_5": "<tool_call>\n<function=", "minicpm5": '<function name="',
               "gemma4": "<|tool_call>call:"}[family]
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = tok.encode(script, add_special_tokens=False).ids
    cuts = [k for k in range(1, len(ids)) if len(second) < len(tok.decode(ids[:k], skip_special_tokens=False))
            <= len(second) + len(opening)]
    assert cuts
    oai = openai_client(client)
    for max_tokens in cuts:
        for stream in (False, True):
            reason, calls, text, _reasoning = DIALECTS["openai"][0](oai, family, script, max_tokens, stream)
            assert (reason, calls) == ("length", [CALL1]), (family, max_tokens, stream, text)
            no_markup(text)
            assert text.strip() == "OK."


@pytest.mark.parametrize("family", list(TURNS))
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_the_model_ending_its_turn_inside_a_call(clients, family, dialect):  # noqa: F811
    """Item 5: the script ends (EOS) inside the second call: the first call is kept, the
    unfinished one is no call and shows no markup, the turn ended as the model meant
    (``tool_calls``); the non-streamed answer says so in ``x-mlxrt-partial-tool-call``."""
    client, _path = clients(family)
    whole = two_calls(family)
    script = whole[: whole.rindex("Oslo") + 2]  # "...Os", then EOS
    sdk = anthropic_client(client) if dialect == "anthropic" else openai_client(client)
    turn, _cut_reason, call_reason = DIALECTS[dialect]
    for stream in (False, True):
        reason, calls, text, _reasoning = turn(sdk, family, script, 400, stream)
        assert (reason, calls) == (call_reason, [CALL1]), (family, dialect, stream, text)
        no_markup(text)
        assert text.strip() == "OK."
    if dialect == "openai":
        lone = script[: script.index(TURNS[family][1]("Paris", 3))] + TURNS[family][1]("Paris", 3)[:-15]
        body = {"model": "m", "messages": MSG, "tools": TOOLS, "script": lone, "max_tokens": 400}
        if family == "gemma4":
            body["reasoning_effort"] = "high"
        answer = client.post("/v1/chat/completions", json=body)
        choice = answer.json()["choices"][0]
        assert answer.headers["x-mlxrt-partial-tool-call"] == "dropped"
        assert choice["finish_reason"] == "stop" and not choice["message"].get("tool_calls")
        no_markup(choice["message"]["content"])


@pytest.mark.parametrize("family", list(TURNS))
def test_text_between_two_calls_is_content(clients, family):  # noqa: F811
    """Item 8: the model's text between two calls is kept (mlx-lm keeps it), streamed and not."""
    client, _path = clients(family)
    script = two_calls(family, between="And Oslo too:", after="\n\nDone.")
    oai = openai_client(client)
    for stream in (False, True):
        reason, calls, text, _reasoning = DIALECTS["openai"][0](oai, family, script, 400, stream)
        assert (reason, calls) == ("tool_calls", [CALL1, CALL2])
        assert text == "OK.\nAnd Oslo too:\n\nDone.", (family, stream)


def test_no_empty_anthropic_text_block(clients):  # noqa: F811
    """Item 8: an answer that is only a call cut short has no content blocks; the stream opens
    none either (it used to open an empty text block the message body does not have)."""
    client, path = clients("qwen3")
    script = _qwen3("Paris", 3)
    body = {"model": "m", "messages": MSG, "max_tokens": script_tokens(path, script) - 2, "script": script,
            "tools": [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]}
    message = client.post("/v1/messages", json=body).json()
    assert message["content"] == [] and message["stop_reason"] == "max_tokens"
    events = []
    with client.stream("POST", "/v1/messages", json={**body, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert not [e for e in events if e["type"] == "content_block_start"], events
    assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"] == ["max_tokens"]


#: family → a city value holding the family's own markup (where its format can express it)
MARKED = {"qwen3": 'Paris </tool_call> "<tool_call>"', "qwen3_5": "Paris\n</tool_call>\n<function=x>",
          "minicpm5": "<![CDATA[Paris </param></function> & <x>]]>", "gemma4": "Paris <tool_call|> {x}"}
CITY = {"qwen3": 'Paris </tool_call> "<tool_call>"', "qwen3_5": "Paris\n</tool_call>\n<function=x>",
        "minicpm5": "Paris </param></function> & <x>", "gemma4": "Paris <tool_call|> {x}"}


@pytest.mark.parametrize("family", list(TURNS))
def test_cuts_give_the_same_answer_streamed_and_not_on_every_dialect(clients, family):  # noqa: F811
    """A turn of two calls (the first value holding the family's markup, text between and
    after), cut by ``max_tokens`` at sampled tokens: on every dialect the streamed answer equals
    the non-streamed one, holds exactly the calls finished before the cut, and no markup."""
    client, path = clients(family)
    lead, call, _sep = TURNS[family]
    first = call(MARKED[family], 3) if family != "qwen3" else _qwen3(CITY[family], 3)
    script = lead + "OK.\n" + first + "\nThen:\n" + call("Oslo", 1) + "\nDone."
    ends = [len(lead + "OK.\n" + first), len(script) - len("\nDone.")]
    expected = [("get_weather", {"city": CITY[family], "days": 3}), CALL2]
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = tok.encode(script, add_special_tokens=False).ids
    for dialect, (turn, cut_reason, call_reason) in DIALECTS.items():
        sdk = anthropic_client(client) if dialect == "anthropic" else openai_client(client)
        step = 9 if dialect == "openai" else 19  # the full sweep is tests/test_tool_properties.py
        for max_tokens in [*range(2, len(ids), step), len(ids) - 1, len(ids) + 1]:
            answers = [(*a[:3], a[3] or "") for a in (turn(sdk, family, script, max_tokens, stream)
                                                      for stream in (False, True))]
            where = (family, dialect, max_tokens)
            assert answers[0] == answers[1], where
            reason, calls, text, _reasoning = answers[0]
            reached = len(tok.decode(ids[:max_tokens], skip_special_tokens=False))
            assert calls == expected[: sum(1 for e in ends if e <= reached)], where
            assert reason == (call_reason if max_tokens > len(ids) else cut_reason), where
            no_markup(text)
