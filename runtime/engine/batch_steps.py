"""The batch lane's token loop: requests decode together, one batched model call per step, and
newcomers are prefilled between steps and merged into the running batch (continuous batching).

mlx-lm's ``BatchGenerator`` does the same, and :class:`BatchSteps` keeps its interface where the
lane reads it (``insert_segments``, ``insert``, ``next``, ``extract_cache``, ``remove``), but
its module, ``mlx_lm.generate``, imports transformers (~1.2 s and ~40 MB of a server's start,
docs/performance.md). This loop is built on mlx-lm's model modules and cache classes alone
(``mlx_lm.models.cache``: each layer's ``merge`` into its batch class, ``extend``, ``filter``,
``extract``), so batching costs a server nothing at start:

* a newcomer's prompt is prefilled into a cache of its own, in chunks of ``prefill_step_size``:
  one chunk per :meth:`BatchSteps.next` for each of up to ``prefill_batch_size`` newcomers,
  between the running rows' decode steps. A chunk never crosses the end of a segment (the
  points the lane snapshots a cache at), and the prompt's last token is left for the batch.
  Where every row of the model's forward is its own arithmetic whatever rows run beside it
  (:func:`mlxrt.engine.qmv.rows_invariant`: a quantized model whose products are the mlxrt-qmv
  kernel's 8-bit ones), newcomers on plain KV caches (requests that come together, with or
  without a prompt-cache hit) run their chunks in one model call, their caches merged as the
  batch merges them and the chunks right-padded, and each keeps its own rows of the result,
  bit for bit what its own prefill gives (:meth:`BatchSteps._prefill_together`); the others,
  and every newcomer of any other model, one call each;
* a prefilled row then joins the batch (its cache merged in) and the batch's next step feeds
  its last prompt token beside the other rows' latest tokens;
* a decode step feeds every row's pending token in one model call, runs each row's logits
  processors on its own row (with its whole history), samples (one batched call when the rows
  share mlx-lm's greedy sampler, otherwise each row's own sampler on its row) and queues the
  next step before the tokens are handed out, as the serial loop does
  (:mod:`mlxrt.engine.steps`). A row's cache always holds every token handed out.

Faults end the rows they belong to, and the loop goes on (no exception leaves :meth:`BatchSteps.next`
for them):

* a newcomer's prefill chunk (or its merge into the batch) that raises is that row's own: the row
  is dropped with its cache and reported as a :class:`Progress` with ``error`` set; the other
  newcomers and the running rows go on untouched (their caches are their own or the batch's);
* a decode step that raises (the one model call over every row, or the evaluation of its queued
  draw) cannot be pinned on a row, and it may have left some layers of the batch's cache
  advanced and others not: every row of that step ends, each reported as a :class:`Response`
  with ``error`` set and no token, and the batch's cache is dropped. Rows still queued or
  prefilling hold caches of their own, untouched by the step: they go on and join a new batch.

A row's own logits processors and sampler run inside the step, so the batch lane wraps them
(:func:`mlxrt.engine.lanes.isolate`) to fail only their row.
"""

from __future__ import annotations

import collections
import copy
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

import mlxrt.engine.qmv as qmv
from mlxrt.engine.sampling import add_biases, bias_only
from mlxrt.engine.steps import CLEAR_EVERY

__all__ = ["BatchSteps", "Progress", "Response"]


@attrs.define(eq=False)
class Progress:
    """A prefill chunk ran for row ``uid``: ``progress`` is (prompt tokens fed, to feed in all);
    ``end_of_segment`` when the chunk ended one of the row's segments (its cache holds exactly
    the tokens up to that point until the next :meth:`BatchSteps.next`)."""

    uid: int
    progress: tuple[int, int]
    end_of_segment: bool
    #: The row's prefill raised: it was dropped with its cache and ends with this error.
    error: Exception | None = None


