"""Tool-call routing for decoded-text families (``buffered-text`` mode).

Content streams as usual until the family parser's start marker appears; from there the
text is buffered and parsed when generation ends. A call that cannot be parsed is returned
as content with a warning: never dropped silently, never a server error.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxrt.records import ToolCall, ToolParser, ToolStreamMode

__all__ = ["ToolRouter", "RoutedTools"]

log = logging.getLogger("mlxrt.tools")


@attrs.frozen
class RoutedTools:
    content: str
    calls: tuple[ToolCall, ...]
    warning: str | None = None


class ToolRouter:
    """Feed content deltas; text that belongs to tool calls is held and parsed at the end."""

    def __init__(self, parser: ToolParser | None, tools: Sequence[Mapping[str, Any]] | None,
                 mode: ToolStreamMode) -> None:
        self.parser = parser
        self.tools = tools
        self.active = bool(parser is not None and tools and mode is ToolStreamMode.BUFFERED_TEXT)
        self._held = ""
        self._capture: str | None = None

    def feed(self, text: str) -> str:
        if not self.active:
            return text
        if self._capture is not None:
            self._capture += text
            return ""
        assert self.parser is not None
        buf = self._held + text
        at = buf.find(self.parser.start)
        if at >= 0:
            self._held, self._capture = "", buf[at:]
            return buf[:at]
        keep = next((n for n in range(min(len(self.parser.start) - 1, len(buf)), 0, -1)
                     if buf.endswith(self.parser.start[:n])), 0)
        self._held = buf[len(buf) - keep:]
        return buf[: len(buf) - keep]

    def finish(self) -> RoutedTools:
        held, self._held = self._held, ""
        if self._capture is None:
            return RoutedTools(content=held, calls=())
        text, self._capture = self._capture, None
        assert self.parser is not None
        try:
            calls = self.parser.parse(text, self.tools)
        except Exception as exc:  # a family parser's failure is the model's malformed output
            warning = f"could not parse tool call: {type(exc).__name__}: {exc}"
            log.warning(warning)
            return RoutedTools(content=held + text, calls=(), warning=warning)
        if not calls:
            return RoutedTools(content=held + text, calls=(), warning="tool call markup without a call")
        return RoutedTools(
            content=held,
            calls=tuple(c if c.id else attrs.evolve(c, id=f"call_{uuid.uuid4().hex[:24]}") for c in calls),
        )
