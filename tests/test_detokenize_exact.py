"""Generated text is byte-exact on every tokenizer, streamed and not (issue 42, item 1).

A scripted sampler makes a tiny checkpoint "write" a chosen text, token by token, through the
served API; the answer must be exactly that text (the tokenizer's own full decode of the
ids), in the content, the stream's deltas and the log-probability pieces. The real Gemma 3
tokenizer spells runic and rare CJK characters in ``<0xNN>`` byte pieces; the project's tiny
Gemma 4 tokenizer spells most non-Latin text that way. Property tests draw random text
(characters outside every vocabulary included) for each family's tokenizer and the generic
tier, and random token ids for the detokenizer alone.
"""

from __future__ import annotations

import json

import pytest
from conftest import shared_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import anthropic_client, openai_client
from tokenizers import Tokenizer

from mlxrt import hookimpl

MSG = [{"role": "user", "content": "Say it."}]
TEXTS = {
    "runes": "Runes: ᚠᛇᚻ ᚦᚨᚱ.",
    "chinese": "中文：龘靐齉，你好世界。",
    "devanagari": "देवनागरी लिपि में पाठ",
    "emoji": "Emoji 🎉🧑\u200d🚀👍🏽 ok",
}
#: tokenizer → (tiny model type, shared tokenizer folder or None for the generated one,
#: request fields that keep the output in the content).
TOKENIZERS = {
    "gemma3": ("gemma3_text", "gemma3", {}),
    "qwen3": ("qwen3", "qwen3", {}),
    "qwen3_5": ("qwen3_5", "qwen3_5", {"chat_template_kwargs": {"enable_thinking": False}}),
    "gemma4": ("gemma4_text", None, {}),
    "minicpm5": ("minicpm", None, {"chat_template_kwargs": {"enable_thinking": False}}),
    "generic": ("llama", None, {}),
}


class ScriptIds:
    """Claims ``script_ids`` (comma-separated ids, every dialect): samples them, then EOS (the
    test encodes, so a large tokenizer is not loaded again per request)."""

    @hookimpl
    def mlxrt_request_fields(self, dialect):
        return {"script_ids": str}

    @hookimpl
    def mlxrt_sampler(self, request, info):
        script = request.extra.get("script_ids")
        if script is None:
            return None
        import mlx.core as mx

        eos = json.loads((info.path / "generation_config.json").read_text())["eos_token_id"]
        ids = iter([*(int(i) for i in script.split(",") if i), eos if isinstance(eos, int) else eos[0]])

        def sample(logprobs):
            return mx.array([next(ids, 0)])

        return sample


def script(tok, text):
    """The request field that makes the model write ``text`` (as ``tok`` encodes it)."""
    return {"script_ids": ",".join(map(str, tok.encode(text, add_special_tokens=False).ids))}


@pytest.fixture(scope="module")
def served(mlxrt_tiny_checkpoint, tmp_path_factory):
    """tokenizer name → (TestClient, tokenizers.Tokenizer, extra request fields); one server
    per tokenizer for the module (the property tests send many requests)."""
    import contextlib

    from mlxrt.testing.conformance import served as serve

    made, stack = {}, contextlib.ExitStack()

    def get(name):
        if name not in made:
            model_type, shared, extra = TOKENIZERS[name]
            path = mlxrt_tiny_checkpoint(model_type, tokenizer_dir=shared_tokenizer(shared) if shared else None)
            client = stack.enter_context(serve(path, plugins=[("script-ids", ScriptIds())]))
            made[name] = client, Tokenizer.from_file(str(path / "tokenizer.json")), extra
        return made[name]

    with stack:
        yield get


