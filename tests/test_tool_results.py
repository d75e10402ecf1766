"""Tool results in the prompt (issue 42, items 6 and 7), through every dialect's official client.

Item 6: on the generic tier tool results are user turns; after parallel calls two come in a
row, and a template that insists on alternating roles (Gemma 3's) refused the conversation
with a 400. They are now joined into one user turn when the template refuses.

Item 7: a tool result names the function it answers in every dialect: Anthropic's
``tool_use_id``, OpenAI's ``tool_call_id`` and Responses' ``call_id`` are mapped back to the
call, so Gemma 4's template writes ``response:get_weather{…}``, not ``response:tool{…}``.

A plugin records each request's prompt (``mlxrt_prepare_request``), so the tests read the
prompt the model was given.
"""

from __future__ import annotations

import pytest
from conftest import shared_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from support import anthropic_client, openai_client
from tokenizers import Tokenizer

from mlxrt import hookimpl
from mlxrt.templating import merge_user_runs, name_tool_results

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
                                                                               "properties": {}}}}]
CALLS = [{"id": "call_w", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
         {"id": "call_t", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]
#: A parallel-call round trip, OpenAI's shape: two results in a row, answered out of order.
OPENAI_TURNS = [
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": CALLS},
    {"role": "tool", "tool_call_id": "call_t", "content": "RESULT-TIME 14:05"},
    {"role": "tool", "tool_call_id": "call_w", "content": "RESULT-WEATHER sunny"},
]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]
ANTHROPIC_TURNS = [
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_w", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_t", "name": "get_time", "input": {}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_t", "content": "RESULT-TIME 14:05"},
        {"type": "tool_result", "tool_use_id": "toolu_w", "content": "RESULT-WEATHER sunny"}]},
]
RESPONSES_INPUT = [
    {"type": "message", "role": "user", "content": "Weather and time in Paris?"},
    {"type": "function_call", "call_id": "call_w", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call", "call_id": "call_t", "name": "get_time", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_t", "output": "RESULT-TIME 14:05"},
    {"type": "function_call_output", "call_id": "call_w", "output": "RESULT-WEATHER sunny"},
]
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]

#: Gemma 3's rule, as its template states it (a template of our own, for CI without the real one).
ALTERNATING = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] if message['content'] is string else "
    "message['content'] | map(attribute='text') | join('')) + '<|im_end|>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")

class Prompts:
    """Records each request's prompt text."""

    def __init__(self):
        self.seen = []

    @hookimpl
    def mlxrt_prepare_request(self, request, info, host):
        tok = Tokenizer.from_file(str(info.path / "tokenizer.json"))
        self.seen.append(tok.decode(list(request.prompt_ids), skip_special_tokens=False))


def _every_dialect(client):
    """Send the same round trip through OpenAI chat, Anthropic Messages and Responses."""
    openai_client(client).chat.completions.create(model="m", messages=OPENAI_TURNS, tools=TOOLS, max_tokens=1)
    anthropic_client(client).messages.create(model="m", messages=ANTHROPIC_TURNS, tools=ANTHROPIC_TOOLS,
                                             max_tokens=1)
    resp = client.post("/v1/responses", json={"model": "m", "input": RESPONSES_INPUT, "tools": RESPONSES_TOOLS,
                                              "max_output_tokens": 1})
    assert resp.status_code == 200, resp.text


# -- item 6: consecutive tool results on a template that wants alternating roles ------------------


def _check_joined(prompt):
    # both results reach the prompt, in one user turn (no model turn between them)
    time, weather = prompt.index("RESULT-TIME"), prompt.index("RESULT-WEATHER")
    assert time < weather
    between = prompt[time:weather]
    assert "model" not in between and "assistant" not in between


def test_generic_tier_on_the_real_gemma3_template(mlxrt_tiny_checkpoint, mlxrt_serve):
    prompts = Prompts()
    path = mlxrt_tiny_checkpoint("gemma3_text", tokenizer_dir=shared_tokenizer("gemma3"))
    client = mlxrt_serve(path, plugins=[("prompts", prompts)])
    assert client.get("/v1/models").json()["data"][0]["tier"] == "generic"
    _every_dialect(client)
    assert len(prompts.seen) == 3
    for prompt in prompts.seen:
        _check_joined(prompt)
        assert prompt.count("<start_of_turn>user") == 2  # the question, then both results


