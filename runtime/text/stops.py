"""Stop strings matched on decoded text.

mlx_lm.server matches stop sequences on token ids, so a stop string that starts inside a
token is cut out but does not stop generation. mlxrt matches on text: generation stops at
the first occurrence, the stop string and what follows are never sent, and text that might
be the beginning of a stop string is held back until it is known not to be.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["StopMatcher"]


class StopMatcher:
    """Feed text deltas; get back what is safe to send and whether a stop string matched."""

    def __init__(self, stops: Iterable[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped: str | None = None

    def feed(self, text: str) -> tuple[str, bool]:
        """Return ``(text_to_emit, stopped)``. After a stop, further input is ignored."""
        if self.stopped is not None:
            return "", True
        if not self.stops:
            return text, False
        buf = self._held + text
        first: tuple[int, str] | None = None
        for stop in self.stops:
            at = buf.find(stop)
            if at >= 0 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            self._held = ""
            self.stopped = first[1]
            return buf[: first[0]], True
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """Text held back as a possible stop prefix, released at the end of generation."""
        held, self._held = self._held, ""
        return "" if self.stopped is not None else held

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
