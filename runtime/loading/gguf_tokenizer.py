"""A ``tokenizers`` tokenizer rebuilt from GGUF ``tokenizer.ggml.*`` metadata.

Two kinds: byte-level BPE (``tokenizer.ggml.model == "gpt2"``: the vocabulary and merges are in
the file, the pre-tokenizer is named by ``tokenizer.ggml.pre``) and SentencePiece BPE
(``"llama"``: Llama 2, Mistral, Gemma). A SentencePiece GGUF carries scores instead of merges:
SentencePiece merges the adjacent pair whose concatenation scores highest, so every split of a
token into two tokens becomes a merge ranked by the token's score, which is what the ``tokenizers``
BPE model then applies; pieces outside the vocabulary fall back to ``<0xNN>`` byte tokens.
``tokenizer.ggml.add_space_prefix`` says whether a ``▁`` is put before the text (Llama: yes;
Gemma: no).
"""

from __future__ import annotations

from typing import Any

from mlxrt.loading.gguf_format import UnsupportedGGUF
from mlxrt.loading.gguf_format import metadata_value as _md

__all__ = ["build_tokenizer", "tokenizer_config"]

# llama.cpp's split regexes (llama-vocab.cpp), as the HF tokenizer.json files express them.
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> (kind, ignore_merges)
_PRE_TOKENIZERS = {
    None: ("gpt2", False),
    "default": ("gpt2", False),
    "gpt-2": ("gpt2", False),
    "gpt2": ("gpt2", False),
    "smollm": ("smollm", False),  # every \p{N} alone, then the GPT-2 regex
    "llama3": ("llama3", True),
    "llama-v3": ("llama3", True),
    "llama-bpe": ("llama3", True),
    "smaug-bpe": ("llama3", False),
    "dbrx": ("llama3", False),
    "qwen2": ("qwen2", False),
    "qwen35": ("qwen2", False),
    "deepseek-r1-qwen": ("qwen2", False),
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))



def build_tokenizer(metadata: dict[str, Any]):
    """Build a ``tokenizers.Tokenizer`` from GGUF ``tokenizer.ggml.*`` metadata.

    Control tokens (token_type 3) become special added tokens, user-defined ones (4) plain
    added tokens, so both are matched whole in text, as llama.cpp does.
    """
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    model = metadata.get("tokenizer.ggml.model")
    if model == "llama":
        return _sentencepiece(metadata)
    if model != "gpt2":
        raise UnsupportedGGUF(f"tokenizer model {model!r} is not supported "
                              "(only 'gpt2' byte-level BPE and 'llama' SentencePiece)")
    pre = metadata.get("tokenizer.ggml.pre")
    if pre not in _PRE_TOKENIZERS:
        raise UnsupportedGGUF(
            f"pre-tokenizer {pre!r} is not supported; known: "
            f"{sorted(k for k in _PRE_TOKENIZERS if k)}")
    kind, ignore_merges = _PRE_TOKENIZERS[pre]

    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types = _types(metadata, len(tokens))
    merges_raw: list[str] = list(_md(metadata, "tokenizer.ggml.merges", []))
    if not merges_raw:
        raise UnsupportedGGUF("GGUF has a gpt2 tokenizer but no tokenizer.ggml.merges")

    b2u = _bytes_to_unicode()
    alphabet = set(b2u.values())
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        key = tok
        if types[i] not in (3, 4) and not set(tok) <= alphabet:
            # a normal token written as raw text: spell it in the byte alphabet
            key = "".join(b2u[b] for b in tok.encode("utf-8"))
        vocab.setdefault(key, i)
    merges = []
    for m in merges_raw:
        a, sep, b = m.partition(" ")
        if sep and a and b:
            merges.append((a, b))

    bpe_kwargs = dict(vocab=vocab, merges=merges, dropout=None,
                      continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    try:
        bpe = models.BPE(ignore_merges=ignore_merges, **bpe_kwargs)
    except TypeError:  # very old tokenizers
        bpe = models.BPE(**bpe_kwargs)
    tok = Tokenizer(bpe)

    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif kind == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    else:
        regex = _LLAMA3_REGEX if kind == "llama3" else _QWEN2_REGEX
        if kind == "qwen2":  # Qwen's tokenizer.json composes text (NFC) before splitting it
            tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()

    _add_tokens(tok, tokens, types)
    _post_processor(tok, metadata, tokens, fallback=processors.ByteLevel(trim_offsets=False))
    return tok


def _types(metadata: dict[str, Any], n: int) -> list[int]:
    types: list[int] = list(_md(metadata, "tokenizer.ggml.token_type", []))[:n]
    return types + [1] * (n - len(types))


def _add_tokens(tok: Any, tokens: list[str], types: list[int]) -> None:
    """Control tokens (type 3) become special added tokens, user-defined ones (4) plain added
    tokens, so both are matched whole in text, as llama.cpp does."""
    from tokenizers import AddedToken

    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types, strict=True) if ty == 3]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types, strict=True) if ty == 4]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)


