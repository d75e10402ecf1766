"""Property tests of tool-call parsing, per family (issue 42): random calls render → parse back
equal, and a turn cut anywhere gives only its finished calls and no markup.

Calls are drawn under one schema (strings, integers, booleans, nested objects and arrays);
strings are any Unicode text, quotes, newlines and the family's own markup included, wherever
the family's format can express them (each renderer below says where it cannot: the template
writes those values in a way no parser can read back). Each turn is rendered as the family's
chat template writes an assistant turn, text around and between two calls, then:

- read whole, the turn gives back the calls exactly, and its text;
- cut at every character, by ``max_tokens`` (``cut``) or by the model's own end of turn, it
  gives exactly the calls finished before the cut, no unfinished call, no call markup in the
  content; fed in random pieces (the streamed path) it gives the same answer as fed whole.

The HTTP sweep over every dialect is tests/test_tool_cuts.py (sampled cut positions) and
tests/test_partial_tool_calls.py; this is the full sweep, on the parsers alone.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mlxrt import ToolStreamMode
from mlxrt.text.tool_calls import ToolRouter

SCHEMA = {"type": "object", "properties": {
    "text": {"type": "string"}, "n": {"type": "integer"}, "flag": {"type": "boolean"},
    "obj": {"type": "object"}, "items": {"type": "array", "items": {"type": "string"}}}}
TOOLS = [{"type": "function", "function": {"name": "do_it", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "other.tool-2", "parameters": SCHEMA}}]
Q = '<|"|>'

#: Markup each family's content must never show after routing (with the strings drawn here).
MARKUP = {
    "qwen3": ("<tool_call>", "</tool_call>"),
    "qwen3_5": ("<tool_call>", "</tool_call>", "<function=", "<parameter="),
    "minicpm5": ('<function name=', "</function>", "<param name="),
    "gemma4": ("<|tool_call>", "<tool_call|>", Q),
    "generic": ("<tool_call>", "</tool_call>"),
}
#: Text pieces the family's own markup is built from (drawn into string values on purpose).
PIECES = {
    "qwen3": ["<tool_call>", "</tool_call>", '{"name": ', '"}', "\\"],
    "qwen3_5": ["<tool_call>", "</tool_call>", "<function=x>", "</function>", "<parameter=k>", "</parameter>"],
    "minicpm5": ['<function name="x">', "</function>", '<param name="k">', "</param>", "<![CDATA[", "&"],
    "gemma4": ["<|tool_call>", "<tool_call|>", "call:x{", "}", "{", "[", "]", ",", ":"],
    "generic": ["<tool_call>", "</tool_call>", '{"name": ', '"}', "\\"],
}


def texts(family):
    """Strings: Unicode (astral planes, quotes, newlines) mixed with the family's markup."""
    unicode = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
    return st.lists(st.one_of(unicode, st.sampled_from(PIECES[family]), st.sampled_from(['"', "'", "\n", " "])),
                    max_size=4).map("".join)


def values(family):
    leaf = st.one_of(texts(family), st.integers(-10**6, 10**6), st.booleans())
    key = st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True)
    nested = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                          st.dictionaries(key, inner, max_size=3)), max_leaves=4)
    return st.fixed_dictionaries({}, optional={
        "text": texts(family), "n": st.integers(-10**6, 10**6), "flag": st.booleans(),
        "obj": st.dictionaries(key, nested, max_size=2), "items": st.lists(texts(family), max_size=2)})


def calls(family):
    return st.lists(st.tuples(st.sampled_from(["do_it", "other.tool-2"]), values(family)), min_size=1, max_size=2)


# -- the families' markup, as their chat templates write an assistant's calls --------------------


def _json_text(value):
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render_qwen3(name, args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def render_qwen3_5(name, args):
    """Qwen3.5: raw values between newlines. Not expressible: ``</parameter>`` followed (after
    blank space) by ``<parameter=`` or ``</function>`` inside a value, and the text ``null``."""
    body = ""
    for key, value in args.items():
        text = _json_text(value)
        assume(text.lower() != "null")
        for marker in ("<parameter=", "</function>"):
            rest = text
            while "</parameter>" in rest:
                rest = rest[rest.index("</parameter>") + len("</parameter>"):]
                assume(not rest.lstrip().startswith(marker) and not (rest.strip() == "" and text.endswith(rest)))
        body += f"<parameter={key}>\n{text}\n</parameter>\n"
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def render_minicpm5(name, args):
    """MiniCPM5: a string holding ``<``, ``&`` or a newline in CDATA, else raw. Not
    expressible: ``]]>`` in CDATA, blank space around a raw value, a raw ``</param>`` (in a
    JSON value), the text ``null``."""
    body = ""
    for key, value in args.items():
        text = _json_text(value)
        assume(text.lower() != "null")
        if isinstance(value, str) and any(c in text for c in "<&\n"):
            assume("]]>" not in text)
            text = f"<![CDATA[{text}]]>"
        else:
            assume(text == text.strip() and "</param>" not in text)
        body += f'<param name="{key}">{text}</param>'
    return f'<function name="{name}">{body}</function>'


def _gemma_value(value):
    if isinstance(value, str):
        assume(Q not in value)  # the one text a Gemma string cannot hold
        return Q + value + Q
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_gemma_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma_value(v) for v in value) + "]"
    return json.dumps(value)


