"""Encoding engine results as OpenAI bodies and stream chunks (chat and text completions)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from mlxrt.api import framing
from mlxrt.api.errors import openai_error_body
from mlxrt.api.headers import CACHE_HEADER, response_headers
from mlxrt.api.sse import sse_data
from mlxrt.api.timings import timings
from mlxrt.assembly import LogprobTrail
from mlxrt.errors import MlxrtError
from mlxrt.records import FinishEvent, TokenEvent, ToolCall

if TYPE_CHECKING:
    from mlxrt.api.pipeline import TextTurn, Turn
    from mlxrt.registry import PluginHost
    from mlxrt.serving import ServedModel

__all__ = [
    "ROUTE_OPT", "CACHE_HEADER", "response_headers",
    "usage", "completion_body", "chunk", "UsageTally", "choice_frames", "closing_frames", "tool_calls_json", "with_choices",
    "logprob_entries", "logprobs_block", "text_completion_body", "text_completion_chunk",
    "error_frame", "system_fingerprint", "turn_fingerprint", "GENERATION_FLAGS", "LogprobFrames"]

#: Route options every OpenAI handler carries: errors render as OpenAI error objects.
ROUTE_OPT = {"dialect": "openai", "render_error": openai_error_body}

#: ``mlxrt serve`` options (``host.options`` keys) that change what a request generates: the
#: server's sampling defaults, templating, weights' dtype, KV quantization, drafts, adapters.
GENERATION_FLAGS = ("temp", "top_p", "top_k", "min_p", "max_tokens", "chat_template", "chat_template_args",
                    "use_default_chat_template", "thinking", "dtype", "kv_quant", "kv_bits", "kv_group_size",
                    "quantized_kv_start", "draft_model", "num_draft_tokens", "adapter_path")


def system_fingerprint(host: PluginHost, model: ServedModel) -> str:
    """OpenAI's ``system_fingerprint``: ``fp_`` and 12 hex digits of a hash of what makes an
    answer reproducible here — the model (id, folder, type), the dtype its weights are served
    in, mlxrt's and MLX's versions and the generation flags (:data:`GENERATION_FLAGS`). The
    same loaded model under the same configuration always says the same (``host`` holds the
    flags, ``model`` is the model that answered)."""
    import hashlib
    import json

    import mlx.core as mx

    from mlxrt import __version__

    info = model.info
    dtype = model.loaded.dtype
    mlx_version = mx.__version__  # type: ignore[attr-defined]  # set at run time; mlx.core's stub omits it
    facts = {"model": [info.model_id, str(info.path), info.model_type],
             "dtype": getattr(dtype, "served", None), "mlxrt": __version__, "mlx": mlx_version,
             "flags": {k: host.options.get(k) for k in GENERATION_FLAGS}}
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()
    return f"fp_{digest[:12]}"


def turn_fingerprint(turn: Turn | TextTurn) -> str:
    """:func:`system_fingerprint` of the model a decoded turn was served by (the pipeline set
    the turn's ``host`` and ``served`` before any encoder sees it)."""
    if turn.host is None or turn.served is None:
        raise RuntimeError("the turn was not served through the pipeline")
    return system_fingerprint(turn.host, turn.served)

def usage(finish: FinishEvent, *more: FinishEvent) -> dict[str, Any]:
    """OpenAI's usage of one answer, or of its choices (``finish`` the first's, ``more`` the
    others'): the prompt counted once, completion tokens summed."""
    completion = finish.completion_tokens + sum(f.completion_tokens for f in more)
    return {
        "prompt_tokens": finish.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": finish.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": finish.cached_tokens},
    }


def with_choices(bodies: Sequence[dict[str, Any]], finishes: Sequence[FinishEvent]) -> dict[str, Any]:
    """One response body for several choices (OpenAI's ``n``) from each choice's own body
    (built with its ``index``): every body's choice, in order, and the usage of them all."""
    return {**bodies[0], "choices": [c for body in bodies for c in body["choices"]], "usage": usage(*finishes)}


