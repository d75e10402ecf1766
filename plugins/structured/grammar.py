"""Grammars for structured outputs (llguidance): compile, cache, and mask the logits per token.

A :class:`~mlxrt.records.StructuredOutput` becomes an llguidance grammar, validated against
the served tokenizer and compiled into a matcher. The compiled matcher is cached by the
constraint's canonical text (an LRU), so a schema sent again costs a copy; each request gets
its own copy and advances it as tokens are sampled. docs/structured-outputs.md says why
llguidance, with the measurements.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import attrs

from mlxrt.compat import hf_tokenizer
from mlxrt.errors import InvalidRequest
from mlxrt.records import StructuredOutput

__all__ = ["Grammars", "GrammarProcessor", "ThinkingWindow", "grammar_text"]

#: Compact JSON (no free whitespace): a model cannot stall in endless spaces, and the answer
#: is what ``json.dumps(..., separators=(",", ":"))`` would print. A schema's own
#: ``x-guidance`` options override it.
_JSON_OPTIONS = {"whitespace_flexible": False}
#: Compiled matchers kept per served tokenizer.
CACHE_SIZE = 128


def grammar_text(structured: StructuredOutput) -> str:
    """The llguidance grammar for a constraint; a client error is an :class:`InvalidRequest`."""
    import llguidance

    from mlxrt.text.json_numbers import JSON_OBJECT, bounded_numbers

    param = structured.param
    try:
        if structured.kind == "json_schema":
            # Numbers get a bounded number of digits (docs/structured-outputs.md).
            schema = bounded_numbers(json.loads(structured.spec))
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        if structured.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema(bounded_numbers(JSON_OBJECT), defaults=_JSON_OPTIONS)
        if structured.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(structured.spec)
        if structured.kind == "lark":  # a whole grammar (a forced tool call: mlxrt.text.tool_grammar)
            return llguidance.LLMatcher.grammar_from_lark(structured.spec)
        if structured.kind == "gbnf":  # llama.cpp's grammar format (the grammar field)
            from llguidance.gbnf_to_lark import gbnf_to_lark

            return llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(structured.spec))
        if structured.kind == "choice":
            # Lark string literals take JSON escapes: each choice is matched literally.
            alternatives = " | ".join(json.dumps(c) for c in json.loads(structured.spec))
            return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}\n")
    except Exception as exc:  # llguidance refuses the client's constraint: the client's 400
        raise InvalidRequest(f"{param}: {exc}", param=param.split(".")[0]) from None
    raise InvalidRequest(f"{param}: unknown structured output kind {structured.kind!r}", param=param)


class Grammars:
    """The served tokenizer as llguidance sees it, and an LRU of compiled matchers.

    Thread-safe: dialects compile on worker threads, the engine thread copies matchers.
    """

    def __init__(self, tokenizer: Any, *, size: int = CACHE_SIZE) -> None:
        self.source = tokenizer
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.size = size

    @property
    def tokenizer(self) -> Any:
        """The ``llguidance.LLTokenizer`` (built once, on first use: ~1–7 s for a 150k–260k
        vocabulary, so never at startup of a server that may not use it)."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = _ll_tokenizer(self.source)
            return self._tokenizer

    def matcher(self, structured: StructuredOutput) -> Any:
        """A fresh matcher for ``structured`` (compiled once per canonical constraint)."""
        import llguidance

        key = (structured.kind, structured.spec)
        with self._lock:
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
                return template.deep_copy()
        tokenizer = self.tokenizer
        grammar = grammar_text(structured)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if is_error:
            raise InvalidRequest(f"{structured.param}: {_message(messages)}",
                                 param=structured.param.split(".")[0])
        template = llguidance.LLMatcher(tokenizer, grammar)
        if template.is_error():
            raise InvalidRequest(f"{structured.param}: {template.get_error()}",
                                 param=structured.param.split(".")[0])
        with self._lock:
            self._cache[key] = template
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return template.deep_copy()


def _message(messages: list[str]) -> str:
    text = " ".join(messages) or "the grammar does not compile"
    return text.splitlines()[0][:500]


def _ll_tokenizer(tokenizer: Any) -> Any:
    """An mlx-lm ``TokenizerWrapper`` (or a Hugging Face fast tokenizer) → ``LLTokenizer``."""
    import llguidance.hf
    import transformers

    hf = hf_tokenizer(tokenizer)
    if not isinstance(hf, transformers.PreTrainedTokenizerFast):
        raise InvalidRequest("structured outputs need a Hugging Face fast tokenizer; the served model "
                             f"has {type(hf).__name__}", param="response_format",
                             code="unsupported_parameter")
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or ()) or hf.eos_token_id
    return llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=eos)


@attrs.frozen
class ThinkingWindow:
    """The think block a prompt left open (Qwen3.5, MiniCPM5 templates), which the grammar
    leaves free until ``close_ids``: the answer after it follows the format."""

    close_ids: tuple[int, ...]


class GrammarProcessor:
    """mlx-lm logits processor: every token the grammar forbids gets ``-inf``.

    The first call sees the prompt; every later call first advances the matcher by the token
    sampled last (``tokens[-1]``), so it works per row in the batch lane (each row has its own
    processor) and in the serial lane alike. Ids past the tokenizer (an embedding padded for
    speed) are always masked. Once the grammar is complete only EOS remains. With a
    :class:`ThinkingWindow` the think block is left free and the grammar starts after it.
    """

    def __init__(self, matcher: Any, tokenizer_vocab: int, thinking: ThinkingWindow | None = None) -> None:
        from llguidance.numpy import allocate_token_bitmask

        self.matcher = matcher
        self.vocab = tokenizer_vocab
        self._bitmask = allocate_token_bitmask(1, tokenizer_vocab)
        self._started = False
        self._thinking = thinking
        #: ``thinking`` (free until the block closes), then ``grammar``
        self.phase = "grammar" if thinking is None else "thinking"
        self._tail: list[int] = []

    def _advance(self, token: int) -> None:
        if self.phase == "thinking":
            assert self._thinking is not None
            close = self._thinking.close_ids
            self._tail = (self._tail + [token])[-len(close):]
            if tuple(self._tail) == close:
                self.phase = "grammar"
            return
        self.matcher.consume_token(token)

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx
        import numpy as np
        from llguidance.numpy import fill_next_token_bitmask

        # Start the forward pass now: the mask is computed on the CPU while it runs.
        mx.async_eval(logits)
        if self._started:
            self._advance(int(tokens.reshape(-1)[-1].item()))
        self._started = True
        if self.phase == "thinking":  # reasoning is free; the format applies to the answer
            return logits
        fill_next_token_bitmask(self.matcher, self._bitmask, 0)
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[: self.vocab]
        width = logits.shape[-1]
        if width == self.vocab:
            allowed = bits.astype(np.bool_)
        else:  # padded embedding rows (masked), or a tokenizer larger than the head (cut)
            allowed = np.zeros(width, dtype=np.bool_)
            n = min(width, self.vocab)
            allowed[:n] = bits[:n]
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))
