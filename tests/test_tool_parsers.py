import json

import pytest

from mlxrt import ToolStreamMode
from mlxrt.families.qwen.tools import Qwen3JsonParser, Qwen3XmlParser
from mlxrt.tool_calls import ToolRouter

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
    router.feed("<tool_call>{broken")
    routed = router.finish()
    assert routed.calls == () and routed.content == "<tool_call>{broken" and routed.warning


def test_router_inactive_without_tools():
    router = ToolRouter(Qwen3JsonParser(), None, ToolStreamMode.BUFFERED_TEXT)
    assert router.feed("<tool_call>x") == "<tool_call>x"