def _post_processor(tok: Any, metadata: dict[str, Any], tokens: list[str], fallback: Any) -> None:
    from tokenizers import processors

    add_bos = bool(_md(metadata, "tokenizer.ggml.add_bos_token", False))
    add_eos = bool(_md(metadata, "tokenizer.ggml.add_eos_token", False))
    bos_id = metadata.get("tokenizer.ggml.bos_token_id")
    eos_id = metadata.get("tokenizer.ggml.eos_token_id")
    if (add_bos and bos_id is not None) or (add_eos and eos_id is not None):
        single, pair, specials = "$A:0", "$A:0 $B:1", []
        if add_bos and bos_id is not None:
            b = tokens[bos_id]
            single, pair = f"{b}:0 {single}", f"{b}:0 $A:0 {b}:1 $B:1"
            specials.append((b, bos_id))
        if add_eos and eos_id is not None:
            e = tokens[eos_id]
            single = f"{single} {e}:0"
            pair = pair.replace("$A:0", f"$A:0 {e}:0").replace("$B:1", f"$B:1 {e}:1")
            if (e, eos_id) not in specials:
                specials.append((e, eos_id))
        tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=specials)
    elif fallback is not None:
        tok.post_processor = fallback


def _spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Every split of a normal token into two vocabulary pieces, best-scoring token first."""
    ids = {t: i for i, t in enumerate(tokens) if types[i] in (1, 4)}
    found: list[tuple[float, int, int, str, str]] = []
    for tok, i in ids.items():
        for cut in range(1, len(tok)):
            a, b = tok[:cut], tok[cut:]
            ia, ib = ids.get(a), ids.get(b)
            if ia is not None and ib is not None:
                found.append((-scores[i], ia, ib, a, b))
    found.sort()
    return [(a, b) for _, _, _, a, b in found]


def _sentencepiece(metadata: dict[str, Any]):
    from tokenizers import Tokenizer, decoders, models, normalizers

    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types = _types(metadata, len(tokens))
    scores = list(_md(metadata, "tokenizer.ggml.scores", []))
    if len(scores) != len(tokens):
        raise UnsupportedGGUF("GGUF has a SentencePiece tokenizer without tokenizer.ggml.scores")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    bpe = models.BPE(vocab=vocab, merges=_spm_merges(tokens, scores, types), unk_token=unk,
                     fuse_unk=True, byte_fallback=True, dropout=None)
    tok = Tokenizer(bpe)
    space_prefix = bool(_md(metadata, "tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend("▁")] if space_prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    undo = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if space_prefix:
        undo.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(undo)
    _add_tokens(tok, tokens, types)
    _post_processor(tok, metadata, tokens, fallback=None)
    return tok


def tokenizer_config(md: dict[str, Any], context: int | None) -> dict[str, Any]:
    tokens = md["tokenizer.ggml.tokens"]

    def name(key: str) -> str | None:
        i = md.get(f"tokenizer.ggml.{key}")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_md(md, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_md(md, "tokenizer.ggml.add_eos_token", False)),
        "bos_token": name("bos_token_id"),
        "eos_token": name("eos_token_id"),
        "unk_token": name("unknown_token_id"),
        "pad_token": name("padding_token_id"),
        "clean_up_tokenization_spaces": False,
    }
    if context:
        cfg["model_max_length"] = int(context)
    if md.get("tokenizer.chat_template"):
        cfg["chat_template"] = md["tokenizer.chat_template"]
    return cfg