@attrs.define(eq=False)
class Response:
    """One generated token of row ``uid``, the log-probabilities it was drawn from, and, on the
    row's last token, why it ended (``"stop"``: a stop token; ``"length"``: its max_tokens),
    its cache and the token ids that cache holds. A row whose decode step raised ends with
    ``finish_reason`` ``"error"``, the exception as ``error``, and no token, log-probs or cache."""

    uid: int
    token: int | None
    logprobs: Any
    finish_reason: str | None = None
    prompt_cache: list[Any] | None = None
    all_tokens: list[int] | None = None
    error: Exception | None = None


@attrs.define(eq=False)
class _Seq:
    uid: int
    segments: list[list[int]]  # prompt tokens still to feed, by segment; the last is one token
    max_tokens: int
    cache: list[Any] | None  # its own while it waits or prefills; the batch holds it afterwards
    tokens: list[int]  # the ids its cache holds
    sampler: Callable[[Any], Any]
    processors: tuple[Callable[[Any, Any], Any], ...]
    total: int  # prompt tokens to feed in all
    fed: int = 0
    made: int = 0
    context: Any = None  # mlx-lm's TokenBuffer of its history, when it has logits processors

    @property
    def ready(self) -> bool:
        """Prefilled: only the prompt's last token is left, for the batch to feed."""
        return len(self.segments) == 1 and len(self.segments[0]) == 1


