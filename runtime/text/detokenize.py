"""Incremental detokenization: turn a token stream into stable text deltas.

One :class:`Detokenizer` per generation turns every generated token into text; content,
reasoning, tool-call arguments, stop strings and log-probability texts are all cut from what
it returns, so they agree with each other and with the non-streamed answer.

Where the tokenizer's decoder is one :mod:`mlxrt.text.token_bytes` reproduces (byte-level
BPE, SentencePiece with ``<0xNN>`` byte fallback, Metaspace, WordPiece), each token adds its
bytes to one UTF-8 stream: the text is exact for any token sequence, streamed or not, and
only an incomplete UTF-8 sequence is held back (an invalid one reads as U+FFFD, one per
maximal invalid subpart, as Python and Rust's lossy decoding agree). Otherwise each step
decodes a short window of ids with the tokenizer's own ``decode`` (constant cost per token),
starting the window only where earlier text ended on a whole character, and holding text
back while it ends in U+FFFD.
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from mlxrt.text.token_bytes import CLEAN_UP, PROBE, TokenBytes, token_bytes

__all__ = ["Detokenizer", "Detokenizers"]

log = logging.getLogger("mlxrt.detokenize")

_CONTEXT = 4
#: Give up waiting for a character to complete after this many tokens (the model may really
#: have produced U+FFFD, or invalid bytes). Window decoding only.
_MAX_PENDING = 8
_MAX_WINDOW = 64
# Every proper prefix of a clean-up pattern: text ending in one may still change.
_CLEAN_UP_PREFIXES = frozenset(a[:k] for a, _ in CLEAN_UP for k in range(1, len(a)))
_HOLD_MAX = max(len(a) for a, _ in CLEAN_UP) - 1
_UTF8 = codecs.getincrementaldecoder("utf-8")  # (the codec lookup costs more than the decode)


@attrs.frozen
class _ByteState:
    """Where a byte-table stream stands (immutable, so :meth:`Detokenizer.preview` can try a
    token without taking it)."""

    started: bool = False  # a token was added (the next one is not the first)
    pending: bytes = b""  # an incomplete UTF-8 sequence
    strip: int = 0  # leading characters still to strip (``Strip`` after ``Fuse``)
    held: str = ""  # text a clean-up pattern may still change


def _clean(table: TokenBytes, held: str, text: str, final: bool) -> tuple[str, str]:
    """(text to emit, text to hold) after transformers' clean-up of ``held + text``."""
    if not table.clean_up:
        return text, ""
    text = held + text
    for a, b in CLEAN_UP:
        text = text.replace(a, b)
    if final:
        return text, ""
    for k in range(min(_HOLD_MAX, len(text)), 0, -1):
        if text[-k:] in _CLEAN_UP_PREFIXES:
            return text[:-k], text[-k:]
    return text, ""


def _step(table: TokenBytes, state: _ByteState, piece: bytes, *, final: bool = False) -> tuple[_ByteState, str]:
    decoder = _UTF8("replace")
    text = decoder.decode(state.pending + piece, final)
    pending = decoder.getstate()[0]
    strip = state.strip
    char, _ = table.strip
    while strip and text:
        if text[0] != char:
            strip = 0
            break
        text, strip = text[1:], strip - 1
    out, held = _clean(table, state.held, text, final)
    return _ByteState(started=True, pending=pending, strip=strip, held=held), out


