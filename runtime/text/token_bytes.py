"""What each token adds to the generated text, as bytes: the table the detokenizer streams from.

A tokenizer's ``decode`` is not causal: Hugging Face's ``ByteFallback`` decoder turns a whole
run of ``<0xNN>`` pieces into one U+FFFD per byte as soon as the run is not valid UTF-8, so a
window decoded on its own (one that starts inside a character spelled in bytes) reads
differently from the same tokens decoded in full. Streaming exactly needs the byte each
token stands for, decoded as one UTF-8 stream.

:func:`token_bytes` reads the tokenizer's decoder (``tokenizer.json``'s ``decoder``: the
``tokenizers`` library's pipeline, which transformers' fast tokenizers and mlxrt's
:class:`~mlxrt.text.tokenizer.TextTokenizer` both run) and compiles the pipelines it
reproduces into a :class:`TokenBytes`:

* steps that act on each token alone (``Replace``, ``Metaspace``, ``WordPiece``, ``Strip``),
  with the rule some of them have for the first token: run through the library's own
  decoder objects, token by token, so their details are the library's;
* then at most one assembly step: ``ByteLevel`` (GPT-2's byte alphabet: Qwen, Llama 3,
  SmolLM2) or ``ByteFallback`` (``<0xNN>`` pieces: Gemma, Llama 2, Mistral), or none
  (the token's text is its UTF-8);
* then ``Fuse`` and a ``Strip`` of leading characters of the whole text (Llama 2's).

Any other pipeline (``BPEDecoder``, ``CTC``, no decoder, a tokenizer without a ``tokenizers``
backend) gives the reason instead, and the detokenizer decodes windows of ids
(:mod:`mlxrt.text.detokenize`, which also checks a table against the tokenizer's own
``decode`` on :data:`PROBE` before using it, so a pipeline misread here never changes what is
served).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = ["CLEAN_UP", "PROBE", "TokenBytes", "backend_of", "token_bytes"]

#: transformers' ``clean_up_tokenization`` (applied to the whole decoded text when the
#: tokenizer's ``clean_up_tokenization_spaces`` is on), in its order.
CLEAN_UP: tuple[tuple[str, str], ...] = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
    (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))

#: The text the table is checked on: spaces in runs and at the start, the clean-up patterns,
#: scripts a small vocabulary spells in bytes, emoji with joiners, newlines.
PROBE = ("  Runes: ᚠᛇᚻ ᚦᚨᚱ. It's 中文文本，龘靐齉 देवनागरी 🎉🧑\u200d🚀👍🏽 a , b ? c ! "
         "d ' e don't I'm we've they're\n\n\tend  ")

_PER_TOKEN = ("Replace", "Metaspace", "WordPiece", "Strip")
_ANCHOR = "\x00"
_BYTE_TOKEN = re.compile(r"<0x(\+?[0-9A-Fa-f]{1,2})>")


def _gpt2_bytes() -> dict[str, int]:
    """GPT-2's byte alphabet: printable bytes stand for themselves, the others are shifted
    past U+0100 (what ``ByteLevel`` pre-tokenizers write and its decoder reads back)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


@attrs.define(eq=False)
class TokenBytes:
    """A tokenizer's decoder as a per-token byte table plus the text rules that follow it.

    :ivar strip: ``(character, count)``: up to ``count`` leading ``character`` dropped from
        the whole text (``Strip`` after ``Fuse``); ``("", 0)`` when none.
    :ivar clean_up: whether transformers' clean-up (:data:`CLEAN_UP`) runs on the text.
    """

    backend: Any
    assembly: str  # "ByteLevel", "ByteFallback" or "" (the token's text is its UTF-8)
    per_token: Any  # a tokenizers decoder running the per-token steps, or None
    strip: tuple[str, int] = ("", 0)
    clean_up: bool = False
    _rest: dict[int, bytes] = attrs.field(factory=dict)
    _byte_level: Mapping[str, int] = attrs.field(factory=_gpt2_bytes)

    def piece(self, token: int, *, first: bool) -> bytes:
        """The bytes ``token`` adds to the text; ``first``: it is the first generated token."""
        if not first:
            cached = self._rest.get(token)
            if cached is not None:
                return cached
        text = self.backend.id_to_token(token)
        if text is None:  # an id past the vocabulary (padded embeddings): decode drops it
            out = b""
        else:
            out = self._assemble(self._per_token(text, first))
        if not first:
            self._rest[token] = out
        return out

    def _per_token(self, text: str, first: bool) -> str:
        if self.per_token is None:
            return text
        if first:
            alone: str = self.per_token.decode([text])
            return alone
        # The library's own steps, run on a neutral token (they leave it as it is: checked in
        # _compile) then this one: the second token's text is what any later position gets.
        after: str = self.per_token.decode([_ANCHOR, text])
        return after[len(_ANCHOR):]

    def _assemble(self, text: str) -> bytes:
        if self.assembly == "ByteFallback":
            found = _BYTE_TOKEN.fullmatch(text)
            if found is not None and len(text) == 6:
                return bytes([int(found.group(1), 16)])
            return text.encode("utf-8")
        if self.assembly == "ByteLevel":
            table = self._byte_level
            if all(c in table for c in text):
                return bytes(table[c] for c in text)
        return text.encode("utf-8")  # ByteLevel leaves a token with a character outside its alphabet as is


