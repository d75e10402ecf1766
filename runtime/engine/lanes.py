"""The engine's two ways of running requests, and the per-request state both share.

* :class:`SerialLane` runs one request at a time with :func:`mlxrt.engine.steps.token_steps` (one
  sequence, no padding, no batch masks: the fastest single stream). It takes every request
  when ``--batch 1`` (the default) and every request of a model whose cache classes cannot
  be merged into a batch (mlx-lm's ``merge``; see :func:`batchable`).
* :class:`BatchLane` runs up to ``--batch N`` requests together with
  :class:`mlxrt.engine.batch_steps.BatchSteps` (continuous batching on mlx-lm's model modules
  and cache classes, without ``mlx_lm.generate`` and its transformers import): newcomers join
  between decode steps, their prefill runs in chunks of ``--prefill-step-size`` interleaved
  with the running rows' decode steps, and every row keeps its own sampler, seed stream,
  logits processors, max_tokens and stop matcher.

Both lanes run on the engine's worker thread only, and both hand back, when a row ends,
its per-layer cache and the token ids that cache holds, for the prompt cache. For a model
whose cache cannot be rewound (sliding windows, recurrent state; see
:func:`mlxrt.cache.prompt_cache.keeps_snapshots`) both also keep ``Row.snapshots``: copies of the
cache when it held the prompt up to the turn boundary (``GenerationRequest.turn_start``) and
up to its last token, the points an exact repeat or the next turn can extend.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from mlxrt.errors import EngineError, MlxrtError
from mlxrt.records import (
    CacheReport,
    FinishEvent,
    FinishReason,
    GenerationRequest,
    PromptProgress,
    TokenEvent,
    TokenLogprob,
)
from mlxrt.text.detokenize import Detokenizer
from mlxrt.text.stops import StopMatcher

__all__ = ["Job", "Row", "SerialLane", "BatchLane", "batchable", "RequestTimeout", "isolate", "generation_error"]

log = logging.getLogger("mlxrt.engine.engine")


class RequestTimeout(MlxrtError):
    """A denoising request ran past ``--request-timeout`` (504); its partial output is discarded.
    (An autoregressive one ends there with ``length`` instead: :meth:`Row.past_deadline`.)"""

    status = 504
    type = "timeout_error"

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the request did not finish within the request timeout of {seconds:g} s",
                         code="request_timeout")


@attrs.define(eq=False)
class Job:
    """A submitted request, from the HTTP side's ``generate`` until its last event.

    ``deliver`` hands an item (a :class:`CacheReport`, a token or finish event, or an
    exception) to the request's handle; it is safe to call from the worker thread.
    ``cancelled`` is set by the handle when its consumer goes away.
    """

    request: GenerationRequest
    deliver: Callable[[Any], None]
    submitted: float = attrs.field(factory=time.monotonic)
    cancelled: Any = None  # threading.Event, set by the engine
    deadline: float | None = None
    #: Tokens of prompt-cache snapshots the row may keep while it runs (admission counts them).
    snapshot_tokens: int = 0
    #: What a job past its deadline ends with, when not the request timeout (shutdown).
    deadline_error: MlxrtError | None = None

    @property
    def need(self) -> int:
        """Tokens of context the request may occupy: prompt plus max_tokens (plus its snapshots)."""
        return len(self.request.prompt_ids) + max(self.request.max_tokens, 0) + self.snapshot_tokens


@attrs.define(eq=False)
class Row:
    """One admitted request while it runs: its sampler chain, cache start and text state."""

    job: Job
    sampler: Any
    processors: list[Any]
    report: CacheReport
    cache: list[Any] | None  # the prompt cache's copy (``reused`` tokens), or None
    reused: int
    eos: frozenset[int]
    detok: Detokenizer
    stops: StopMatcher
    timeout: float | None = None
    #: It ran into ``--request-timeout`` (:meth:`past_deadline`).
    timed_out: bool = False
    produced: int = 0
    generated: list[int] = attrs.field(factory=list)
    uid: int | None = None
    #: Mount keys of the request's adapters, pinned at admission (see :mod:`mlxrt.engine.adapters`).
    adapters: tuple[str, ...] = ()
    error: MlxrtError | None = None
    #: Why the row is being removed, when the lane (not the generator) decided it ends.
    ending: FinishReason | None = None
    started: float = attrs.field(factory=time.monotonic)
    first_token_at: float | None = None
    #: ``(token ids, cache)`` copies taken inside the prompt, for the prompt cache.
    snapshots: list[tuple[list[int], list[Any]]] = attrs.field(factory=list)
    #: The last ``processed`` count a :class:`PromptProgress` reported (-1: none yet).
    reported: int = -1

    @property
    def request(self) -> GenerationRequest:
        return self.job.request

    def report_progress(self, processed: int) -> None:
        """Prompt tokens the cache holds now (``processed``, the reused ones included): a
        :class:`PromptProgress` for a request that asked for them, once per new count."""
        total = len(self.request.prompt_ids)
        processed = min(processed, total)
        if not self.request.progress or processed <= self.reported:
            return
        self.reported = processed
        self.job.deliver(PromptProgress(total=total, cache=min(self.reused, total), processed=processed,
                                        seconds=time.monotonic() - self.started))

    def on_token(self, token: int, logprobs: Any) -> FinishReason | None:
        """Account for one generated token and emit its text; the reason to stop, if any."""
        if self.error is not None:  # its sampler chain failed (see isolate): the token is not its own
            return FinishReason.CANCELLED
        self.produced += 1
        self.generated.append(token)
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
            self.report_progress(len(self.request.prompt_ids))  # the whole prompt is in the cache
        if token in self.eos:
            return FinishReason.STOP
        k = self.request.logprobs
        piece = self.detok.add(token)
        text, stopped = self.stops.feed(piece)
        if k is None:
            self.job.deliver(TokenEvent(token=token, text=text))
        else:
            logprob, top = describe_logprobs(logprobs, token, k, self.detok)
            self.job.deliver(TokenEvent(token=token, text=text, logprob=logprob, top_logprobs=top, piece=piece))
        if stopped:
            return FinishReason.STOP
        if self.job.cancelled.is_set():
            return FinishReason.CANCELLED
        if self.job.deadline is not None and time.monotonic() > self.job.deadline:
            return self.past_deadline()
        return None

    def past_deadline(self) -> FinishReason:
        """The row ran past its deadline: a shutdown's ends it with that error; the request
        timeout ends it like a full window, with ``length`` and what it generated so far."""
        if self.job.deadline_error is not None:
            self.error = self.job.deadline_error
            return FinishReason.CANCELLED
        if not self.timed_out:
            self.timed_out = True
            log.info("request %s ran into the request timeout of %g s after %d tokens: it ends with length",
                     self.request.request_id, self.timeout or 0.0, self.produced)
        return FinishReason.LENGTH

    def finish(self, reason: FinishReason) -> None:
        """Emit the held-back text and the finish event (or the timeout error)."""
        if self.error is not None:
            self.job.deliver(self.error)
            return
        tail = ""
        if reason is not FinishReason.CANCELLED and not self.stops.stopped:
            tail, _ = self.stops.feed(self.detok.flush())
            tail += self.stops.flush()
        first = self.first_token_at
        self.job.deliver(FinishEvent(
            finish_reason=reason,
            prompt_tokens=len(self.request.prompt_ids),
            completion_tokens=self.produced,
            cached_tokens=self.reused,
            text=tail,
            stop_sequence=self.stops.stopped,
            prompt_seconds=first - self.started if first is not None else 0.0,
            decode_seconds=time.monotonic() - first if first is not None else 0.0,
            timed_out=self.timed_out,
        ))


#: Called when a row ends: (row, reason, per-layer cache or None, token ids the cache holds).
Done = Callable[[Row, FinishReason, "list[Any] | None", "Sequence[int]"], None]


def batchable(model: Any) -> bool:
    """Whether every cache layer of ``model`` can join a batch (mlx-lm's ``merge``)."""
    from mlx_lm.models.cache import make_prompt_cache

    try:
        return all(hasattr(layer, "merge") for layer in make_prompt_cache(model))
    except Exception:  # a model without mlx-lm's cache protocol runs serially
        return False


def isolate(row: Row) -> None:
    """Make a failure of the row's sampler or logits processors fail that row only.

    In a batch every row's callables run inside one decode step, so one raising (a plugin
    bug, a size MLX cannot slice with) would end the step for every row. Wrapped, the failure
    is kept as the row's own error (its text reaches only its own client), the step goes on
    with the row's logits untouched and a greedy pick, and the lane ends the row on its next
    token. mlx-lm's shared greedy sampler is left as it is: it keeps the batch's one batched
    sampling call, and cannot fail on its own."""
    from mlx_lm.sample_utils import greedy_sampler

    from mlxrt.engine.sampling import LogitBias

    def failed(what: str, exc: Exception) -> None:
        log.warning("the %s of request %s failed; ending that request only", what, row.request.request_id,
                    exc_info=True)
        row.error = EngineError(f"{what} failed: {type(exc).__name__}: {exc}")

    def guard_processor(processor: Any) -> Any:
        def run(tokens: Any, logits: Any) -> Any:
            if row.error is not None:
                return logits
            try:
                return processor(tokens, logits)
            except Exception as exc:
                failed("logits processor", exc)
                return logits

        return run

    sampler = row.sampler
    if sampler is not None and sampler is not greedy_sampler:
        def sample(logprobs: Any) -> Any:
            if row.error is None:
                try:
                    return sampler(logprobs)
                except Exception as exc:
                    failed("sampler", exc)
            return greedy_sampler(logprobs)

        row.sampler = sample
    # a logit bias cannot fail (its tokens were checked at planning): kept as it is, the batch
    # adds every row's in one scatter (mlxrt.engine.sampling.add_biases)
    row.processors = [p if isinstance(p, LogitBias) else guard_processor(p) for p in row.processors]


def generation_error(exc: Exception) -> MlxrtError:
    """What a request whose generation raised ``exc`` ends with, in either lane: an
    :class:`MlxrtError` as it is (its own status), anything else a 500 naming the exception."""
    if isinstance(exc, MlxrtError):
        return exc
    return EngineError(f"generation failed: {type(exc).__name__}: {exc}")


def _with_prefix(processors: list[Any], prefix: Sequence[int]) -> list[Any]:
    """Processors that see the whole history although ``token_steps`` was given only the
    uncached rest of the prompt (penalties count the cached prefix too)."""
    if not processors or not prefix:
        return processors
    import mlx.core as mx

    head = mx.array(list(prefix))

    def wrap(processor: Any) -> Any:
        return lambda tokens, logits: processor(mx.concatenate([head, tokens]), logits)

    return [wrap(p) for p in processors]


def snapshot_points(row: Row) -> list[int]:
    """Prompt lengths to snapshot the row's cache at, ascending: the turn boundary and the
    prompt but its last token, past what the row reused. None unless the engine wants them
    (``Job.snapshot_tokens``: the model's cache cannot be rewound) and the prompt is text."""
    if row.job.snapshot_tokens <= 0 or row.request.vision is not None:
        return []
    last = len(row.request.prompt_ids) - 1
    turn = row.request.turn_start
    return sorted({p for p in (turn, last) if p is not None and row.reused < p <= last})


def _cache_tokens(cache: list[Any], tokens: list[int]) -> list[int]:
    """The ids ``cache`` holds, out of ``tokens`` (everything that may have been fed)."""
    for layer in cache:
        offset = getattr(layer, "offset", None)
        if isinstance(offset, int):
            return tokens[:offset]
    return tokens


class SerialLane:
    """One request at a time, through :func:`mlxrt.engine.steps.token_steps`."""

    name = "serial"
    #: ``token_steps``' ``first_at_once``: the first token handed out before the next step is queued.
    first_at_once = True

    def __init__(self, model: Any, *, stream: Any, prefill_step_size: int, done: Done,
                 tick: Callable[[int], None], speculator: Any = None) -> None:
        self.model = model
        self.stream = stream
        self.prefill_step_size = prefill_step_size
        self.done = done
        self.tick = tick
        self.served = 0
        #: A :class:`mlxrt.engine.speculative.Speculator` (``--draft-model``): caches are combined.
        self.speculator = speculator

    def run(self, row: Row, handoff: Callable[[], bool] | None = None) -> bool:
        """Generate ``row`` to its end, or, when ``handoff()`` turns true between two tokens
        (another request arrived), stop early and return True with ``row.cache`` holding the
        prompt and every generated token but the last: :meth:`BatchLane.resume` goes on from
        there. ``--batch N`` runs a lone stream this way, at the serial lane's speed."""
        import mlx.core as mx
        from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

        from mlxrt.engine.steps import token_steps

        prompt = list(row.request.prompt_ids)
        spec = self.speculator
        if row.cache is not None:
            cache = row.cache
        else:
            cache = spec.make_cache(self.model) if spec is not None else make_prompt_cache(self.model)
        row.cache = None
        reason = FinishReason.LENGTH
        points = snapshot_points(row) if spec is None and row.request.max_tokens > 0 else []
        start = row.reused
        row.report_progress(start)
        if points and points[0] < len(prompt) - 1:  # the turn boundary: prefill up to it first
            self._prefill(prompt[start:points[0]], cache, lambda done, at=start: row.report_progress(at + done))
            start = points[0]
            row.snapshots.append((prompt[:start], copy.deepcopy(cache)))
        handed = False
        if handoff is not None and (spec is not None or not can_trim_prompt_cache(cache)):
            handoff = None
        vision = row.request.vision  # an image prompt: prefilled from its embeddings, never cached
        fed = list(vision.feed_ids or vision.ids) if vision is not None else prompt[start:]
        step_size = self.prefill_step_size
        scope = contextlib.nullcontext()
        if vision is not None and vision.prefill is not None:  # one prefill pass, the family's masks
            step_size, scope = max(len(fed), 1), vision.prefill()
        if row.request.max_tokens > 0:
            # a draft model proposes only for text prompts (its cache never saw the image)
            drafts = (spec.drafts_for(row.request, row.processors, row.sampler)
                      if spec is not None and vision is None else 0)
            with scope:
                if drafts > 0:
                    steps = spec.steps(self.model, prompt[row.reused:], cache, drafts=drafts,
                                       max_tokens=row.request.max_tokens, sampler=row.sampler,
                                       stream=self.stream, prefill_step_size=self.prefill_step_size)
                else:
                    if spec is not None:
                        spec.requests_plain += 1
                    snapshotting = bool(points) and points[-1] == len(prompt) - 1 > start

                    def progress(done: int, total: int, held: list[Any] = cache, at: int = start) -> None:
                        row.report_progress(at + done)
                        if snapshotting and done == total - 1:  # the cache holds the prompt but its last token
                            row.snapshots.append((prompt[:-1], copy.deepcopy(held)))
                    steps = token_steps(
                        mx.array(fed), self.model,
                        max_tokens=row.request.max_tokens, sampler=row.sampler,
                        processors=_with_prefix(row.processors, prompt[:start]) or None,
                        cache=cache if spec is None else cache[:spec.main_layers],
                        prefill_step_size=step_size, stream=self.stream,
                        embeddings=vision.embeddings if vision is not None else None,
                        progress=progress, first_at_once=self.first_at_once,
                    )
                for token, logprobs in steps:
                    stop = self.agree(row.on_token(int(token), logprobs))
                    self.tick(1)
                    if stop is not None:
                        reason = stop
                        break
                    if handoff is not None and len(row.generated) < row.request.max_tokens and handoff():
                        handed = True
                        break
                steps.close()  # the speculative loop rewinds rejected drafts when it closes
        if handed:
            # token_steps already fed the last token and sampled the next (its step is queued):
            # drop that token from the cache and that draw from a seeded sampler, so that the batch
            # feeds the token again and draws the same next one.
            trim_prompt_cache(cache, 1)
            getattr(row.sampler, "rewind", lambda n: None)(1)
            row.cache = cache
            return True
        self.served += 1
        if spec is not None and vision is None:
            cache, held = spec.align(cache, prompt + row.generated)
        else:
            held = _cache_tokens(cache, prompt + row.generated)
        self.done(row, reason, cache, held)
        return False

    def _prefill(self, tokens: list[int], cache: list[Any], report: Callable[[int], None]) -> None:
        """Run ``tokens`` into ``cache`` in chunks, as ``token_steps`` prefills; ``report`` is
        told the tokens run after each chunk."""
        import mlx.core as mx

        with mx.stream(self.stream):
            for at in range(0, len(tokens), self.prefill_step_size):
                self.model(mx.array(tokens[at:at + self.prefill_step_size])[None], cache=cache)
                mx.eval([layer.state for layer in cache])
                report(min(at + self.prefill_step_size, len(tokens)))

    def agree(self, stop: FinishReason | None) -> FinishReason | None:
        """The decision after each token (the distributed lane shares it with the other ranks)."""
        return stop


class BatchLane:
    """Up to ``size`` requests decoding together, through :class:`mlxrt.engine.batch_steps.BatchSteps`."""

    name = "batch"

    def __init__(self, model: Any, *, stream: Any, size: int, prefill_batch_size: int, prefill_step_size: int,
                 eos: Sequence[int], done: Done, tick: Callable[[int], None], adapters: Any = None) -> None:
        self.size = size
        self.done = done
        self.tick = tick
        self.rows: dict[int, Row] = {}
        self.served = 0
        self._model = model
        #: With adapters, every row's cache list ends in a RowTag (see RowAdapterModel).
        self._tagged = adapters is not None
        if adapters is not None:
            model = RowAdapterModel(model, adapters)
        self._snapshots: dict[int, set[int]] = {}  # uid -> prompt lengths still to snapshot at
        from mlxrt.engine.batch_steps import BatchSteps

        self._gen = BatchSteps(
            model, completion_batch_size=size, prefill_batch_size=min(prefill_batch_size, size),
            prefill_step_size=prefill_step_size, stop_tokens=eos, stream=stream,
        )

    def __len__(self) -> int:
        return len(self.rows)

    def has_room(self) -> bool:
        return len(self.rows) < self.size

    def add(self, row: Row) -> None:
        if row.request.max_tokens <= 0:
            self.served += 1
            self.done(row, FinishReason.LENGTH, row.cache, list(row.request.prompt_ids[:row.reused]))
            return
        prompt = list(row.request.prompt_ids)
        isolate(row)
        row.report_progress(row.reused)
        # Segments end where snapshots are taken (the generator always ends one before the
        # last token): it reports each end, and step() copies the row's cache there.
        points = snapshot_points(row)
        bounds = [row.reused] + [p for p in points if p < len(prompt) - 1] + [len(prompt)]
        (uid,) = self._gen.insert_segments(
            segments=[[prompt[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]],
            max_tokens=[row.request.max_tokens],
            caches=[self._tag(row, row.cache)] if row.cache is not None or self._tagged else None,
            all_tokens=[prompt[:row.reused]],
            samplers=[row.sampler],
            logits_processors=[row.processors],
        )
        if points:
            self._snapshots[uid] = set(points)
        row.cache = None  # the generator owns it now
        row.uid = uid
        self.rows[uid] = row

    def resume(self, row: Row) -> None:
        """Take over a row the serial lane started (see :meth:`SerialLane.run`'s ``handoff``):
        its cache holds the prompt and all generated tokens but the last, which is fed next."""
        isolate(row)  # from here a failing sampler must end this row only, as for add()
        prompt = list(row.request.prompt_ids)
        (uid,) = self._gen.insert(
            prompts=[row.generated[-1:]],
            max_tokens=[row.request.max_tokens - len(row.generated)],
            caches=[self._tag(row, row.cache)],
            all_tokens=[prompt + row.generated[:-1]],
            samplers=[row.sampler],
            logits_processors=[row.processors],
        )
        row.cache = None
        row.uid = uid
        self.rows[uid] = row

    def step(self) -> None:
        """One decode step for the running rows (and one prefill chunk for newcomers).

        A row whose prefill failed, or that was in a decode step that failed, has already left
        the generator (see :mod:`mlxrt.engine.batch_steps`): it ends here with the error the
        serial lane gives a request whose generation raises (:func:`generation_error`), and the
        lane goes on with the other rows."""
        prompts, responses = self._gen.next()
        for progress in prompts:
            if progress.error is not None:
                self._fail(progress.uid, progress.error, "prefill")
                continue
            row, wanted = self.rows.get(progress.uid), self._snapshots.get(progress.uid)
            if row is not None:
                row.report_progress(row.reused + progress.progress[0])
            # a segment ended: the row's cache holds a snapshot point
            if row is None or not wanted or not progress.end_of_segment:
                continue
            for cache, tokens in self._gen.extract_cache([progress.uid]).values():
                cache = _untag(cache)
                if len(tokens) in wanted:
                    wanted.discard(len(tokens))
                    row.snapshots.append((list(tokens), cache))
        made = sum(resp.error is None for resp in responses)
        if made:
            self.tick(made)
        ended: list[int] = []
        for resp in responses:
            if resp.error is not None:
                self._fail(resp.uid, resp.error, "decode step")
                continue
            row = self.rows.get(resp.uid)
            if row is None:
                continue
            stop = row.on_token(int(resp.token), resp.logprobs)
            if resp.finish_reason is not None:
                reason = stop or (FinishReason.LENGTH if resp.finish_reason == "length" else FinishReason.STOP)
                self._end(row, reason, resp.prompt_cache, resp.all_tokens)
            elif stop is not None:
                row.ending = stop
                ended.append(resp.uid)
        if ended:
            self._remove(ended)

    def reap(self) -> None:
        """Remove rows whose client left (or that timed out) before their next step."""
        now = time.monotonic()
        gone = [uid for uid, row in self.rows.items()
                if row.job.cancelled.is_set() or (row.job.deadline is not None and now > row.job.deadline)]
        for uid in gone:
            row = self.rows[uid]
            row.ending = FinishReason.CANCELLED if row.job.cancelled.is_set() else row.past_deadline()
        if gone:
            self._remove(gone)

    def _fail(self, uid: int, exc: Exception, where: str) -> None:
        """End row ``uid`` (already out of the generator, its cache dropped) with ``exc``: that
        request alone gets the error, nothing of it goes to the prompt cache."""
        row = self.rows.get(uid)
        if row is None:
            return
        log.error("the batch lane's %s failed for request %s; ending it", where, row.request.request_id,
                  exc_info=exc)
        row.error = row.error or generation_error(exc)  # its own sampler chain's error, if that came first
        row.snapshots = []
        self._end(row, FinishReason.CANCELLED, None, ())

    def _remove(self, uids: list[int]) -> None:
        caches = self._gen.remove(uids, return_prompt_caches=True)
        for uid in uids:
            row = self.rows[uid]
            cache, tokens = caches.get(uid, (None, []))
            self._end(row, row.ending or FinishReason.CANCELLED, cache, tokens)

    def _tag(self, row: Row, cache: list[Any] | None) -> list[Any] | None:
        """The row's cache list as the generator gets it: with adapters, a fresh cache when the
        row brings none, and a :class:`RowTag` of the row as its last entry."""
        if not self._tagged:
            return cache
        if cache is None:
            from mlx_lm.models.cache import make_prompt_cache

            cache = make_prompt_cache(self._model)
        return [*cache, RowTag([row])]

    def _end(self, row: Row, reason: FinishReason, cache: Any, tokens: Sequence[int] | None) -> None:
        cache = _untag(cache)
        self.rows.pop(row.uid, None)
        self._snapshots.pop(row.uid, None)
        self.served += 1
        self.done(row, reason, cache, list(tokens or ()))

    def close(self) -> None:
        self._gen.close()


class RowTag:
    """The last entry of a batch lane row's cache list when adapters are served: the rows of
    the batch, in row order, kept in step by the batch loop itself
    (:class:`mlxrt.engine.batch_steps.BatchSteps`).

    The loop merges, filters, extends, extracts and copies a batch's cache list entry by entry
    through mlx-lm's cache protocol (``merge``, ``filter``, ``extend``, ``extract``, ``state``;
    ``prepare``, ``finalize`` and ``nbytes`` as mlx-lm's own generator also reads them), so this entry always lists the rows of
    the batch it rides with, in the order of the model call's inputs. No model layer reads it:
    :class:`RowAdapterModel` takes it off before the model sees the list, and the lane takes it
    off every cache the generator hands back.
    """

    nbytes = 0

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows

    @property
    def state(self) -> list[Any]:
        return []

    def merge(self, tags: Sequence[RowTag]) -> RowTag:
        return RowTag([row for tag in tags for row in tag.rows])

    def extend(self, other: RowTag) -> None:
        self.rows.extend(other.rows)

    def filter(self, keep: Sequence[int]) -> None:
        self.rows = [self.rows[i] for i in keep]

    def extract(self, idx: int) -> RowTag:
        return RowTag([self.rows[idx]])

    def prepare(self, **_: Any) -> None:
        return None

    def finalize(self) -> None:
        return None

    def __deepcopy__(self, memo: dict[int, Any]) -> RowTag:
        return RowTag(list(self.rows))  # a copied cache (a snapshot) names the same rows: not copies of them


def _untag(cache: Any) -> Any:
    """``cache`` without its :class:`RowTag` (a cache list the generator handed back)."""
    if cache and isinstance(cache[-1], RowTag):
        return cache[:-1]
    return cache


class RowAdapterModel:
    """The model as the batch lane's generator sees it: before each call it selects, per
    row, the adapters that row's request chose (per-row LoRA, see :mod:`mlxrt.engine.adapters`).

    The batch loop calls the model for a newcomer's prefill chunks (its own cache list) and for
    each decode step (the batch's), each cache list ending in the :class:`RowTag` naming its rows.
    """

    def __init__(self, model: Any, adapters: Any) -> None:
        self._model = model
        self._adapters = adapters

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    @property
    def wrapped(self) -> Any:
        """The model it calls."""
        return self._model

    def plain(self) -> bool:
        """Whether its next call runs the model as it is (no adapter mounted), so that newcomers
        may be prefilled together (:meth:`mlxrt.engine.batch_steps.BatchSteps._prefill_all`)."""
        return not self._adapters.selection_needed()

    def __call__(self, inputs: Any, *args: Any, cache: Any = None, **kwargs: Any) -> Any:
        tag = cache[-1] if cache and isinstance(cache[-1], RowTag) else None
        layers = cache[:-1] if tag is not None else cache
        registry = self._adapters
        if not registry.selection_needed():
            return self._model(inputs, *args, cache=layers, **kwargs)
        if tag is None or len(tag.rows) != inputs.shape[0]:
            raise RuntimeError("batch lane: cannot tell which requests the model call's rows belong to, so "
                               "their adapters cannot be applied")
        registry.select_rows([row.adapters for row in tag.rows])
        try:
            return self._model(inputs, *args, cache=layers, **kwargs)
        finally:
            registry.selection.active = ()


def describe_logprobs(logprobs: Any, token: int, k: int, detok: Detokenizer) -> tuple[float, tuple[TokenLogprob, ...]]:
    """The emitted token's log-probability and the ``k`` best alternatives, best first.

    ``logprobs`` is the log-softmax after logits processors, before temperature and filters
    (what mlx-lm's generators yield with each token). Top-k uses argpartition (no full sort
    of the vocabulary); only the ``k`` winners are sorted. Called only when asked for.
    """
    import mlx.core as mx

    chosen = float(logprobs[token].item())
    if k <= 0:
        return chosen, ()
    ids = mx.argpartition(-logprobs, kth=k - 1)[:k]
    values = logprobs[ids].tolist()
    ranked = sorted(zip(ids.tolist(), values, strict=True), key=lambda pair: -pair[1])
    texts = detok.preview([i for i, _ in ranked])
    return chosen, tuple(TokenLogprob(id=i, logprob=float(v), text=t) for (i, v), t in zip(ranked, texts, strict=True))