class BatchSteps:
    """Up to ``completion_batch_size`` sequences decoding together (see the module docstring).

    :param model: The model (any callable taking ``(inputs, cache=...)`` as mlx-lm's models do).
    :param completion_batch_size: Rows at most, prefilling and decoding together.
    :param prefill_batch_size: Newcomers prefilled at a time.
    :param prefill_step_size: Prompt tokens per prefill chunk.
    :param stop_tokens: Token ids that end a row (its end-of-sequence ids).
    :param stream: The MLX stream every step runs on.
    """

    def __init__(self, model: Any, *, completion_batch_size: int, prefill_batch_size: int,
                 prefill_step_size: int = 2048, stop_tokens: Iterable[int] = (), stream: Any = None) -> None:
        self.model = model
        self.size = max(completion_batch_size, 1)
        self.prefill_batch_size = max(min(prefill_batch_size, self.size), 1)
        self.prefill_step_size = max(prefill_step_size, 1)
        self.stop = frozenset(stop_tokens)
        self._stream = stream
        self._uids = itertools.count()
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._prefilling: list[_Seq] = []
        self._rows: list[_Seq] = []  # decoding, in the batch's row order
        self._cache: list[Any] = []  # the batch's caches, one merged entry per layer
        self._inputs: Any = None  # the token each row feeds next, shape (rows,)
        self._drawn_from: list[Any] = []  # per row: the log-probs its next token came from (None: a prompt token)
        self._steps = 0
        # Newcomers prefilled in one model call: only where that gives each row its own bits
        import mlxrt.engine.qmv as qmv

        self._together = qmv.rows_invariant(getattr(model, "wrapped", model))

    def __len__(self) -> int:
        return len(self._waiting) + len(self._prefilling) + len(self._rows)

    def insert(self, prompts: Sequence[Sequence[int]], **options: Any) -> list[int]:
        """:meth:`insert_segments` with one segment per prompt."""
        return self.insert_segments([[p] for p in prompts], **options)

    def insert_segments(self, segments: Sequence[Sequence[Sequence[int]]], max_tokens: Sequence[int],
                        caches: Sequence[list[Any] | None] | None = None,
                        all_tokens: Sequence[Sequence[int]] | None = None,
                        samplers: Sequence[Callable[[Any], Any] | None] | None = None,
                        logits_processors: Sequence[Sequence[Callable[[Any, Any], Any]]] | None = None) -> list[int]:
        """Queue sequences; their uids, in order.

        :param segments: Per sequence, its prompt (after what its cache holds) cut into pieces;
            prefill chunks stop at each piece's end (:class:`Progress` ``end_of_segment``).
        :param max_tokens: Per sequence, tokens to generate at most (> 0).
        :param caches: Per sequence, the cache to continue (``None``: a fresh one).
        :param all_tokens: Per sequence, the ids that cache already holds.
        :param samplers: Per sequence, log-probs → token (``None``: greedy).
        :param logits_processors: Per sequence, ``(history, logits) -> logits`` callables.
        """
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.sample_utils import greedy_sampler

        n = len(segments)
        caches = caches if caches is not None else [None] * n
        all_tokens = all_tokens if all_tokens is not None else [[] for _ in range(n)]
        samplers = samplers if samplers is not None else [None] * n
        logits_processors = logits_processors if logits_processors is not None else [()] * n
        for name, values in (("max_tokens", max_tokens), ("caches", caches), ("all_tokens", all_tokens),
                             ("samplers", samplers), ("logits_processors", logits_processors)):
            if len(values) != n:
                raise ValueError(f"{name} must have one entry per sequence: expected {n}, got {len(values)}")
        made: list[_Seq] = []
        for pieces, most, cache, held, sampler, processors in zip(
                segments, max_tokens, caches, all_tokens, samplers, logits_processors, strict=True):
            pieces = [list(piece) for piece in pieces if len(piece)]
            if not pieces:
                raise ValueError("a sequence needs at least one prompt token")
            if most <= 0:
                raise ValueError("max_tokens must be > 0")
            if len(pieces[-1]) > 1:  # the last token is fed by the batch: a segment of its own
                pieces.append([pieces[-1].pop()])
            made.append(_Seq(
                uid=next(self._uids), segments=pieces, max_tokens=most,
                cache=cache if cache is not None else make_prompt_cache(self.model), tokens=list(held),
                sampler=sampler or greedy_sampler, processors=tuple(processors or ()),
                total=sum(len(piece) for piece in pieces)))
        self._waiting.extend(made)
        return [seq.uid for seq in made]

    def next(self) -> tuple[list[Progress], list[Response]]:
        """One round: newcomers are admitted, prefilled rows join the batch, one decode step for
        the batch, then one prefill chunk for each newcomer. The chunks' progress and the step's
        tokens."""
        import mlx.core as mx

        with mx.stream(self._stream):
            room = min(self.prefill_batch_size - len(self._prefilling),
                       self.size - len(self._rows) - len(self._prefilling))
            while room > 0 and self._waiting:
                self._prefilling.append(self._waiting.popleft())
                room -= 1
            # rows with only their last prompt token left (a row handed over by the serial lane is
            # one from the start) join before this round's step, which feeds that token
            ready = [seq for seq in self._prefilling if seq.ready]
            failed = self._join(ready) if ready else []
            responses = self._step() if self._rows else []
            progress = failed + self._prefill_all(list(self._prefilling))
            return progress, responses

    def extract_cache(self, uids: Iterable[int]) -> dict[int, tuple[list[Any], list[int]]]:
        """Copies of the caches of ``uids`` and the token ids each holds (rows still queued or
        prefilling included); the rows go on."""
        wanted = set(uids)
        found = {}
        for at, seq in enumerate(self._rows):
            if seq.uid in wanted:
                found[seq.uid] = ([layer.extract(at) for layer in self._cache], list(seq.tokens))
        for seq in itertools.chain(self._prefilling, self._waiting):
            if seq.uid in wanted:
                found[seq.uid] = (copy.deepcopy(seq.cache), list(seq.tokens))
        return found

    def remove(self, uids: Iterable[int], return_prompt_caches: bool = False) -> dict[int, tuple[list[Any], list[int]]]:
        """Drop ``uids`` wherever they are; with ``return_prompt_caches`` their caches and the
        token ids each holds."""
        wanted = set(uids)
        caches: dict[int, tuple[list[Any], list[int]]] = {}
        for seq in itertools.chain(self._prefilling, self._waiting):
            if seq.uid in wanted:
                caches[seq.uid] = (seq.cache, seq.tokens)
        self._prefilling = [seq for seq in self._prefilling if seq.uid not in wanted]
        self._waiting = collections.deque(seq for seq in self._waiting if seq.uid not in wanted)
        gone = [at for at, seq in enumerate(self._rows) if seq.uid in wanted]
        if gone:
            if return_prompt_caches:
                for at in gone:
                    caches[self._rows[at].uid] = ([layer.extract(at) for layer in self._cache],
                                                  self._rows[at].tokens)
            self._keep([at for at in range(len(self._rows)) if at not in set(gone)])
        return caches if return_prompt_caches else {}

    def close(self) -> None:
        """Let the queued step finish (nothing else is held)."""
        import mlx.core as mx

        if self._stream is not None:
            mx.synchronize(self._stream)

    # -- the loop's parts ------------------------------------------------------------------------

    def _prefill_all(self, seqs: list[_Seq]) -> list[Progress]:
        """One chunk for each of ``seqs``: where the model's every row is its own arithmetic
        whatever rows run beside it (:func:`mlxrt.engine.qmv.rows_invariant`: its products the
        mlxrt-qmv kernel's 8-bit ones, its attention the kernel's, taken row by row here), those
        on plain KV caches together (:meth:`_prefill_together`); the rest, and every newcomer of
        any other model (a float model's products go through the BLAS, whose rounding depends on
        the row count), one call each.

        A group holds chunks at least half as long as its longest, at most ``prefill_step_size``
        tokens in all once padded to it, and at most twice the keys and values its rows hold
        (cached and new) once padded to its longest cache and chunk: padding never outweighs
        what it batches, and a call's memory stays what one chunk's was."""
        plain = getattr(self.model, "plain", None)  # the lane's adapter model: none mounted
        if not self._together or (plain is not None and not plain()):
            return [self._prefill(seq) for seq in seqs]
        step = self.prefill_step_size
        # (chunk length, tokens cached, seq), longest chunk first
        ready = sorted(((min(len(seq.segments[0]), step), _cached(seq), seq) for seq in seqs if _groupable(seq)),
                       key=lambda row: (-row[0], -row[1]))
        groups: list[list[tuple[int, int, _Seq]]] = []
        for row in ready:
            rows = [*groups[-1], row] if groups else []
            width = rows[0][0] if rows else 0
            if (rows and 2 * row[0] >= width and width * len(rows) <= step
                    and len(rows) * (max(cached for _, cached, _ in rows) + width)
                    <= 2 * sum(length + cached for length, cached, _ in rows)):
                groups[-1].append(row)
            else:
                groups.append([row])
        together = [[seq for _, _, seq in group] for group in groups if len(group) > 1]
        grouped = {seq.uid for group in together for seq in group}
        progress = [p for group in together for p in self._prefill_together(group)]
        return progress + [self._prefill(seq) for seq in seqs if seq.uid not in grouped]

    def _prefill_together(self, seqs: list[_Seq]) -> list[Progress]:
        """The next chunk of each of ``seqs`` (caches as :func:`_groupable` says) in one model
        call, then each row's keys and values copied back into a cache of its own.

        The rows' caches are merged as the batch merges them (mlx-lm's ``BatchKVCache.merge``:
        left-padded so that every row's cached tokens end at the same column, each row's
        positions its own) and the chunks right-padded to the longest: a row's new tokens attend
        to its own cached tokens and to each other, never to the left padding (masked) or to the
        padding after them. Each merged KV layer carries the rows' spans (``mlxrt_rows``: the
        columns of a row's cached and new keys, its new tokens and the mask its own cache would
        give), and the kernel's attention route computes each row alone on them, as its own
        prefill would; the products are the kernel's, each row's bits its own. So each row's
        cache holds, bit for bit, what its own prefill would (tests/test_batch_steps.py). A
        failure runs each on its own (:meth:`_prefill`), so that it fails only the row it
        belongs to."""
        import mlx.core as mx
        from mlx_lm.models.cache import KVCache

        chunks = [seq.segments[0][:self.prefill_step_size] for seq in seqs]
        width = max(len(chunk) for chunk in chunks)
        kv = [type(entry) is KVCache for entry in seqs[0].cache]
        # KV layers merge into mlx-lm's BatchKVCache; a rider (the lane's RowTag) merges as the
        # batch's own entry does, naming the rows in order
        cache = [entry.merge([seq.cache[i] for seq in seqs]) for i, entry in enumerate(seqs[0].cache)]
        cached = [_cached(seq) for seq in seqs]
        base = max(cached)
        first_kv = kv.index(True)
        rows = tuple((base - held, base + len(chunk), len(chunk), seq.cache[first_kv].make_mask(len(chunk), return_array=False, window_size=None))
                     for seq, chunk, held in zip(seqs, chunks, cached, strict=True))
        for layer, is_kv in zip(cache, kv, strict=True):
            if is_kv:
                layer.mlxrt_rows = rows
        try:
            self.model(mx.array([chunk + [0] * (width - len(chunk)) for chunk in chunks]), cache=cache)
            own, copies = [], []
            for at, (seq, chunk, held) in enumerate(zip(seqs, chunks, cached, strict=True)):
                entries = []
                for layer, mine, is_kv in zip(cache, seq.cache, kv, strict=True):
                    if is_kv:  # its own columns: after its left padding, up to its last new token
                        mine = KVCache()
                        mine.keys = mx.contiguous(layer.keys[at:at + 1, :, base - held:base + len(chunk)])
                        mine.values = mx.contiguous(layer.values[at:at + 1, :, base - held:base + len(chunk)])
                        mine.offset = held + len(chunk)
                        copies += [mine.keys, mine.values]
                    entries.append(mine)
                own.append(entries)
            mx.eval(copies)
        except Exception:
            del cache  # the merged cache goes before each row runs again on its own
            return [self._prefill(seq) for seq in seqs]
        progress = []
        for seq, chunk, layers in zip(seqs, chunks, own, strict=True):
            seq.cache = layers
            progress.append(self._fed(seq, chunk))
        return progress

    def _prefill(self, seq: _Seq) -> Progress:
        """Run the next chunk of ``seq``'s current segment into its own cache (a failure drops
        ``seq``: see :meth:`_drop_newcomers`)."""
        import mlx.core as mx

        chunk = seq.segments[0][:self.prefill_step_size]
        try:
            self.model(mx.array(chunk)[None], cache=seq.cache)
            mx.eval([layer.state for layer in seq.cache])
        except Exception as exc:
            return self._drop_newcomers([seq], exc)[0]
        if seq.total > self.prefill_step_size:  # a long prompt: bound its memory, as the serial loop does
            mx.clear_cache()
        return self._fed(seq, chunk)

    @staticmethod
    def _fed(seq: _Seq, chunk: list[int]) -> Progress:
        """``chunk`` (the head of ``seq``'s current segment) is in its cache now."""
        seq.tokens.extend(chunk)
        seq.fed += len(chunk)
        rest = seq.segments[0][len(chunk):]
        if rest:
            seq.segments[0] = rest
        else:
            seq.segments.pop(0)
        return Progress(seq.uid, (seq.fed, seq.total), end_of_segment=not rest)

    def _drop_newcomers(self, seqs: list[_Seq], exc: Exception) -> list[Progress]:
        """``seqs`` (prefilling) failed: drop them and their caches, and report each with ``exc``."""
        import mlx.core as mx

        dropped = []
        for seq in seqs:
            self._prefilling.remove(seq)
            seq.cache, seq.context = None, None
            dropped.append(Progress(seq.uid, (seq.fed, seq.total), end_of_segment=False, error=exc))
        mx.clear_cache()  # what their caches held goes back now, not at the next step
        return dropped

    def _drop_rows(self, exc: Exception) -> list[Response]:
        """The decode step failed: every row of the batch ends with ``exc``; its cache is dropped."""
        import mlx.core as mx

        ended = [Response(seq.uid, None, None, "error", error=exc) for seq in self._rows]
        for seq in self._rows:
            seq.context = None
        self._rows, self._cache, self._inputs, self._drawn_from = [], [], None, []
        mx.clear_cache()
        return ended

    def _join(self, seqs: list[_Seq]) -> list[Progress]:
        """Merge prefilled rows into the batch; its next step feeds their last prompt tokens.
        Their caches failing to merge fails them only (reported as :meth:`_prefill` does)."""
        import mlx.core as mx
        from mlx_lm.models.cache import TokenBuffer

        try:
            merged = [layer.merge([seq.cache[i] for seq in seqs]) for i, layer in enumerate(seqs[0].cache)]
            last = mx.array([seq.segments[0][0] for seq in seqs])
        except Exception as exc:
            if len(seqs) == 1:
                return self._drop_newcomers(seqs, exc)
            # which one's cache would not merge? each joins on its own (or fails on its own)
            return [failure for seq in seqs for failure in self._join([seq])]
        for seq in seqs:
            self._prefilling.remove(seq)
            seq.segments, seq.cache = [], None
            seq.fed = seq.total
            if not bias_only(seq.processors):  # a logit bias never reads the history
                seq.context = TokenBuffer(seq.tokens)
        if self._rows:
            for layer, other in zip(self._cache, merged, strict=True):
                layer.extend(other)
            self._inputs = mx.concatenate([self._inputs, last.astype(self._inputs.dtype)])
        else:
            self._cache, self._inputs = merged, last
        self._drawn_from += [None] * len(seqs)
        self._rows += seqs
        return []

    def _step(self) -> list[Response]:
        """Feed every row's pending token, queue the next draw, hand out the fed tokens (a
        failure ends every row: see :meth:`_drop_rows`)."""
        import mlx.core as mx

        inputs, drawn_from = self._inputs, self._drawn_from
        try:
            contexts = self._draw(inputs)
            mx.async_eval(self._inputs, self._drawn_from, contexts)
            # the tokens just fed were drawn by the previous step (or are prompt tokens): hand them out
            mx.eval(inputs, [lp for lp in drawn_from if lp is not None])
        except Exception as exc:
            return self._drop_rows(exc)
        return self._hand_out(inputs, drawn_from)

    def _draw(self, inputs: Any) -> list[Any]:
        """Feed ``inputs`` (every row's pending token) and set up the next draw: its tokens and
        the log-probs each row's comes from. The history buffers the rows' processors updated."""
        import mlx.core as mx

        logits = self.model(inputs[:, None], cache=self._cache)[:, -1, :]
        contexts = []
        if all(bias_only(seq.processors) for seq in self._rows):
            # at most a logit bias a row (ignore_eos's, say): every row's in one scatter, not a
            # slice, a scatter and a concatenation of the vocabulary-wide row each
            logits = add_biases(logits, [seq.processors[0] if seq.processors else None for seq in self._rows])
        else:
            processed = []
            for at, seq in enumerate(self._rows):
                row = logits[at:at + 1]
                if seq.processors:
                    history = seq.context.update_and_fetch(inputs[at:at + 1]) if seq.context is not None else None
                    if history is not None:
                        contexts.append(history)
                    for processor in seq.processors:
                        row = processor(history, row)
                processed.append(row)
            logits = mx.concatenate(processed, axis=0)
        logprobs = qmv.log_softmax(logits)
        samplers = [seq.sampler for seq in self._rows]
        if all(sampler is samplers[0] for sampler in samplers):
            drawn = qmv.draw(samplers[0], logprobs)
        else:
            drawn = mx.concatenate([qmv.draw(sampler, logprobs[at:at + 1]) for at, sampler in enumerate(samplers)],
                                   axis=0)
        self._inputs, self._drawn_from = drawn, list(logprobs)
        return contexts

    def _hand_out(self, inputs: Any, drawn_from: list[Any]) -> list[Response]:
        """The responses for the tokens just fed; rows that ended leave the batch."""
        import mlx.core as mx

        self._steps += 1
        if self._steps % CLEAR_EVERY == 0:
            mx.clear_cache()
        responses: list[Response] = []
        keep: list[int] = []
        for at, (seq, token, lp) in enumerate(zip(self._rows, inputs.tolist(), drawn_from, strict=True)):
            seq.tokens.append(token)
            if lp is None:  # the row's last prompt token: fed, not generated
                keep.append(at)
                continue
            seq.made += 1
            reason = "stop" if token in self.stop else "length" if seq.made >= seq.max_tokens else None
            if reason is None:
                keep.append(at)
                responses.append(Response(seq.uid, token, lp))
            else:
                responses.append(Response(seq.uid, token, lp, reason, [layer.extract(at) for layer in self._cache],
                                          seq.tokens))
        if len(keep) < len(self._rows):
            self._keep(keep)
        return responses

    def _keep(self, keep: list[int]) -> None:
        """Only the rows at ``keep`` go on.

        When rows leave, MLX's buffer cache is released if it holds more than
        1/``CACHE_SHARE`` of the memory in use (:func:`_release_cache`): its freed buffers were
        sized for the batch as it was (cache tensors, activations, logits), and under requests
        that come and go it would otherwise collect a set per batch size until the periodic
        release (``CLEAR_EVERY`` steps) — on the tiny checkpoint, most of a server's resident
        growth under 8 clients (docs/benchmarks.md, "Start and peak RSS"). A model whose
        weights dwarf those buffers keeps them for the next steps to reuse."""
        import mlx.core as mx

        if not keep:
            self._rows, self._cache, self._inputs, self._drawn_from = [], [], None, []
            _release_cache()
            return
        for layer in self._cache:
            layer.filter(keep)
        self._rows = [self._rows[at] for at in keep]
        self._inputs = self._inputs[mx.array(keep)]
        self._drawn_from = [self._drawn_from[at] for at in keep]
        _release_cache()