def tool_calls_json(calls: tuple[ToolCall, ...], *, indexed: bool = False) -> list[dict[str, Any]]:
    out = []
    for i, call in enumerate(calls):
        item: dict[str, Any] = {"id": call.id, "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments}}
        if indexed:
            item = {"index": i, **item}
        out.append(item)
    return out


def _utf8(text: str) -> list[int]:
    # A lone surrogate cannot come out of a tokenizer's decode, but never fail on one.
    return list(text.encode("utf-8", errors="surrogatepass"))


def logprob_entries(events: Sequence[TokenEvent]) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content`` entries for the emitted tokens, plus each token's ``id``.

    ``token`` is the text the token added to the output (see :class:`mlxrt.records.TokenEvent`
    ``piece``), ``bytes`` its UTF-8; ``top_logprobs`` are best first.
    """
    return [{
        "token": ev.piece,
        "logprob": ev.logprob,
        "bytes": _utf8(ev.piece),
        "top_logprobs": [{"token": alt.text, "logprob": alt.logprob, "bytes": _utf8(alt.text), "id": alt.id}
                         for alt in ev.top_logprobs],
        "id": ev.token,
    } for ev in events]


def logprobs_block(events: Sequence[TokenEvent] | None, *, legacy: bool = False) -> dict[str, Any] | None:
    """``choices[i].logprobs``: ``None`` when not requested, else ``{"content": [...]}``.

    ``legacy`` adds the text-completions fields OpenAI's completions API used (``tokens``,
    ``token_logprobs``, ``top_logprobs`` as token → logprob maps, ``text_offset``), so both
    kinds of client find what they read.
    """
    if events is None:
        return None
    block: dict[str, Any] = {"content": logprob_entries(events)}
    if legacy:
        offsets, at = [], 0
        for ev in events:
            offsets.append(at)
            at += len(ev.piece)
        block.update(
            tokens=[ev.piece for ev in events],
            token_logprobs=[ev.logprob for ev in events],
            top_logprobs=[{alt.text: alt.logprob for alt in ev.top_logprobs} for ev in events],
            text_offset=offsets,
        )
    return block


def completion_body(*, id: str, created: int, model: str, content: str, reasoning: str,
                    calls: tuple[ToolCall, ...], finish_reason: str, finish: FinishEvent,
                    logprobs: Sequence[TokenEvent] | None = None, fingerprint: str | None = None,
                    index: int = 0) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content if (content or not calls) else None}
    if reasoning:
        # mlx_lm.server and mlx-bun say "reasoning"; vLLM/DeepSeek clients read "reasoning_content".
        message["reasoning"] = message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = tool_calls_json(calls)
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": index, "message": message, "logprobs": logprobs_block(logprobs),
                     "finish_reason": finish_reason}],
        "usage": usage(finish),
        "timings": timings(finish),
    }


def chunk(*, id: str, created: int, model: str, delta: dict[str, Any],
          finish_reason: str | None = None, usage_body: dict[str, Any] | None = None,
          logprobs: Sequence[TokenEvent] | None = None, fingerprint: str | None = None,
          index: int = 0, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` of choice ``index``; ``logprobs`` are the entries of the
    tokens it carries; ``extra``: top-level fields beside OpenAI's (llama-server's ``timings``,
    ``prompt_progress``)."""
    body: dict[str, Any] = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs_block(logprobs or None),
                     "finish_reason": finish_reason}],
    }
    if usage_body is not None:
        body["usage"] = usage_body
    body.update(extra or {})
    return body


class LogprobFrames:
    """The frames of one streamed choice, chat's or text completion's, each carrying the
    log-probability entries of the tokens released since the previous frame: text the
    reasoning splitter or tool router holds back keeps its entries until it is sent.

    ``make(**fields, logprobs=entries)`` is the chunk body (:func:`chunk` or
    :func:`text_completion_chunk` with the choice's id, model, index… bound)."""

    def __init__(self, make: Callable[..., dict[str, Any]]) -> None:
        self._make = make
        self._trail = LogprobTrail()
        self._carried: list[TokenEvent] = []  # entries of tokens whose text has not been sent yet

    def feed(self, event: TokenEvent) -> None:
        """A token arrived: its entry waits for the frame that sends its text."""
        self._carried.extend(self._trail.feed(event))

    def finish(self, event: FinishEvent) -> None:
        """The request finished: the entries its finish event releases wait too."""
        self._carried.extend(self._trail.finish(event))

    def frame(self, **fields: Any) -> bytes:
        """One SSE frame carrying every waiting entry."""
        entries = self._carried[:]
        self._carried.clear()
        return sse_data(self._make(logprobs=entries, **fields))


