"""Turning engine events into a response's parts: content, reasoning, tool calls, logprobs.

Every dialect runs its events through one :class:`ResponseAssembler`, so reasoning
separation and tool routing behave the same on every API, and through one
:class:`LogprobTrail` when the client asked for log-probabilities.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterable, Callable, Mapping, Sequence
from typing import Any

import attrs

from mlxrt.records import (
    FamilyProfile,
    FinishEvent,
    FinishReason,
    PromptProgress,
    TokenEvent,
    ToolCall,
)
from mlxrt.text.reasoning import ReasoningSplitter
from mlxrt.text.tool_calls import ToolRouter

__all__ = ["Delta", "ResponseAssembler", "LogprobTrail", "drain"]


@attrs.frozen
class Delta:
    content: str = ""
    reasoning: str = ""

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning)


class ResponseAssembler:
    """Feed event text; get content/reasoning deltas; at the end, tool calls and the reason."""

    def __init__(self, profile: FamilyProfile, *, tools: Sequence[Mapping[str, Any]] | None,
                 starts_in_thinking: bool,
                 on_finish: Callable[[ResponseAssembler, FinishReason], None] | None = None) -> None:
        # on_finish sees the whole answer once; every dialect, streamed or not, ends here.
        self._on_finish = on_finish
        mode = profile.tool_stream_mode_with_tools if tools else profile.tool_stream_mode
        self._split = ReasoningSplitter(profile.thinking_format, starts_in_thinking=starts_in_thinking)
        self._tools = ToolRouter(profile.tool_parser, tools, mode)
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: tuple[ToolCall, ...] = ()
        self.warning: str | None = None
        #: A tool call cut off by ``max_tokens`` or a stop string was dropped (set by finish).
        self.dropped_partial_call = False

    def feed(self, text: str) -> Delta:
        reasoning, content = self._split.feed(text)
        return self._record(Delta(content=self._tools.feed(content), reasoning=reasoning))

    def finish(self, event: FinishEvent) -> tuple[Delta, FinishReason]:
        """Flush held text (``event.text`` first); return the last delta and the finish reason.

        The reason is ``length`` (Anthropic ``max_tokens``, Responses ``incomplete``) whenever
        ``max_tokens`` ended the turn, calls or not (mlx-lm's and vLLM's rule), and when a
        stop string ended it inside a call; else ``tool_calls`` when the answer has calls.
        An unfinished call is dropped wherever the turn ended
        (:meth:`mlxrt.text.tool_calls.ToolRouter.finish`); calls finished before it are kept.
        """
        cut = event.finish_reason == FinishReason.LENGTH or event.stop_sequence is not None
        r1, c1 = self._split.feed(event.text) if event.text else ("", "")
        r2, c2 = self._split.flush(cut=cut)
        content = self._tools.feed(c1 + c2)
        routed = self._tools.finish(cut=cut)
        self.tool_calls, self.warning = routed.calls, routed.warning
        self.dropped_partial_call = routed.dropped
        delta = self._record(Delta(content=content + routed.content, reasoning=r1 + r2))
        reason: FinishReason
        if event.finish_reason in (FinishReason.LENGTH, FinishReason.CANCELLED):
            reason = event.finish_reason
        elif routed.dropped and event.stop_sequence is not None:
            reason = FinishReason.LENGTH  # the stop string ended the turn inside a call
        else:
            reason = FinishReason.TOOL_CALLS if self.tool_calls else event.finish_reason
        if self._on_finish is not None:
            self._on_finish(self, reason)
        return delta, reason

    def _record(self, delta: Delta) -> Delta:
        if delta.content:
            self.content.append(delta.content)
        if delta.reasoning:
            self.reasoning.append(delta.reasoning)
        return delta


class LogprobTrail:
    """Releases each token's log-probability event once its text has reached the client.

    One event per generated token (EOS excluded), over every token: reasoning and tool-call
    markup included (mlx-bun's rule), so the pieces concatenate to the generated text. Text
    the stop matcher holds back holds its tokens back too; when a stop string matches, the
    token it starts in is trimmed to the part before it and tokens wholly inside it are
    dropped, so a stop string never leaks through logprobs either. A token whose piece is
    empty (the first bytes of a character the detokenizer still holds) waits for the token
    that completes the character; text released only at the end (a character never
    completed) is added to the last token's piece.
    """

    def __init__(self) -> None:
        self._pending: deque[TokenEvent] = deque()
        self._unclaimed = ""  # text sent to the client that no released piece accounts for yet

    def feed(self, event: TokenEvent) -> list[TokenEvent]:
        """Record ``event``; return the events whose whole piece is now visible, in order."""
        if event.logprob is None:
            return []
        self._pending.append(event)
        self._unclaimed += event.text
        return self._release()

    def finish(self, event: FinishEvent) -> list[TokenEvent]:
        """Release the rest: held text was either sent (``event.text``) or cut by a stop."""
        self._unclaimed += event.text
        out = self._release()
        unclaimed, kept = self._unclaimed, []
        for ev in self._pending:
            if ev.piece and not unclaimed:
                break  # this token and the rest lie inside the stop string
            take, unclaimed = unclaimed[: len(ev.piece)], unclaimed[len(ev.piece):]
            kept.append(ev if take == ev.piece else attrs.evolve(ev, piece=take))
        if unclaimed and (kept or out):
            last = kept.pop() if kept else out.pop()
            kept.append(attrs.evolve(last, piece=last.piece + unclaimed))
        self._pending.clear()
        self._unclaimed = ""
        return out + kept

    def _release(self) -> list[TokenEvent]:
        out: list[TokenEvent] = []
        while self._pending:
            empties = 0
            while empties < len(self._pending) and not self._pending[empties].piece:
                empties += 1
            if empties == len(self._pending):
                break
            piece = self._pending[empties].piece
            if not self._unclaimed.startswith(piece):
                break
            self._unclaimed = self._unclaimed[len(piece):]
            out.extend(self._pending.popleft() for _ in range(empties + 1))
        return out


async def drain(events: AsyncIterable[TokenEvent | FinishEvent | PromptProgress],
                on_text: Callable[[str], Any]) -> tuple[FinishEvent, list[TokenEvent]]:
    """Run a whole generation for a non-streaming response.

    Each token's text goes to ``on_text`` (the finish event's held text does not: the caller's
    assembler flushes it); returns the finish event and the logprob events, in order (empty
    when none were asked for). Prompt progress (a request that asked for it) has no place in
    a whole answer: it is skipped.
    """
    trail = LogprobTrail()
    logprobs: list[TokenEvent] = []
    async for event in events:
        if isinstance(event, PromptProgress):
            continue
        if isinstance(event, FinishEvent):
            return event, logprobs + trail.finish(event)
        on_text(event.text)
        logprobs += trail.feed(event)
    raise RuntimeError("the generation ended without a finish event")
