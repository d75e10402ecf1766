"""The family self-test, run once at model load: do the model's own chat template and the
family's parsers agree?

Three synthetic turns go through the template and back through the family's answers:

* ``template``: a user turn renders with a generation prompt.
* ``tools``: an assistant turn with one tool call (typed arguments) renders, and the family's
  tool parser reads the rendered call back as the same name and arguments.
* ``tool_result``: a role ``tool`` result after that call appears in the rendered prompt.
* ``thinking``: an assistant turn with reasoning renders, and the reasoning splitter reads the
  rendered reasoning back out of it (or, for a template that drops past reasoning, out of the
  family's own markers).

Each capability is ``"pass"``, ``"fail: <why>"`` or ``"n/a"`` (the family claims no tool
parser, no thinking format, or the model has no template). Results are reported in
``/v1/models`` and ``/stats``; a failure is logged, never fatal: the model still serves.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from mlxrt.records import FamilyProfile
from mlxrt.text.reasoning import ReasoningSplitter

__all__ = ["run_self_test", "SELF_TEST_TOOLS"]

log = logging.getLogger("mlxrt.loading.self_test")

SELF_TEST_TOOLS = ({"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
        "required": ["city"]}}},)
_ARGS = {"city": "Paris", "days": 3, "metric": True}
_QUESTION = "self-test: what is the weather in Paris?"
_RESULT = "self-test result 17C"
_REASONING = "self-test reasoning"


def _render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def _check_tools(profile: FamilyProfile, tokenizer: Any) -> tuple[str, str]:
    parser = profile.tool_parser
    if parser is None:
        return "n/a", "n/a"
    call = {"id": "call_selftest", "type": "function", "function": {"name": "get_weather", "arguments": _ARGS}}
    messages = [{"role": "user", "content": _QUESTION},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_selftest", "name": "get_weather", "content": _RESULT}]
    tools: list[Any] | None = list(SELF_TEST_TOOLS)
    if profile.tool_prompt is not None:  # the template renders no tools: mlxrt's tool prompt does
        messages, tools = profile.tool_prompt.render(messages, list(SELF_TEST_TOOLS)), None
    try:
        text = _render(tokenizer, messages, tools=tools, add_generation_prompt=True)
    except Exception as exc:  # the template's own error: report it
        return f"fail: the template cannot render a tool call ({type(exc).__name__}: {exc})", "n/a"
    after = text[text.find(_QUESTION) + len(_QUESTION):] if _QUESTION in text else text
    at = after.find(parser.start)
    if at < 0:
        tools = f"fail: the rendered call has no {parser.start!r}"
    else:
        try:
            calls = parser.parse(after[at:], list(SELF_TEST_TOOLS))
        except Exception as exc:  # a parser that cannot read its own template
            calls, tools = [], f"fail: the parser rejects the rendered call ({type(exc).__name__}: {exc})"
        else:
            got = [(c.name, json.loads(c.arguments)) for c in calls[:1]]
            tools = "pass" if got == [("get_weather", _ARGS)] else f"fail: parsed {got!r}"
    result = "pass" if _RESULT in after else "fail: the tool result is not rendered"
    return tools, result


def _check_thinking(profile: FamilyProfile, tokenizer: Any) -> str:
    fmt = profile.thinking_format
    if fmt is None:
        return "n/a"
    messages = [{"role": "user", "content": _QUESTION},
                {"role": "assistant", "content": "self-test answer", "reasoning_content": _REASONING}]
    try:
        text = _render(tokenizer, messages, add_generation_prompt=False)
    except Exception as exc:
        return f"fail: the template cannot render a thinking turn ({type(exc).__name__}: {exc})"
    after = text[text.find(_QUESTION) + len(_QUESTION):] if _QUESTION in text else text
    at = after.find(fmt.open)
    sample = after[at:] if at >= 0 else f"{fmt.open}{_REASONING}{fmt.close}self-test answer"
    splitter = ReasoningSplitter(fmt)
    reasoning, content = splitter.feed(sample)
    r2, c2 = splitter.flush()
    reasoning, content = reasoning + r2, content + c2
    if _REASONING not in reasoning or fmt.open in content or fmt.close in content:
        return f"fail: reasoning {reasoning!r} / content {content[:40]!r}"
    return "pass"


def run_self_test(profile: FamilyProfile, tokenizer: Any) -> Mapping[str, str]:
    """Render and parse the synthetic turns; one result per capability (never raises)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return {"template": "n/a", "tools": "n/a", "tool_result": "n/a", "thinking": "n/a"}
    out: dict[str, str] = {}
    try:
        _render(tokenizer, [{"role": "user", "content": _QUESTION}], add_generation_prompt=True)
        out["template"] = "pass"
    except Exception as exc:  # the template's own error
        out["template"] = f"fail: {type(exc).__name__}: {exc}"
    out["tools"], out["tool_result"] = _check_tools(profile, tokenizer)
    out["thinking"] = _check_thinking(profile, tokenizer)
    for capability, result in out.items():
        if result.startswith("fail"):
            log.warning("%s self-test %s: %s (family %s)", profile.info.model_id, capability, result,
                        profile.family)
    return out
