"""Incremental detokenization: turn a token stream into stable text deltas.

Each step decodes only a short window (a few context tokens plus the tokens not yet
emitted), so the cost per token is constant. Text is held back while it ends in an
incomplete UTF-8 sequence (decoded as U+FFFD), so a character is never split; the context
tokens keep tokenizers that treat a leading space specially (SentencePiece's ``▁``) right.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["Detokenizer"]

_CONTEXT = 4
#: Give up waiting for a character to complete after this many tokens (the model may really
#: have produced U+FFFD, or invalid bytes).
_MAX_PENDING = 8


class Detokenizer:
    """Feed token ids one at a time; get back the newly stable text.

    :param decode: ``decode(ids) -> str`` (the tokenizer's, with special tokens kept or
        skipped as the caller wants).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._ctx = 0  # first id of the decode window (context)
        self._start = 0  # first id not yet emitted
        self._base = ""  # decode(ids[ctx:start])
        self.text = ""  # everything emitted so far

    @property
    def tokens(self) -> list[int]:
        return list(self._ids)

    def add(self, token: int) -> str:
        """Add one token; return the text that became stable (possibly empty)."""
        self._ids.append(token)
        window = self._decode(self._ids[self._ctx :])
        pending = len(self._ids) - self._start
        if window.endswith("\ufffd") and pending < _MAX_PENDING:
            return ""
        return self._emit(window)

    def preview(self, candidates: Sequence[int]) -> list[str]:
        """The text each candidate would add if it were the next token (for log-probability
        alternatives), decoded in the same context window as :meth:`add` uses, so a candidate
        equal to the token then added reads the same as that token's piece."""
        window = self._ids[self._ctx :]
        base = self._decode(window)
        out = []
        for token in candidates:
            text = self._decode([*window, token])
            out.append(text[len(base) :] if text.startswith(base) else self._decode([token]))
        return out

    def flush(self) -> str:
        """Return whatever is still held back (at the end of generation)."""
        if self._start == len(self._ids):
            return ""
        return self._emit(self._decode(self._ids[self._ctx :]))

    def _emit(self, window: str) -> str:
        # decode(ctx + new) starts with decode(ctx) for every tokenizer we know; if one ever
        # disagrees, fall back to a full decode diff so no text is lost or duplicated.
        if window.startswith(self._base):
            new = window[len(self._base) :]
        else:
            full = self._decode(self._ids)
            new = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += new
        self._start = len(self._ids)
        self._ctx = max(0, self._start - _CONTEXT)
        self._base = self._decode(self._ids[self._ctx : self._start])
        return new