def render_gemma4(name, args):
    return f"<|tool_call>call:{name}{_gemma_value(args)}<tool_call|>"


def render_generic(name, args):
    from mlxrt.text.generic_tools import GenericToolPrompt

    call = {"type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
    rendered = GenericToolPrompt().render([{"role": "assistant", "content": None, "tool_calls": [call]}], [])
    return rendered[-1]["content"]


def parser(family):
    if family == "qwen3":
        from mlxrt.families.qwen.tools import Qwen3JsonParser

        return Qwen3JsonParser()
    if family == "qwen3_5":
        from mlxrt.families.qwen.tools import Qwen3XmlParser

        return Qwen3XmlParser()
    if family == "minicpm5":
        from mlxrt.families.minicpm5.tools import MiniCPM5Parser

        return MiniCPM5Parser()
    if family == "gemma4":
        from mlxrt.families.gemma4.tools import Gemma4Parser

        return Gemma4Parser()
    from mlxrt.text.generic_tools import JsonToolCallParser

    return JsonToolCallParser()


RENDER = {"qwen3": render_qwen3, "qwen3_5": render_qwen3_5, "minicpm5": render_minicpm5, "gemma4": render_gemma4,
          "generic": render_generic}
SEP = {"qwen3": "\n", "qwen3_5": "\n", "minicpm5": "", "gemma4": "", "generic": "\n"}


def route(family, text, *, cut, pieces=None):
    mode = ToolStreamMode.GEMMA_SENTINEL if family == "gemma4" else ToolStreamMode.BUFFERED_TEXT
    router = ToolRouter(parser(family), TOOLS, mode)
    content = ""
    for piece in pieces or [text]:
        content += router.feed(piece)
    routed = router.finish(cut=cut)
    return content + routed.content, [(c.name, json.loads(c.arguments)) for c in routed.calls], routed.dropped


def chunks(text, points):
    points = sorted({p % (len(text) + 1) for p in points})
    edges = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:], strict=False)]


PLAIN = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="<"), max_size=6)


def check_family(family, drawn, before, between, after, points):
    markups = [RENDER[family](name, args) for name, args in drawn]
    expected = [(name, json.loads(json.dumps(args))) for name, args in drawn]
    text = before
    ends = []
    for i, markup in enumerate(markups):
        if i:
            text += f"\n{between}\n" if between.strip() else SEP[family]
        text += markup
        ends.append(len(text))
    text += after
    content, got, dropped = route(family, text, cut=False)
    assert got == expected and not dropped
    assert content.startswith(before) and (len(drawn) < 2 or between.strip() in content)
    for k in range(len(text) + 1):
        finished = expected[: sum(1 for e in ends if e <= k)]
        for cut in (True, False):
            whole = route(family, text[:k], cut=cut)
            content, got, _dropped = whole
            assert got == finished, (family, k, cut, text[:k])
            assert not any(m in content for m in MARKUP[family]), (family, k, cut, content)
            if cut:  # the streamed path: the same text fed in pieces
                assert route(family, text[:k], cut=cut, pieces=chunks(text[:k], points)) == whole, (family, k)


def family_property(family):
    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(drawn=calls(family), before=PLAIN, between=PLAIN, after=PLAIN,
           points=st.lists(st.integers(0, 10_000), max_size=6))
    def run(drawn, before, between, after, points):
        check_family(family, drawn, before, between, after, points)

    return run


test_qwen3_calls_round_trip_and_cut_anywhere = family_property("qwen3")
test_qwen3_5_calls_round_trip_and_cut_anywhere = family_property("qwen3_5")
test_minicpm5_calls_round_trip_and_cut_anywhere = family_property("minicpm5")
test_gemma4_calls_round_trip_and_cut_anywhere = family_property("gemma4")
test_generic_calls_round_trip_and_cut_anywhere = family_property("generic")
