"""Anthropic Messages as current Claude Code sends it: ``system`` entries inside ``messages``,
``thinking`` blocks of the tool loop, adaptive thinking and ``output_config.effort``; and the
same conversation giving the same prompt through the OpenAI dialect."""

from __future__ import annotations

import json
import shutil

import pytest
from support import Scripted, anthropic_client, openai_client

from mlxrt import hookimpl

TOOLS = [{"name": "get_weather", "description": "Weather for a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


class Recorder:
    """Keeps each planned request's prompt ids and text (``mlxrt_prepare_request``)."""

    def __init__(self) -> None:
        self.ids: list[tuple[int, ...]] = []
        self.texts: list[str] = []

    @hookimpl
    def mlxrt_prepare_request(self, request, model):
        self.ids.append(tuple(request.prompt_ids))
        self.texts.append(model.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False))


@pytest.fixture
def recorded(mlxrt_tiny_checkpoint, mlxrt_serve):
    recorder = Recorder()
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("scripted", Scripted()), ("recorder", recorder)])
    return client, recorder


def _post(client, messages, **fields):
    resp = client.post("/v1/messages", json={"model": "m", "max_tokens": 4, "script": "ok", "messages": messages,
                                             **fields})
    assert resp.status_code == 200, resp.text
    return resp


# -- system entries inside messages -----------------------------------------------------------------


def test_system_entries_render_at_their_place(recorded):
    """Qwen3's template takes a system message anywhere: the entry is rendered where it was sent
    (string or text blocks), through the official client as through a raw body."""
    client, recorder = recorded
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "system", "content": [{"type": "text", "text": "Reminder: be"},
                                               {"type": "text", "text": "brief.", "cache_control": {"type": "ephemeral"}}]},
                {"role": "user", "content": "List the files."}]
    out = anthropic_client(client).messages.create(
        model="m", max_tokens=4, system="You are a CLI.", messages=messages, extra_body={"script": "ok"},
        extra_headers={"anthropic-beta": "mid-conversation-system-2026-04-07"})
    assert out.content[0].text == "ok"
    assert recorder.texts[-1] == (
        "<|im_start|>system\nYou are a CLI.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>system\nReminder: be\nbrief.<|im_end|>\n"
        "<|im_start|>user\nList the files.<|im_end|>\n<|im_start|>assistant\n")
    counted = client.post("/v1/messages/count_tokens", json={"model": "m", "system": "You are a CLI.",
                                                             "messages": messages})
    assert counted.status_code == 200 and counted.json()["input_tokens"] == len(recorder.ids[-1])


#: Like Gemma's and Mistral's: a system message only as the first message, anything else fails.
STRICT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set loop_messages = messages[1:] %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for m in loop_messages %}{%- if m['role'] == 'system' %}"
    "{{- raise_exception('System role only at the start') }}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + (m['content'] if m['content'] is string else '') + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
#: A template that renders only user, assistant and tool turns: later system messages vanish.
SILENT_TEMPLATE = STRICT_TEMPLATE.replace("{{- raise_exception('System role only at the start') }}",
                                          "{%- continue %}")


@pytest.fixture
def templated(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path):
    def start(template: str | None):
        folder = mlxrt_tiny_checkpoint("qwen3")
        if template is not None:
            folder = tmp_path / "strict"
            shutil.copytree(mlxrt_tiny_checkpoint("qwen3"), folder)
            (folder / "chat_template.jinja").unlink(missing_ok=True)
            config = json.loads((folder / "tokenizer_config.json").read_text())
            (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
        recorder = Recorder()
        return mlxrt_serve(folder, plugins=[("scripted", Scripted()), ("recorder", recorder)]), recorder

    return start


@pytest.mark.parametrize("template", [STRICT_TEMPLATE, SILENT_TEMPLATE, None], ids=["raises", "drops", "qwen3"])
def test_system_entries_keep_each_turns_prompt_a_prefix_of_the_next(templated, template):
    """A template that cannot render a later system message gets it folded into the nearest user
    turn at its place, by a rule that keeps turn N's prompt ids a prefix of turn N+1's, as they
    are where the template renders system messages in place (Qwen3)."""
    client, recorder = templated(template)
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    turn1 = [{"role": "system", "content": "Leading entry."},
             {"role": "user", "content": "Hi"},
             {"role": "system", "content": "Reminder one."},
             {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}]
    turn2 = [*turn1, {"role": "assistant", "content": [call]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
             {"role": "system", "content": "Reminder two."}]
    turn3 = [*turn2, {"role": "assistant", "content": "It is sunny."},
             {"role": "user", "content": "Thanks."},
             {"role": "system", "content": "Reminder three."}]
    turn4 = [*turn3, {"role": "assistant", "content": "You are welcome."}, {"role": "user", "content": "Bye."}]
    responses = [_post(client, turn, system="You are a CLI.") for turn in (turn1, turn2, turn3, turn4)]
    first, second, third, fourth = recorder.ids
    assert first == second[:len(first)] and second == third[:len(second)] and third == fourth[:len(third)]
    # The prompt cache serves each next turn from the one before.
    assert all(r.headers["x-mlxrt-cache"].startswith(("hit", "partial")) for r in responses[1:])
    if template is None:
        assert "<|im_start|>system\nReminder two.<|im_end|>\n" in recorder.texts[3]
        return
    assert recorder.texts[0] == (
        "<|im_start|>system\nYou are a CLI.\n\nLeading entry.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>user\nReminder one.\n\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    # After a tool result: a user turn of its own; after a user turn: joined to it.
    assert "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>user\nReminder two.<|im_end|>\n" in recorder.texts[3]
    assert "<|im_start|>user\nThanks.\n\nReminder three.<|im_end|>\n" in recorder.texts[3]


# -- thinking blocks, adaptive thinking, effort -----------------------------------------------------


def test_thinking_blocks_render_like_reasoning_content(recorded):
    """The same tool loop through both dialects gives the same prompt ids: Anthropic's thinking
    block renders as OpenAI's ``reasoning_content`` does (and counts in count_tokens)."""
    client, recorder = recorded
    anthropic_messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user wants the weather; call the tool.", "signature": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
    ]
    _post(client, anthropic_messages, system="Be brief.", tools=TOOLS)
    openai_client(client).chat.completions.create(
        model="m", max_tokens=4, extra_body={"script": "ok"},
        tools=[{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                 "parameters": t["input_schema"]}} for t in TOOLS],
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None,
                   "reasoning_content": "The user wants the weather; call the tool.",
                   "tool_calls": [{"id": "toolu_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                  {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}])
    anthropic_ids, openai_ids = recorder.ids
    assert anthropic_ids == openai_ids
    assert "<think>\nThe user wants the weather; call the tool.\n</think>" in recorder.texts[0]

    def count(messages):
        return client.post("/v1/messages/count_tokens", json={"model": "m", "system": "Be brief.", "tools": TOOLS,
                                                              "messages": messages}).json()["input_tokens"]

    without = [anthropic_messages[0], {**anthropic_messages[1], "content": anthropic_messages[1]["content"][1:]},
               anthropic_messages[2]]
    assert count(anthropic_messages) == len(anthropic_ids) > count(without)


@pytest.mark.parametrize(("fields", "thinking_on"), [
    ({"thinking": {"type": "adaptive"}}, True),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}}, True),
    ({"output_config": {"effort": "medium"}}, True),
    ({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}}, False),
    ({"thinking": {"type": "disabled"}}, False),
])
def test_adaptive_thinking_and_effort_drive_the_thinking_switch(mlxrt_tiny_checkpoint, mlxrt_serve, fields, thinking_on):
    """With the server's thinking default off, adaptive thinking or an effort turns it on;
    ``disabled`` keeps it off whatever the effort (Qwen3's switch pre-closes the think block)."""
    recorder = Recorder()
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), plugins=[("scripted", Scripted()), ("recorder", recorder)],
                       options={"thinking": False})
    _post(client, [{"role": "user", "content": "Hi"}], **fields)
    assert recorder.texts[-1].endswith("<think>\n\n</think>\n\n") is not thinking_on


