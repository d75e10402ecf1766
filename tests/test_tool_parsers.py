import json

import pytest

from mlxrt import ToolStreamMode
from mlxrt.families.qwen.tools import Qwen3JsonParser, Qwen3XmlParser
from mlxrt.text.tool_calls import ToolRouter

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "metric": {"type": "boolean"}}}}}]


def test_qwen3_json_two_calls():
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>')
    calls = Qwen3JsonParser().parse(text, TOOLS)
    assert [c.name for c in calls] == ["get_weather", "get_weather"]
    assert json.loads(calls[1].arguments) == {"city": "Oslo", "days": 2}


def test_qwen3_xml_typed_by_schema():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>")
    (call,) = Qwen3XmlParser().parse(text, TOOLS)
    assert json.loads(call.arguments) == {"city": "New York", "days": 3, "metric": True}


def test_qwen3_json_malformed_raises():
    with pytest.raises(ValueError):
        Qwen3JsonParser().parse("<tool_call>{not json</tool_call>", TOOLS)


def test_router_streams_content_then_parses_calls():
    router = ToolRouter(Qwen3JsonParser(), TOOLS, ToolStreamMode.BUFFERED_TEXT)
    out = router.feed("Let me check. <tool")
    out += router.feed('_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>')
    routed = router.finish()
    assert out == "Let me check. "
    assert routed.calls[0].name == "get_weather" and routed.calls[0].id.startswith("call_")


def test_router_malformed_call_becomes_content_with_warning():
    router = ToolRouter(Qwen3JsonParser(), TOOLS, ToolStreamMode.BUFFERED_TEXT)
    router.feed("<tool_call>{broken}</tool_call>")
    routed = router.finish()
    assert routed.calls == () and routed.content == "<tool_call>{broken}</tool_call>" and routed.warning
    assert not routed.dropped


def test_router_inactive_without_tools():
    router = ToolRouter(Qwen3JsonParser(), None, ToolStreamMode.BUFFERED_TEXT)
    assert router.feed("<tool_call>x") == "<tool_call>x"


def test_minicpm5_cdata_and_parallel_calls_typed():
    from mlxrt.families.minicpm5.tools import MiniCPM5Parser

    text = ('<function name="get_weather"><param name="city"><![CDATA[A & B\n<x>]]></param>'
            '<param name="days">4</param><param name="metric">true</param></function>'
            '<function name="get_weather"><param name="city">Oslo</param></function>')
    calls = MiniCPM5Parser().parse(text, TOOLS)
    assert [json.loads(c.arguments) for c in calls] == [{"city": "A & B\n<x>", "days": 4, "metric": True},
                                                      {"city": "Oslo"}]


def test_minicpm5_malformed_raises():
    from mlxrt.families.minicpm5.tools import MiniCPM5Parser

    with pytest.raises(ValueError):
        MiniCPM5Parser().parse('<function name=', TOOLS)


def test_gemma4_nested_objects_and_two_calls():
    from mlxrt.families.gemma4.tools import Gemma4Parser

    tools = [{"type": "function", "function": {"name": "plan", "parameters": {"type": "object", "properties": {
        "trip": {"type": "object", "properties": {"to": {"type": "string"}, "nights": {"type": "integer"}}},
        "tags": {"type": "array", "items": {"type": "string"}}}}}}]
    text = ('<|tool_call>call:plan{trip:{to:<|"|>Rome, {old} town<|"|>,nights:2},tags:[<|"|>a<|"|>]}<tool_call|>'
            '<|tool_call>call:plan{trip:{to:<|"|>Oslo<|"|>,nights:1}}<tool_call|>')
    calls = Gemma4Parser().parse(text, tools)
    assert [json.loads(c.arguments) for c in calls] == [
        {"trip": {"to": "Rome, {old} town", "nights": 2}, "tags": ["a"]}, {"trip": {"to": "Oslo", "nights": 1}}]


def test_gemma4_malformed_raises():
    from mlxrt.families.gemma4.tools import Gemma4Parser

    with pytest.raises(ValueError):
        Gemma4Parser().parse("<|tool_call>call:plan{trip:<tool_call|>", TOOLS)


def test_typed_arguments_follow_the_schema():
    from mlxrt.text.tool_calls import typed_arguments

    args = {"city": 42, "days": "3", "metric": "false"}
    assert json.loads(typed_arguments("get_weather", args, TOOLS)) == {"city": "42", "days": 3, "metric": False}
    with pytest.raises(ValueError):
        typed_arguments("get_weather", {"days": "three"}, TOOLS)
    assert json.loads(typed_arguments("unknown", {"x": "1"}, TOOLS)) == {"x": "1"}  # no schema: untouched


def test_sentinel_mode_routes_like_buffered_text():
    from mlxrt.families.gemma4.tools import Gemma4Parser

    router = ToolRouter(Gemma4Parser(), TOOLS, ToolStreamMode.GEMMA_SENTINEL)
    out = router.feed("ok <|tool")
    out += router.feed('_call>call:get_weather{city:<|"|>Rome<|"|>}<tool_call|>')
    assert out == "ok " and router.finish().calls[0].name == "get_weather"
    assert ToolRouter(Gemma4Parser(), TOOLS, ToolStreamMode.PLAIN).feed("<|tool_call>") == "<|tool_call>"


def test_forced_prefix_masks_all_but_the_allowed_branches():
    import mlx.core as mx

    from mlxrt.text.tool_calls import ForcedPrefix

    proc = ForcedPrefix([(5, 6, 7), (5, 8)])
    history = [1, 2, 3]

    def step(token=None):
        if token is not None:
            history.append(token)
        out = proc(mx.array(history), mx.zeros((1, 10)))
        return sorted(i for i, v in enumerate(out[0].tolist()) if v > -1e30)

    assert step() == [5]
    assert step(5) == [6, 8]
    assert step(8) == list(range(10))  # (5, 8) complete: free from here
    assert step(1) == list(range(10))


def test_text_after_the_last_call_is_content():
    router = ToolRouter(Qwen3JsonParser(), TOOLS, ToolStreamMode.BUFFERED_TEXT)
    router.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n\nDone.')
    routed = router.finish()
    assert [c.name for c in routed.calls] == ["get_weather"] and routed.content == "Done."


def test_a_cut_drops_the_unfinished_call_and_keeps_the_closed_ones():
    closed = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    for text, calls, content in [
        ("Hi <tool_ca", [], "Hi "),  # inside the start marker: no half marker either
        ('Hi <tool_call>\n{"name": "get_weather", "arguments": {}}', [], "Hi "),  # closed JSON, no end marker
        (closed + "\nNext <tool_call>\n{", ["get_weather"], "Next"),
    ]:
        router = ToolRouter(Qwen3JsonParser(), TOOLS, ToolStreamMode.BUFFERED_TEXT)
        out = router.feed(text)
        routed = router.finish(cut=True)
        assert [c.name for c in routed.calls] == calls and (out + routed.content).strip() == content.strip()
        assert routed.dropped
    router = ToolRouter(Qwen3JsonParser(), TOOLS, ToolStreamMode.BUFFERED_TEXT)
    router.feed(closed + '\n<tool_call>\n{"name": "get_weather", "arguments": {}}')
    routed = router.finish()  # the model ended its turn (EOS) inside a call: dropped too (issue 42)
    assert [c.name for c in routed.calls] == ["get_weather"] and routed.dropped and routed.content == ""