def _steps(spec: Mapping[str, Any] | None) -> list[Mapping[str, Any]] | None:
    if spec is None:
        return None
    if spec.get("type") == "Sequence":
        out: list[Mapping[str, Any]] = []
        for inner in spec.get("decoders") or []:
            flat = _steps(inner)
            if flat is None:
                return None
            out.extend(flat)
        return out
    return [spec]


def _per_token_decoder(steps: Sequence[Mapping[str, Any]]) -> Any:
    from tokenizers import Regex, decoders

    built: list[decoders.Decoder] = []
    for step in steps:
        kind = step["type"]
        if kind == "Replace":
            pattern = step["pattern"]
            built.append(decoders.Replace(pattern["String"] if "String" in pattern else Regex(pattern["Regex"]),
                                          step["content"]))
        elif kind == "Metaspace":
            built.append(decoders.Metaspace(replacement=step.get("replacement", "\u2581"),
                                            prepend_scheme=step.get("prepend_scheme", "always"),
                                            split=step.get("split", True)))
        elif kind == "WordPiece":
            built.append(decoders.WordPiece(prefix=step.get("prefix", "##"), cleanup=step.get("cleanup", True)))
        else:  # Strip, on each token
            built.append(decoders.Strip(content=step.get("content", " "), left=step.get("start", 0),
                                        right=step.get("stop", 0)))
    return decoders.Sequence(built) if built else None


def _compile(backend: Any, spec: Mapping[str, Any] | None, clean_up: bool) -> TokenBytes | str:
    """The table for the decoder ``spec``, or why it is not one this module reproduces."""
    steps = _steps(spec)
    if not steps:
        return "the tokenizer has no decoder (tokens are joined with spaces)"
    i = 0
    while i < len(steps) and steps[i]["type"] in _PER_TOKEN:
        i += 1
    per_token = steps[:i]
    assembly = ""
    if i < len(steps) and steps[i]["type"] in ("ByteLevel", "ByteFallback"):
        assembly = steps[i]["type"]
        i += 1
    fused = assembly == "ByteLevel"  # ByteLevel returns the whole text as one token
    strip = ("", 0)
    for step in steps[i:]:
        if step["type"] == "Fuse":
            fused = True
        elif step["type"] == "Strip" and fused and not step.get("stop") and strip == ("", 0):
            strip = (step.get("content", " "), int(step.get("start", 0)))
        else:
            return f"the decoder step {step['type']} at that place is not one the byte table reproduces"
    decoder = _per_token_decoder(per_token)
    if decoder is not None and decoder.decode([_ANCHOR]) != _ANCHOR:
        return "the per-token decoder steps change a NUL token"
    return TokenBytes(backend=backend, assembly=assembly, per_token=decoder, strip=strip, clean_up=clean_up)


def backend_of(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind ``tokenizer`` (mlxrt's, transformers' fast one, or
    mlx-lm's wrapper around one), or ``None``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if backend is not None and hasattr(backend, "id_to_token") else None


def token_bytes(tokenizer: Any) -> TokenBytes | str:
    """``tokenizer``'s decoder as a :class:`TokenBytes`, or why it cannot be one (the
    detokenizer then decodes windows of ids). The caller checks the table on :data:`PROBE`."""
    backend = backend_of(tokenizer)
    if backend is None:
        return "the tokenizer has no tokenizers backend"
    try:
        spec = json.loads(backend.decoder.__getstate__()) if backend.decoder is not None else None
    except (AttributeError, TypeError, ValueError) as exc:
        return f"its decoder cannot be read ({exc})"
    return _compile(backend, spec, bool(getattr(tokenizer, "clean_up_tokenization_spaces", False)))