def test_generic_tier_on_a_template_that_wants_alternating_roles(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path):
    template = tmp_path / "alternating.jinja"
    template.write_text(ALTERNATING)
    prompts = Prompts()
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("prompts", prompts)],
                         options={"chat_template": str(template)})
    _every_dialect(client)
    for prompt in prompts.seen:
        _check_joined(prompt)
        assert prompt.count("<|im_start|>user") == 2
    # a conversation the template refuses for another reason is still the client's 400
    bad = client.post("/v1/chat/completions", json={"model": "m", "max_tokens": 1, "messages": [
        {"role": "assistant", "content": "hi"}, {"role": "user", "content": "?"}]})
    assert bad.status_code == 400 and "roles must alternate" in bad.json()["error"]["message"]


# -- item 7: the result names its function ---------------------------------------------------------


def test_gemma4_tool_results_name_their_function_in_every_dialect(mlxrt_tiny_checkpoint, mlxrt_serve):
    prompts = Prompts()
    client = mlxrt_serve(mlxrt_tiny_checkpoint("gemma4_text"), plugins=[("prompts", prompts)])
    _every_dialect(client)
    assert len(prompts.seen) == 3
    for prompt in prompts.seen:
        assert "response:tool{" not in prompt
        time, weather = prompt.index("response:get_time{"), prompt.index("response:get_weather{")
        assert prompt.index("RESULT-TIME") > time and prompt.index("RESULT-WEATHER") > weather


def test_results_without_ids_name_the_call_at_their_place(mlxrt_tiny_checkpoint, mlxrt_serve):
    """An OpenAI tool message with neither ``name`` nor a known ``tool_call_id`` answers the
    call at its place; a ``name`` the client gave is kept."""
    prompts = Prompts()
    client = mlxrt_serve(mlxrt_tiny_checkpoint("gemma4_text"), plugins=[("prompts", prompts)])
    turns = [OPENAI_TURNS[0], {"role": "assistant", "content": None, "tool_calls": CALLS},
             {"role": "tool", "tool_call_id": "unknown", "content": "FIRST"},
             {"role": "tool", "tool_call_id": "unknown", "name": "custom_name", "content": "SECOND"}]
    openai_client(client).chat.completions.create(model="m", messages=turns, tools=TOOLS, max_tokens=1)
    (prompt,) = prompts.seen
    assert "response:get_weather{" in prompt and "response:custom_name{" in prompt


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_named_results_reach_the_generic_prompt_too(mlxrt_tiny_checkpoint, mlxrt_serve, dialect):
    """The generic tier renders results as user turns; naming them changes nothing there."""
    prompts = Prompts()
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("prompts", prompts)])
    if dialect == "openai":
        openai_client(client).chat.completions.create(model="m", messages=OPENAI_TURNS, tools=TOOLS, max_tokens=1)
    else:
        anthropic_client(client).messages.create(model="m", messages=ANTHROPIC_TURNS, tools=ANTHROPIC_TOOLS,
                                                 max_tokens=1)
    (prompt,) = prompts.seen
    assert prompt.count("<tool_response>\nRESULT-") == 2


# -- the two message rules on their own: a conversation that grows keeps its prefix ----------------

_MESSAGE = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, st.sampled_from(["q", "r", ""])),
    st.builds(lambda ids: {"role": "assistant", "content": "", "tool_calls": [
        {"id": i, "type": "function", "function": {"name": f"fn_{i}", "arguments": "{}"}} for i in ids]},
        st.lists(st.sampled_from(["a", "b", "c"]), max_size=3)),
    st.builds(lambda i, named: {"role": "tool", "tool_call_id": i, "content": "x", **({"name": "given"} if named else {})},
              st.sampled_from(["a", "b", "zz"]), st.booleans()),
    st.just({"role": "system", "content": "s"}),
)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.lists(_MESSAGE, max_size=10), _MESSAGE)
def test_naming_and_joining_keep_a_growing_conversation_s_prefix(conversation, more):
    named = name_tool_results(conversation)
    assert name_tool_results([*conversation, more])[: len(conversation)] == named
    for k, (message, original) in enumerate(zip(named, conversation, strict=True)):
        if original["role"] == "tool":
            calls = {c["id"] for m in conversation[:k] if m["role"] == "assistant" for c in m.get("tool_calls", ())}
            if original.get("name"):
                assert message["name"] == original["name"]
            elif original["tool_call_id"] in calls:
                assert message["name"] == f"fn_{original['tool_call_id']}"
        else:
            assert message == original
    if more["role"] != "user":
        assert merge_user_runs([*conversation, more]) == (*merge_user_runs(conversation), more)
    joined = merge_user_runs(conversation)
    assert not any(a["role"] == b["role"] == "user" for a, b in zip(joined, joined[1:], strict=False))
