"""The detokenizer on its own: random token sequences on every kind of tokenizer decoder.

Streamed pieces concatenate to the tokenizer's full decode whenever the ids spell valid UTF-8;
after each token the text given out is the decode of the ids so far whenever those spell
valid UTF-8 (nothing held back but an incomplete character); invalid bytes read as Python's
lossy UTF-8 decoding of the token bytes. Both the byte table and the window decoding (used
for decoders the table does not reproduce) are checked.
"""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest
from conftest import TOKENIZERS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from mlxrt.text.detokenize import Detokenizer, Detokenizers
from mlxrt.text.tokenizer import TextTokenizer

WORDS = ["the", "sea", "Runes:", "ᚠᛇᚻ", "ᚦᚨᚱ", "中文", "龘靐齉", "देवनागरी", "🎉🧑\u200d🚀", "don't", "it's", ",", ".",
         "?", "'", "  ", "\n", "é", "𓀀", "a"]


def _wrap(backend, clean_up=False):
    return TextTokenizer(backend, Path("."), config={"clean_up_tokenization_spaces": clean_up},
                         special_tokens_map={}, chat_template=None)


def _byte_level():
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return _wrap(tok)


def _spm(strip=False):
    from mlxrt.testing._tokenizer_factory import generated_tokenizer

    tok = Tokenizer.from_str(generated_tokenizer("gemma4_text").tokenizer_json)
    if strip:  # Llama 2's decoder: the text's leading space dropped
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    return _wrap(tok)


def _unigram(clean_up=False):
    pieces = sorted({w for w in WORDS if " " not in w} | set("abcdefghijklmnopqrstuvwxyz'.,?"))
    vocab = [("<unk>", 0.0)] + [(f"\u2581{p}", -1.0) for p in pieces] + [(p, -2.0) for p in pieces] + [("\u2581", -3.0)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    return _wrap(tok, clean_up=clean_up)


def _wordpiece():
    pieces = sorted({w for w in WORDS if " " not in w} | set("abcdefghijklmnopqrstuvwxyz'.,?"))
    vocab = {"[UNK]": 0, **{p: i + 1 for i, p in enumerate(pieces)}}
    vocab.update({f"##{p}": len(vocab) + i for i, p in enumerate(pieces)})
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(cleanup=True)
    return _wrap(tok)


def _shared(name):
    path = TOKENIZERS / name / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"needs ../shared/data/tokenizers/{name}")
    return _wrap(Tokenizer.from_file(str(path)))


KINDS = {
    "byte_level": _byte_level, "spm_byte_fallback": _spm, "llama2_strip": lambda: _spm(strip=True),
    "unigram_metaspace": _unigram, "unigram_clean_up": lambda: _unigram(clean_up=True), "wordpiece": _wordpiece,
    "qwen3": lambda: _shared("qwen3"), "gemma3": lambda: _shared("gemma3"),
}
_BUILT: dict[str, object] = {}


def tokenizer(kind):
    if kind not in _BUILT:
        _BUILT[kind] = KINDS[kind]()
    return _BUILT[kind]


def _valid(tok, ids):
    text = tok.decode(ids)
    return "\ufffd" not in text, text


def _ids(tok):
    """Ids of random text (characters the vocabulary spells in bytes included), with random
    ids spliced in (invalid byte runs, special tokens, ids past the vocabulary)."""
    size = len(tok)
    text = st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=4)), max_size=8).map(" ".join)
    extra = st.lists(st.tuples(st.integers(0, 40), st.integers(0, size + 2)), max_size=3)

    def splice(pair):
        ids = tok.encode(pair[0], add_special_tokens=False)
        for at, token in pair[1]:
            ids.insert(min(at, len(ids)), token)
        return ids

    return st.tuples(text, extra).map(splice)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_byte_table_is_used_and_exact(kind):
    tok = tokenizer(kind)
    made = Detokenizers.of(tok)
    assert made.table is not None, made.reason

    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(_ids(tok))
    def check(ids):
        detok = made.new()
        pieces, pending = [], []
        for i, token in enumerate(ids):
            pieces.append(detok.add(token))
            pending.append(_valid(tok, ids[: i + 1]))
        pieces.append(detok.flush())
        assert "".join(pieces) == made.decode_all(ids) == detok.text
        valid, text = _valid(tok, ids)
        if valid:
            assert detok.text == text
        if not made.table.clean_up:  # (clean-up holds back a space that may still go)
            for i, (ok, prefix) in enumerate(pending):
                if ok:
                    assert "".join(pieces[: i + 1]) == prefix, ids[: i + 1]
        # invalid bytes: Python's lossy UTF-8 of the token bytes (one U+FFFD per maximal subpart)
        raw = b"".join(made.table.piece(t, first=n == 0) for n, t in enumerate(ids))
        if made.table.strip == ("", 0) and not made.table.clean_up:
            assert detok.text == codecs.decode(raw, "utf-8", "replace")

    check()


@pytest.mark.parametrize("kind", ["byte_level", "spm_byte_fallback", "llama2_strip", "wordpiece", "qwen3", "gemma3"])
def test_window_decoding_is_exact_on_valid_text(kind):
    """The fallback for decoders the table does not reproduce: same answers on valid text."""
    tok = tokenizer(kind)

    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(_ids(tok))
    def check(ids):
        valid, text = _valid(tok, ids)
        detok = Detokenizer(lambda xs: tok.decode(list(xs)))
        pieces = [detok.add(t) for t in ids] + [detok.flush()]
        if valid:
            assert "".join(pieces) == text

    check()


def test_runs_of_byte_pieces_on_the_real_gemma3_tokenizer():
    """The issue's text: a third runic letter in a row of <0xNN> pieces came back as U+FFFD."""
    tok = tokenizer("gemma3")
    text = "Runes: ᚠᛇᚻ ᚦᚨᚱ. 龘靐齉 𓀀"
    ids = tok.encode(text, add_special_tokens=False)
    assert sum(tok.backend_tokenizer.id_to_token(i).startswith("<0x") for i in ids) > 12
    for detok in (Detokenizers.of(tok).new(), Detokenizer(lambda xs: tok.decode(list(xs)))):
        pieces = [detok.add(i) for i in ids] + [detok.flush()]
        assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)


def test_logprob_previews_read_as_the_piece_then_added():
    tok = tokenizer("spm_byte_fallback")
    ids = tok.encode("ᚠᛇᚻ 中文", add_special_tokens=False)
    detok = Detokenizers.of(tok).new()
    for token in ids:
        preview = detok.preview([token, ids[0]])
        assert preview[0] == detok.add(token)


def test_decoders_the_table_does_not_reproduce_decode_windows():
    tok = Tokenizer(models.BPE(vocab={"a</w>": 0, "b": 1}, merges=[]))
    tok.decoder = decoders.BPEDecoder()
    made = Detokenizers.of(_wrap(tok))
    assert made.table is None and "BPEDecoder" in made.reason
    assert made.decode_all([1, 0, 1]) == tok.decode([1, 0, 1])


def test_the_probe_rejects_a_misread_table(monkeypatch):
    """A table that disagrees with the tokenizer's decode on the probe is not used."""
    import attrs

    from mlxrt.text import detokenize, token_bytes

    tok = _byte_level()
    misread = attrs.evolve(token_bytes.token_bytes(tok), assembly="")  # GPT-2's byte alphabet ignored
    monkeypatch.setattr(detokenize, "token_bytes", lambda _tok: misread)
    made = Detokenizers.of(tok)
    assert made.table is None and "probe" in made.reason
    assert made.decode_all(tok.encode("中文 ᚠ")) == "中文 ᚠ"