def _groupable(seq: _Seq) -> bool:
    """Whether ``seq`` may be prefilled beside others (:meth:`BatchSteps._prefill_together`):
    more than its last prompt token left to feed, and mlx-lm's plain ``KVCache`` in every layer
    (empty, or holding a prompt-cache hit or earlier chunks; not a rotating, quantized or
    recurrent cache). Entries of the cache list that are no mlx-lm cache (the lane's ``RowTag``,
    which rides at the end of each row's list when adapters are served) merge as they do into
    the batch."""
    from mlx_lm.models.cache import KVCache

    if seq.ready or not seq.cache:
        return False
    layers = 0
    for entry in seq.cache:
        if type(entry).__module__.split(".")[0] == "mlx_lm":  # one of mlx-lm's caches: a layer's
            if type(entry) is not KVCache:
                return False
            layers += 1
        elif not hasattr(entry, "merge"):  # a rider that cannot ride a group
            return False
    return layers > 0


def _cached(seq: _Seq) -> int:
    """The tokens ``seq``'s own cache holds (a :func:`_groupable` one: each layer as many)."""
    from mlx_lm.models.cache import KVCache

    return next(layer.offset for layer in seq.cache if type(layer) is KVCache)


#: The batch lane releases MLX's buffer cache when rows leave once it holds more than
#: 1/CACHE_SHARE of the memory in use (weights, KV caches, prompt cache).
CACHE_SHARE = 8


def _release_cache() -> None:
    """Release MLX's buffer cache if it holds more than 1/``CACHE_SHARE`` of the memory in use:
    a small model's decode buffers are then its largest allocation and the cache would double
    its footprint; a large one's are a sliver, worth keeping for reuse (releasing them costs the
    next step fresh pages)."""
    import mlx.core as mx

    if mx.get_cache_memory() * CACHE_SHARE > mx.get_active_memory():
        mx.clear_cache()