def test_reasoning_effort_mapping():
    from mlxrt.plugins.anthropic.decode import reasoning_effort
    from mlxrt.plugins.anthropic.wire import ThinkingConfig

    assert reasoning_effort(None) is None
    assert reasoning_effort(ThinkingConfig("adaptive")) == "high"  # Anthropic's default effort
    assert reasoning_effort(ThinkingConfig("adaptive"), "low") == "low"
    assert reasoning_effort(ThinkingConfig("enabled", 2000)) == "low"
    assert reasoning_effort(ThinkingConfig("enabled", 2000), "max") == "high"
    assert reasoning_effort(None, "medium") == "medium"
    assert reasoning_effort(ThinkingConfig("disabled"), "high") == "none"


def test_fields_without_local_meaning_are_reported(recorded):
    client, _ = recorded
    resp = _post(client, [{"role": "user", "content": "Hi"}], thinking={"type": "adaptive"},
                 output_config={"effort": "low", "format": {"type": "json_schema", "schema": {}}},
                 context_management={"edits": [{"type": "clear_tool_uses_20250919"}]})
    assert resp.headers["x-mlxrt-ignored"] == "context_management, output_config.format"
    strict = client.app.state.host.options
    strict["strict"] = True
    try:
        refused = client.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": [
            {"role": "user", "content": "Hi"}], "output_config": {"format": {}}})
    finally:
        strict["strict"] = False
    assert refused.status_code == 400 and "output_config.format" in refused.json()["error"]["message"]


# -- the fold rule, as a pure function ---------------------------------------------------------------


def test_fold_system_messages_rule():
    from mlxrt.templating import fold_system_messages

    image = [{"type": "text", "text": "look"}, {"type": "image"}]
    folded = fold_system_messages([
        {"role": "system", "content": "A"}, {"role": "system", "content": "B"},
        {"role": "user", "content": image}, {"role": "system", "content": "C"}, {"role": "system", "content": "D"},
        {"role": "assistant", "content": "ok"}, {"role": "system", "content": "E"},
        {"role": "user", "content": "next"}, {"role": "tool", "content": "r"}, {"role": "system", "content": "F"}])
    assert folded == (
        {"role": "system", "content": "A\n\nB"},
        {"role": "user", "content": [*image, {"type": "text", "text": "C\n\nD"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "E\n\nnext"},
        {"role": "tool", "content": "r"},
        {"role": "user", "content": "F"})


def test_fold_keeps_each_turn_a_prefix_of_the_next():
    """Whatever a request holds, appending the answer and more turns never changes how its own
    messages fold."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from mlxrt.templating import fold_system_messages

    roles = st.sampled_from(["system", "user", "assistant", "tool"])

    @settings(max_examples=300, deadline=None)
    @given(base=st.lists(roles, min_size=1, max_size=8), more=st.lists(roles, max_size=6))
    def check(base, more):
        def messages(kinds, start):
            return [{"role": r, "content": f"{r}{start + i}"} for i, r in enumerate(kinds)]

        turn = messages(base, 0)
        nxt = turn + messages(["assistant", *more], len(base))
        before = fold_system_messages(turn)
        assert fold_system_messages(nxt)[:len(before)] == before

    check()
