"""The serial lane's token loop: prefill a prompt into a cache, then sample one token at a time.

mlx-lm's ``generate_step`` does the same, and is what this is checked against (greedy output
equal token for token, tests/test_lean_start.py), but its module imports transformers at import time
(~1.2 s and ~40 MB of a server's start, docs/performance.md). The loop is small enough to own:

* all prompt tokens but the last are run in chunks of ``prefill_step_size`` (the cache state
  evaluated after each chunk, and MLX's buffer cache released when there are several);
* the last prompt token gives the first sample, handed out as soon as it is known (the next
  step's graph already built, queued when the caller asks for more or stops); every later step
  is queued (``async_eval``) before the current token is handed out, so the model computes
  token n+1 while the caller handles token n (after the last token too: the cache then holds
  every token handed out, and a caller that stops early finds the token it stopped at fed, as
  with mlx-lm).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import mlxrt.engine.qmv as qmv
from mlxrt.engine.sampling import bias_only

__all__ = ["token_steps"]

#: Steps between two releases of MLX's buffer cache while decoding (as mlx-lm).
CLEAR_EVERY = 256


def token_steps(prompt: Any, model: Any, *, cache: list[Any], stream: Any, max_tokens: int,
                sampler: Callable[[Any], Any] | None = None,
                processors: Sequence[Callable[[Any, Any], Any]] | None = None,
                prefill_step_size: int = 2048, embeddings: Any = None,
                progress: Callable[[int, int], None] | None = None,
                first_at_once: bool = True) -> Iterator[tuple[int, Any]]:
    """Yield ``(token, logprobs)`` for up to ``max_tokens`` tokens following ``prompt``.

    :param prompt: The token ids to feed (an ``mx.array``), after what ``cache`` already holds.
    :param cache: The model's per-layer caches, updated in place.
    :param stream: The MLX stream every step runs on.
    :param sampler: Log-probabilities → token; greedy when ``None``.
    :param processors: Logits processors, each called ``(history, logits)`` where history is
        every token fed so far in this call.
    :param embeddings: Input embeddings standing in for ``prompt`` (an image prompt), one row
        per prompt token.
    :param progress: Called ``(done, total)`` with prompt tokens run: at the start, after each
        prefill chunk, and once the first token is known.
    :param first_at_once: Hand the first token out before the next step is queued (the
        default). ``False`` queues it first, as every later step is and as mlx-lm's
        ``generate_step`` does: the order a lockstep rank 0 needs, whose other ranks run
        ``generate_step`` and must meet its collectives in the same order.
    """
    import mlx.core as mx
    from mlx_lm.sample_utils import greedy_sampler

    total = len(embeddings) if embeddings is not None else len(prompt)
    if total == 0:
        raise ValueError("Either input_embeddings or prompt (or both) must be provided.")
    sample = sampler or greedy_sampler
    report = progress or (lambda done, total: None)
    history: Any = None

    def forward(tokens: Any, rows: Any) -> Any:
        if rows is not None:
            return model(tokens[None], cache=cache, input_embeddings=rows[None])
        return model(tokens[None], cache=cache)

    reads_history = bool(processors) and not bias_only(processors)

    def remember(tokens: Any) -> None:
        nonlocal history
        if reads_history and len(tokens):
            history = tokens if history is None else mx.concatenate([history, tokens])

    def step(tokens: Any, rows: Any = None) -> tuple[Any, Any]:
        with mx.stream(stream):
            logits = forward(tokens, rows)[:, -1, :]
            remember(tokens)
            for processor in processors or ():
                logits = processor(history, logits)
            logprobs = qmv.log_softmax(logits)
            return qmv.draw(sample, logprobs), logprobs.squeeze(0)

    # Releasing MLX's buffer cache after each chunk bounds a long prefill's memory; after the
    # only chunk of a short prompt it would just cost the first token its buffers (~0.2 ms).
    long_prompt = total - 1 > prefill_step_size
    with mx.stream(stream):
        done = 0
        report(done, total)
        while total - done > 1:  # every prompt token but the last, in chunks
            n = min(prefill_step_size, total - done - 1)
            forward(prompt[:n], embeddings[:n] if embeddings is not None else None)
            mx.eval([layer.state for layer in cache])
            remember(prompt[:n])
            done += n
            report(done, total)
            prompt = prompt[n:]
            embeddings = embeddings[n:] if embeddings is not None else None
            if long_prompt:
                mx.clear_cache()

        token, logprobs = step(prompt, embeddings)
        mx.async_eval(token, logprobs)
        if max_tokens <= 0:
            return
        made = 0
        if not first_at_once:  # the lockstep order (see first_at_once): the loop queues first
            mx.eval(token)
            report(total, total)
        else:
            # The first token goes out before the next step is queued: MLX's async_eval returns
            # only once the stream has nearly caught up (it throttles at a few dozen queued
            # operations, and a decode step is ~900), so queueing first would hold the first token
            # back by a whole decode step. The next step's graph is built while the prompt's last
            # operations run.
            following = step(token)
            mx.eval(token)
            report(total, total)
            try:
                yield token.item(), logprobs
            finally:  # queued even when the caller stops here: the cache holds every token handed out
                mx.async_eval(*following)
            made = 1
            token, logprobs = following
        while made < max_tokens:
            # queue the next step before handing this token out; after the last one too, so the
            # cache ends holding every generated token (the next turn's prompt starts with them)
            following = step(token)
            mx.async_eval(*following)
            yield token.item(), logprobs
            made += 1
            if made % CLEAR_EVERY == 0:
                mx.clear_cache()
            token, logprobs = following