class UsageTally:
    """Usage in a stream of ``n`` choices: the finish chunk of the last choice to finish carries
    the usage of them all (:func:`usage`), unless ``include_usage`` moves it to OpenAI's last
    chunk (:func:`closing_frames`); without it, mlx-bun's habit, clients that read usage from
    the finish chunk find it there."""

    def __init__(self, n: int, include_usage: bool) -> None:
        self.n, self.include_usage = n, include_usage
        self._finishes: dict[int, FinishEvent] = {}

    def finished(self, index: int, finish: FinishEvent) -> dict[str, Any] | None:
        """Choice ``index`` finished: the usage its finish chunk carries, if any."""
        self._finishes[index] = finish
        return None if self.include_usage or len(self._finishes) < self.n else self.usage()

    def usage(self) -> dict[str, Any]:
        return usage(*(self._finishes[i] for i in sorted(self._finishes)))

    def timings(self) -> dict[str, Any]:
        """llama-server's ``timings`` of the first choice (:func:`mlxrt.api.timings.timings`)."""
        return timings(self._finishes[min(self._finishes)])


async def choice_frames(streams: Sequence[AsyncGenerator[bytes, None]], *, id: str, created: int, model: str, object: str,
                        tally: UsageTally, fingerprint: str | None = None) -> AsyncGenerator[bytes, None]:
    """A stream of every choice's chunks as they come (each choice's ``streams`` item ends
    with its finish chunk), then :func:`closing_frames`. Closing it closes every choice."""
    async with aclosing(framing.merged(streams)) as frames:
        async for frame in frames:
            yield frame
    for closing in closing_frames(id=id, created=created, model=model, object=object, tally=tally,
                                  fingerprint=fingerprint):
        yield closing


def closing_frames(*, id: str, created: int, model: str, object: str, tally: UsageTally,
                   fingerprint: str | None = None) -> list[bytes]:
    """What follows the finish chunks: with ``include_usage``, OpenAI's last chunk (no choices,
    the usage, and llama-server's ``timings``); then ``data: [DONE]``."""
    frames = []
    if tally.include_usage:
        frames.append(sse_data({"id": id, "object": object, "created": created, "model": model,
                                "system_fingerprint": fingerprint, "choices": [], "usage": tally.usage(),
                                "timings": tally.timings()}))
    frames.append(sse_data("[DONE]"))
    return frames


def text_completion_body(*, id: str, created: int, model: str, text: str, finish_reason: str,
                         finish: FinishEvent, logprobs: Sequence[TokenEvent] | None = None,
                         fingerprint: str | None = None, index: int = 0) -> dict[str, Any]:
    return {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": index, "text": text, "logprobs": logprobs_block(logprobs, legacy=True),
                     "finish_reason": finish_reason}],
        "usage": usage(finish),
        "timings": timings(finish),
    }


def text_completion_chunk(*, id: str, created: int, model: str, text: str, finish_reason: str | None = None,
                          usage_body: dict[str, Any] | None = None,
                          logprobs: Sequence[TokenEvent] | None = None,
                          fingerprint: str | None = None, index: int = 0,
                          extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": index, "text": text, "logprobs": logprobs_block(logprobs or None, legacy=True),
                     "finish_reason": finish_reason}],
    }
    if usage_body is not None:
        body["usage"] = usage_body
    body.update(extra or {})
    return body


def error_frame(exc: MlxrtError) -> bytes:
    # Then [DONE], as every OpenAI stream ends: clients that wait for it (rather than for the
    # connection to close) stop reading instead of hanging.
    return sse_data(openai_error_body(exc.status, exc.type, exc.message, exc.param, exc.code)) + sse_data("[DONE]")