def _expected(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    return tok.decode(ids, skip_special_tokens=False)


def _chat(client, tok, text, extra, **kw):
    """(non-streamed answer, streamed content) of the OpenAI chat API for the script ``text``."""
    oai = openai_client(client)
    body = {**script(tok, text), **extra}
    out = oai.chat.completions.create(model="m", messages=MSG, max_tokens=200, extra_body=body, **kw)
    chunks = list(oai.chat.completions.create(model="m", messages=MSG, max_tokens=200, stream=True,
                                              extra_body=body, **kw))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return out, streamed


# -- the defect, through the API -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TEXTS))
@pytest.mark.parametrize("tokenizer", ["gemma3", "gemma4"])
def test_byte_fallback_text_is_exact_streamed_and_not(served, tokenizer, name):
    client, tok, extra = served(tokenizer)
    text = TEXTS[name]
    assert _expected(tok, text) == text
    out, streamed = _chat(client, tok, text, extra, logprobs=True, top_logprobs=2)
    choice = out.choices[0]
    assert choice.message.content == text
    assert streamed == text
    assert "".join(e.token for e in choice.logprobs.content) == text
    assert all(bytes(e.bytes).decode() == e.token for e in choice.logprobs.content)


@pytest.mark.parametrize("tokenizer", ["gemma3", "gemma4"])
def test_tokenize_pieces_are_bytes_where_a_token_is_part_of_a_character(served, tokenizer):
    # llama-server's /tokenize with_pieces: a piece is the token's text, or its bytes as integers
    # where they are not whole UTF-8 (they were one U+FFFD each, and the text was lost)
    client, tok, _extra = served(tokenizer)
    text = " ".join(TEXTS.values())
    pieces = client.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tok.encode(text, add_special_tokens=False).ids
    assert any(isinstance(p["piece"], list) for p in pieces)  # the texts spell characters in <0xNN> bytes
    assert all(isinstance(p["piece"], str) or all(0 <= b < 256 for b in p["piece"]) for p in pieces)
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert joined.decode() == _expected(tok, text)


@pytest.mark.parametrize("tokenizer", ["gemma3", "gemma4"])
def test_byte_fallback_text_is_exact_in_anthropic_and_responses(served, tokenizer):
    client, tok, extra = served(tokenizer)
    text = " ".join(TEXTS.values())
    msg = anthropic_client(client).messages.create(model="m", messages=MSG, max_tokens=300,
                                                   extra_body={**script(tok, text), **extra})
    assert "".join(b.text for b in msg.content if b.type == "text") == text
    body = {"model": "m", "input": "Say it.", "max_output_tokens": 300, **script(tok, text), **extra}
    resp = client.post("/v1/responses", json=body).json()
    texts = [c["text"] for item in resp["output"] if item["type"] == "message" for c in item["content"]]
    assert "".join(texts) == text


# -- property: random text round-trips through the served stream ------------------------------------

#: Random text: any character (no surrogates; no "<" or ">", which could spell a family's
#: markup), with runs of letters most vocabularies spell in bytes.
_RARE = "ᚠᛇᚻᚦᚨᚱ龘靐齉𓀀𝄞🎉🚀👍🏽\u200d"
_TEXT = st.lists(st.one_of(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="<>"),
                           st.text(st.sampled_from(_RARE), min_size=2, max_size=5)),
                 min_size=1, max_size=8).map("".join).filter(lambda s: s.strip() == s)


@pytest.mark.parametrize("tokenizer", list(TOKENIZERS))
def test_random_text_round_trips_through_the_served_stream(served, tokenizer):
    client, tok, extra = served(tokenizer)

    @settings(max_examples=4, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(_TEXT)
    def check(text):
        expected = _expected(tok, text)
        out, streamed = _chat(client, tok, text, extra)
        assert out.choices[0].message.content == expected
        assert streamed == expected

    check()


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_and_tool_arguments_are_exact_on_gemma4(served, stream):
    """The same text path feeds the reasoning splitter and the tool-call parser."""
    client, tok, _extra = served("gemma4")
    rare = TEXTS["runes"] + " " + TEXTS["chinese"]
    text = (f'<|channel>thought\n{rare}<channel|>{TEXTS["devanagari"]}'
            f'<|tool_call>call:note{{text:<|"|>{rare}<|"|>}}<tool_call|>')
    tools = [{"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}}}}]
    oai = openai_client(client)
    out = oai.chat.completions.create(model="m", messages=MSG, tools=tools, max_tokens=300, stream=stream,
                                      reasoning_effort="high", extra_body=script(tok, text))
    if stream:
        chunks = [c.choices[0].delta for c in out if c.choices]
        reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in chunks)
        content = "".join(d.content or "" for d in chunks)
        args = "".join(tc.function.arguments or "" for d in chunks for tc in d.tool_calls or ())
    else:
        message = out.choices[0].message
        reasoning, content = message.model_extra["reasoning_content"], message.content
        args = message.tool_calls[0].function.arguments
    assert reasoning.strip() == rare
    assert content.strip() == TEXTS["devanagari"]
    assert json.loads(args) == {"text": rare}


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_match_characters_spelled_in_bytes(served, stream):
    client, tok, extra = served("gemma4")
    oai = openai_client(client)
    out = oai.chat.completions.create(model="m", messages=MSG, max_tokens=200, stop=["ᚦᚨᚱ"], stream=stream,
                                      extra_body={**script(tok, TEXTS["runes"] + " never"), **extra})
    if stream:
        chunks = [c for c in out if c.choices]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        content, finish = out.choices[0].message.content, out.choices[0].finish_reason
    assert (content, finish) == ("Runes: ᚠᛇᚻ ", "stop")