class Detokenizer:
    """Feed token ids one at a time; get back the newly stable text.

    :param decode: ``decode(ids) -> str`` (the tokenizer's, special tokens kept), for window
        decoding; not needed with ``table``.
    :param table: the tokenizer's :class:`~mlxrt.text.token_bytes.TokenBytes` (exact byte
        streaming).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str] | None = None, *,
                 table: TokenBytes | None = None) -> None:
        if decode is None and table is None:
            raise ValueError("a Detokenizer needs a decode function or a byte table")
        self._decode = decode
        self._table = table
        self._state = _ByteState(strip=table.strip[1]) if table is not None else _ByteState()
        self._ids: list[int] = []
        self._ctx = 0  # first id of the decode window (context)
        self._start = 0  # first id not yet emitted
        self._whole: list[int] = [0]  # emission points where the text ended on a whole character
        self._base = ""  # decode(ids[ctx:start])
        self.text = ""  # everything emitted so far

    @property
    def tokens(self) -> list[int]:
        return list(self._ids)

    def add(self, token: int) -> str:
        """Add one token; return the text that became stable (possibly empty)."""
        self._ids.append(token)
        if self._table is not None:
            piece = self._table.piece(token, first=not self._state.started)
            self._state, new = _step(self._table, self._state, piece)
            self.text += new
            return new
        window = self._window_decode(self._ids[self._ctx:])
        pending = len(self._ids) - self._start
        if window.endswith("\ufffd") and pending < _MAX_PENDING:
            return ""
        return self._emit(window, whole=not window.endswith("\ufffd"))

    def preview(self, candidates: Sequence[int]) -> list[str]:
        """The text each candidate would add if it were the next token (for log-probability
        alternatives), as :meth:`add` would return it, so a candidate equal to the token then
        added reads the same as that token's piece."""
        if self._table is not None:
            table, state = self._table, self._state
            return [_step(table, state, table.piece(t, first=not state.started))[1] for t in candidates]
        window = self._ids[self._ctx:]
        base = self._window_decode(window)
        out = []
        for token in candidates:
            text = self._window_decode([*window, token])
            out.append(text[len(base):] if text.startswith(base) else self._window_decode([token]))
        return out

    def flush(self) -> str:
        """Return whatever is still held back (at the end of generation)."""
        if self._table is not None:
            self._state, new = _step(self._table, self._state, b"", final=True)
            self.text += new
            return new
        if self._start == len(self._ids):
            return ""
        return self._emit(self._window_decode(self._ids[self._ctx:]), whole=False)

    def _window_decode(self, ids: Sequence[int]) -> str:
        assert self._decode is not None
        return self._decode(ids)

    def _emit(self, window: str, *, whole: bool) -> str:
        # decode(ctx + new) starts with decode(ctx) for every tokenizer we know; if one ever
        # disagrees, fall back to a full decode diff so no text is lost or duplicated.
        if window.startswith(self._base):
            new = window[len(self._base):]
        else:
            full = self._window_decode(self._ids)
            new = full[len(self.text):] if full.startswith(self.text) else ""
        self.text += new
        self._start = len(self._ids)
        if whole:
            self._whole.append(self._start)
        # The next window starts at least _CONTEXT ids back (a leading space reads as in the
        # full text), at a point where the text ended on a whole character: a window starting
        # inside a character spelled in bytes decodes that character's remaining bytes as
        # U+FFFD, and ByteFallback then turns its whole byte run into U+FFFD.
        # (Output that never ends on a whole character, invalid bytes only, lets the window
        # grow to _MAX_WINDOW ids at most.)
        fits = [i for i in self._whole if i <= self._start - _CONTEXT]
        self._ctx = fits[-1] if fits else 0
        if self._start - self._ctx > _MAX_WINDOW:
            self._ctx = self._start - _CONTEXT
        self._whole = [i for i in self._whole if i >= self._ctx]
        self._base = self._window_decode(self._ids[self._ctx:self._start])
        return new


@attrs.frozen
class Detokenizers:
    """Makes one model's detokenizers: its byte table (built and checked once per load) or,
    failing that, its ``decode``.

    :ivar reason: why the table is not used (``None`` when it is).
    """

    decode: Callable[[Sequence[int]], str]
    table: TokenBytes | None
    reason: str | None = None

    @classmethod
    def of(cls, tokenizer: Any) -> Detokenizers:
        """``tokenizer``'s detokenizers; the table is checked against ``tokenizer.decode`` on
        :data:`~mlxrt.text.token_bytes.PROBE`, and dropped (reason logged) on a mismatch."""
        def decode(ids: Sequence[int]) -> str:
            text: str = tokenizer.decode(list(ids), skip_special_tokens=False)
            return text

        try:
            table = token_bytes(tokenizer)
        except Exception as exc:  # a decoder description this module misreads: windows are safe
            table = f"its decoder could not be compiled: {type(exc).__name__}: {exc}"
        if isinstance(table, str):
            log.info("detokenizer: %s; decoding windows of ids", table)
            return cls(decode=decode, table=None, reason=table)
        try:
            ids = list(tokenizer.encode(PROBE, add_special_tokens=False))
            expected = decode(ids)
            # Whether transformers cleans up spaces is settled by trying both: its attribute
            # does not say that transformers 5 skips the clean-up for BPE models.
            for candidate in (table, attrs.evolve(table, clean_up=not table.clean_up)):
                got = cls(decode=decode, table=candidate).decode_all(ids)
                if got == expected:
                    return cls(decode=decode, table=candidate)
            reason = f"the byte table reads the probe as {got!r}, the tokenizer as {expected!r}"
        except Exception as exc:  # a tokenizer that cannot encode the probe: windows are safe
            reason = f"the probe failed: {type(exc).__name__}: {exc}"
        log.warning("detokenizer: %s; decoding windows of ids", reason)
        return cls(decode=decode, table=None, reason=reason)

    def new(self) -> Detokenizer:
        """A detokenizer for one generation."""
        return Detokenizer(self.decode, table=self.table)

    def decode_all(self, ids: Sequence[int]) -> str:
        """``ids`` as a stream of them concatenates to (what every answer's text is)."""
        detok = self.new()
        return "".join([detok.add(i) for i in ids] + [detok.flush()])
