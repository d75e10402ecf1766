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
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from mlxrt.compat import hf_tokenizer
from mlxrt.errors import InvalidRequest, QueueFull
from mlxrt.plugins.structured.cache import GrammarCache
from mlxrt.plugins.structured.limits import DEFAULT_LIMITS, GrammarLimits, check_limits
from mlxrt.records import StructuredOutput

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a stub-only TypedDict

__all__ = ["Grammars", "GrammarProcessor", "ThinkingWindow", "grammar_text"]

#: Compact JSON (no free whitespace): a model cannot stall in endless spaces, and the answer
#: is what ``json.dumps(..., separators=(",", ":"))`` would print. A schema's own
#: ``x-guidance`` options override it.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
#: Seconds a compile may take, waiting for the compiler included (a 400 past it).
COMPILE_SECONDS = 5.0
#: The compile thread's stack (virtual: only the pages a deep grammar touches are used).
COMPILE_STACK_BYTES = 256 * 2**20

T = TypeVar("T")


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
        raise InvalidRequest(f"{param}: {_message([str(exc)])}", param=param.split(".")[0]) from None
    raise InvalidRequest(f"{param}: unknown structured output kind {structured.kind!r}", param=param)


class Grammars:
    """The served tokenizer as llguidance sees it, and its compiled matchers (kept in the
    server's :class:`~mlxrt.plugins.structured.cache.GrammarCache`).

    Thread-safe: dialects compile on worker threads, the engine thread copies matchers.
    """

    def __init__(self, tokenizer: Any, cache: GrammarCache | None = None, *,
                 limits: GrammarLimits = DEFAULT_LIMITS, deadline_s: float = COMPILE_SECONDS) -> None:
        # weakly: the plugin state maps each tokenizer to its Grammars weakly, and a strong
        # reference back from the value kept an unloaded model's tokenizer, and its grammars, alive
        self._source = weakref.ref(tokenizer)
        self.cache = cache if cache is not None else GrammarCache()
        self.limits = limits
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._owner = self.cache.owner(self)

    @property
    def source(self) -> Any:
        """The served tokenizer (``None`` once its model is gone)."""
        return self._source()

    @property
    def tokenizer(self) -> Any:
        """The ``llguidance.LLTokenizer`` (built once, on first use: ~1–7 s for a 150k–260k
        vocabulary, so never at startup of a server that may not use it)."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = _ll_tokenizer(self.source)
            return self._tokenizer

    def matcher(self, structured: StructuredOutput) -> Any:
        """A fresh matcher for ``structured`` (compiled once per canonical constraint, within
        the limits and the deadline; a past-the-limits constraint is a 400 before any work)."""
        key = (self._owner, str(structured.kind), structured.spec)
        template = self.cache.get(key)
        if template is not None:
            return template.deep_copy()
        check_limits(structured, self.limits)
        tokenizer = self.tokenizer
        template, cost = _isolated(lambda: self._compile(structured, tokenizer), self.cache.compiling,
                                   self.deadline_s, structured)
        self.cache.put(key, template, cost)
        return template.deep_copy()

    def _compile(self, structured: StructuredOutput, tokenizer: Any) -> tuple[Any, int]:
        """Compile on the compile thread, under the cache's compile lock: the matcher and the
        heap bytes its compile kept (0 where the platform cannot say)."""
        import llguidance

        measure = self.cache.measure
        before = measure() if measure else 0
        grammar = grammar_text(structured)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, tokenizer, limits=_parser_limits())
        if is_error:
            raise _invalid(structured, _message(messages))
        template = llguidance.LLMatcher(tokenizer, grammar, limits=_parser_limits())
        if template.is_error():
            raise _invalid(structured, _message([template.get_error()]))
        return template, (measure() - before if measure else 0)


def _parser_limits() -> Any:
    """llguidance's own limits, its defaults except the errors: not verbose (a verbose error
    prints the grammar and the parser's state into the client's message)."""
    import llguidance

    return llguidance.LLParserLimits(verbose_errors=False)


def _isolated(compile: Callable[[], T], lock: threading.Lock, deadline_s: float,
              structured: StructuredOutput) -> T:
    """``compile()`` on a fresh thread with a :data:`COMPILE_STACK_BYTES` stack, holding
    ``lock``; its result, or its error, within ``deadline_s`` (waiting for the lock included).

    Why a thread of its own: llguidance recurses per nested rule or ``$ref``, and a stack
    overflow in it kills the process; the limits (:mod:`.limits`) keep a grammar's depth
    ~10x below what this stack holds. Past the deadline the caller gets a 400 and the thread
    runs to its end alone (the limits bound that too), holding the lock, so abandoned compiles
    never pile up: the next compile waits for it within its own deadline, else a 429.
    """
    start = time.monotonic()
    if not lock.acquire(timeout=deadline_s):
        raise QueueFull(f"{structured.param}: the grammar compiler is busy; retry", retry_after=1,
                        code="grammar_compiler_busy")
    compiled: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            compiled.append(compile())
        except BaseException as exc:  # handed to the caller, whichever it is
            failed.append(exc)
        finally:
            lock.release()

    # threading.stack_size is process-wide: set for this thread only (under ``lock``, so no
    # other compile changes it meanwhile; a thread another part starts now gets a larger
    # virtual stack, which costs nothing)
    previous = threading.stack_size(COMPILE_STACK_BYTES)
    try:
        thread = threading.Thread(target=run, name="mlxrt-grammar-compile", daemon=True)
        thread.start()
    except BaseException:
        lock.release()
        raise
    finally:
        threading.stack_size(previous)
    thread.join(max(0.0, deadline_s - (time.monotonic() - start)))
    if not compiled and not failed:
        raise _invalid(structured, f"the grammar did not compile within {deadline_s:g} s; simplify it",
                       code="grammar_too_large")
    if failed:
        raise failed[0]
    return compiled[0]


def _invalid(structured: StructuredOutput, message: str, code: str | None = None) -> InvalidRequest:
    return InvalidRequest(f"{structured.param}: {message}", param=structured.param.split(".")[0], code=code)


def _message(messages: list[str]) -> str:
    """The first line of llguidance's message, short; a Rust panic's text (with its source
    paths and backtrace) is never shown."""
    text = " ".join(m for m in messages if m) or "the grammar does not compile"
    if "panicked" in text or "RUST_BACKTRACE" in text or "stack backtrace" in text:
        return "the grammar library could not compile this grammar; simplify it"
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
