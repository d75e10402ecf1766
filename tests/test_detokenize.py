from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from mlxrt.text.detokenize import Detokenizer


def _byte_tokenizer():
    # A byte-level BPE with no merges: every UTF-8 byte is its own token, so multi-byte
    # characters always span several tokens.
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


TOK = _byte_tokenizer()


def stream(text):
    ids = TOK.encode(text).ids
    d = Detokenizer(lambda xs: TOK.decode(list(xs)))
    pieces = [d.add(i) for i in ids] + [d.flush()]
    return pieces


def test_never_splits_a_character():
    pieces = stream("héllo 日本 🎉")
    assert "".join(pieces) == "héllo 日本 🎉"
    assert all("\ufffd" not in p for p in pieces)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_round_trips_any_text(text):
    assert "".join(stream(text)) == text
