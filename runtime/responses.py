"""Turning engine events into a response's parts: content, reasoning and tool calls.

Every dialect runs its events through one :class:`ResponseAssembler`, so reasoning
separation and tool routing behave the same on every API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxrt.reasoning import ReasoningSplitter
from mlxrt.records import FamilyProfile, FinishEvent, FinishReason, ToolCall
from mlxrt.tool_calls import ToolRouter

__all__ = ["Delta", "ResponseAssembler"]


@attrs.frozen
class Delta:
    content: str = ""
    reasoning: str = ""

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning)


class ResponseAssembler:
    """Feed event text; get content/reasoning deltas; at the end, tool calls and the reason."""

    def __init__(self, profile: FamilyProfile, *, tools: Sequence[Mapping[str, Any]] | None,
                 starts_in_thinking: bool) -> None:
        mode = profile.tool_stream_mode_with_tools if tools else profile.tool_stream_mode
        self._split = ReasoningSplitter(profile.thinking_format, starts_in_thinking=starts_in_thinking)
        self._tools = ToolRouter(profile.tool_parser, tools, mode)
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: tuple[ToolCall, ...] = ()
        self.warning: str | None = None

    def feed(self, text: str) -> Delta:
        reasoning, content = self._split.feed(text)
        return self._record(Delta(content=self._tools.feed(content), reasoning=reasoning))

    def finish(self, event: FinishEvent) -> tuple[Delta, FinishReason]:
        """Flush held text (``event.text`` first); return the last delta and the finish reason."""
        r1, c1 = self._split.feed(event.text) if event.text else ("", "")
        r2, c2 = self._split.flush()
        content = self._tools.feed(c1 + c2)
        routed = self._tools.finish()
        self.tool_calls, self.warning = routed.calls, routed.warning
        delta = self._record(Delta(content=content + routed.content, reasoning=r1 + r2))
        reason = FinishReason.TOOL_CALLS if self.tool_calls else event.finish_reason
        return delta, reason

    def _record(self, delta: Delta) -> Delta:
        if delta.content:
            self.content.append(delta.content)
        if delta.reasoning:
            self.reasoning.append(delta.reasoning)
        return delta
