"""Reasoning separation: split generated text into reasoning and content by the model's
thinking format (``<think>…</think>`` for Qwen3, for example).

Tags may arrive split across deltas: text that could be the start of a tag is held back
until it is known. The splitter never drops text: at the end, held text is released into
whichever channel is open.
"""

from __future__ import annotations

from mlxrt.records import ThinkingFormat

__all__ = ["ReasoningSplitter", "prompt_opens_thinking"]


def prompt_opens_thinking(rendered_prompt: str, fmt: ThinkingFormat | None) -> bool:
    """True when the rendered prompt ends inside an open reasoning span."""
    if fmt is None:
        return False
    at = rendered_prompt.rfind(fmt.open)
    return at >= 0 and rendered_prompt.find(fmt.close, at) < 0 and not rendered_prompt[at + len(fmt.open):].strip()


class ReasoningSplitter:
    """Feed content deltas; get ``(reasoning, content)`` deltas back."""

    def __init__(self, fmt: ThinkingFormat | None, *, starts_in_thinking: bool = False) -> None:
        self.fmt = fmt
        self.thinking = fmt is not None and (starts_in_thinking or fmt.starts_in_thinking)
        self._held = ""
        self._seen_open = self.thinking
        self._closed = False
        self._strip = False  # drop the newlines a model puts right after its close tag

    def feed(self, text: str) -> tuple[str, str]:
        if self.fmt is None:
            return "", text
        reasoning: list[str] = []
        content: list[str] = []
        buf = self._held + text
        self._held = ""
        while buf:
            if self.thinking:
                tag = self.fmt.close
            elif not self._seen_open and not self._closed:
                tag = self.fmt.open
            else:
                content.append(buf)
                break
            at = buf.find(tag)
            out = reasoning if self.thinking else content
            if at >= 0:
                out.append(buf[:at])
                buf = buf[at + len(tag):]
                if self.thinking:
                    self.thinking, self._closed, self._strip = False, True, True
                else:
                    self.thinking = self._seen_open = True
                continue
            keep = _partial(buf, tag)
            out.append(buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep:]
            break
        return "".join(reasoning), self._content("".join(content))

    def _content(self, text: str) -> str:
        if self._strip and text:
            text = text.lstrip("\n")
            self._strip = not text
        return text

    def flush(self, *, cut: bool = False) -> tuple[str, str]:
        """Release held text. ``cut``: the generation was stopped (``max_tokens``, a stop
        string) inside the open tag (Gemma 4's ``<|channel>thought\n`` is several tokens), so
        the block had begun: what follows the partial tag is reasoning, the tag itself no text."""
        held, self._held = self._held, ""
        if self.thinking:
            return held, ""
        if cut and len(held) > 1 and not self._seen_open and not self._closed:
            return "", ""  # held is a prefix of the open tag (see feed)
        return "", self._content(held)


def _partial(buf: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:n]):
            return n
    return 0
