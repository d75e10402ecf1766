"""Reuse of KV caches across requests by longest common prefix.

Chat clients resend the whole conversation each turn, so most of a new prompt was already
run through the model by the previous request. :class:`PromptCache` keeps the per-layer
caches (mlx_lm cache objects) of recent requests together with the token ids they hold,
and hands back a private copy of the one that saves the most work.

Policy:

* **Keys.** Every entry is stored under a key (the engine passes the adapter set: ``()`` for
  the base model, ``("lora-a",)`` …) and a partition (the caller: a digest of its API key, ``""``
  without keys). A lookup only considers entries with an equal key and partition: caches
  computed with different weights never mix, and one caller never reuses another's prompt,
  nor learns by ``cached_tokens``, the miss report or the timing how much of it it guessed.
* **Usable prefix.** For an entry ``E`` and a prompt ``P`` let ``c`` be their longest common
  prefix; the entry can cover ``k = min(c, len(P) - 1)`` tokens. At least one prompt token
  is always left to run, because the engine needs the logits of the last one. If
  ``k == len(E)`` the copy is used as is; if ``k < len(E)`` the copy must be trimmed by
  ``len(E) - k`` tokens, which is only possible when every layer of the cache can be
  trimmed (``can_trim_prompt_cache``). Recurrent state (``ArraysCache`` of linear-attention
  layers) cannot be rewound, so such an entry is only used when it is a prefix of the
  prompt and shorter than it.
* **Choice.** The entry with the largest usable ``k`` wins; ties go to the most recently
  used. The chosen entry becomes the most recently used.
* **Isolation.** The stored entry is never handed out: the lookup returns a
  ``copy.deepcopy`` (mlx arrays copy their data), so the engine may run tokens through it.
* **Bounds.** At most ``max_entries`` entries and ``max_bytes`` bytes (the ``nbytes`` of the
  cache objects, allocated capacity included). An insert evicts least-recently-used
  entries until both hold; an entry larger than ``max_bytes`` on its own is not stored.
  ``max_entries=0`` or ``max_bytes=0`` turns the cache off.
* **Redundancy.** Inserting the same tokens under the same key replaces the old entry. A
  trimmable entry also replaces same-key entries whose tokens are a prefix of its own: it
  can serve every prompt they could.
* **Snapshots.** A cache that cannot be rewound (a sliding-window ``RotatingKVCache`` past its
  window, the recurrent state of linear-attention layers) can only serve prompts that extend
  it. The lanes therefore also hand back snapshots (:func:`keeps_snapshots` says for which
  models) taken at the end of the prompt but its last token, a proper prefix of an exact
  repeat and of a next turn that re-renders this prompt whole, and at the turn boundary
  (``GenerationRequest.turn_start``: before the chat template's generation prompt, which the
  next turn may render differently, e.g. without the ``<think>`` it opened). Snapshots are
  ordinary entries (counted in the bounds); when the finished cache can be trimmed after all,
  it covers them and they are not stored.
* **Diagnostics.** Each lookup that falls short of a full hit reports where the prompt left
  the closest entry (the one with the longest common prefix), what that entry held there and
  why no more was reused (``reason``): ``prompt diverged``, ``sliding window`` or
  ``recurrent state`` (the closest entry could not be rewound to the divergence point), or
  ``no cached prompt``; so a client that rewrites its history (a changed system prompt, a
  re-rendered tool call, a dropped ``<think>`` block) can be told why its prompt ran cold.

The cache is used from the engine's worker thread only; it holds no locks.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Sequence
from typing import Any

import attrs
import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import can_trim_prompt_cache

from mlxrt.cache.token_ids import TokenIds, common_prefix

__all__ = ["CacheLookup", "PromptCache", "common_prefix", "keeps_snapshots", "snapshots_from", "token_array"]

#: How many of the closest entry's tokens after the divergence point a lookup reports.
EXPECTED_TOKENS = 8


@attrs.frozen
class CacheLookup:
    """The outcome of :meth:`PromptCache.fetch`.

    Attributes:
        cache: A private copy of the chosen entry's per-layer caches, already trimmed to
            ``reused`` tokens; the caller may run tokens through it. ``None`` when nothing
            is reused.
        reused: Prompt tokens covered by ``cache``: run ``tokens[reused:]`` through it. 0 on
            a miss; never more than ``len(tokens) - 1``.
        diverged_at: On a miss or partial hit, the index of the first prompt token that
            differs from the closest same-key entry (their common prefix length; equal to
            ``len(tokens)`` when the prompt is a prefix of that entry). ``None`` on a full
            hit or when no entry has this key.
        expected: The closest entry's next token ids (up to 8) at ``diverged_at``, what the
            cache held where the prompt went elsewhere; ``()`` when there is none.
        status: ``"hit"`` when all usable tokens were reused (``len(tokens) - 1`` of them,
            or the whole entry when it is a prefix of the prompt), ``"partial"`` when some
            were reused but the prompt diverged from the entry, ``"miss"`` when none were.
        reason: Why no more was reused (see the module docstring); ``None`` on a full hit.
    """

    cache: list[Any] | None
    reused: int
    diverged_at: int | None
    expected: tuple[int, ...]
    status: str
    reason: str | None = None


@attrs.frozen(eq=False)
class _Entry:
    key: tuple[Hashable, str]  # (key, partition)
    tokens: TokenIds
    cache: list[Any]
    nbytes: int
    trimmable: bool


class PromptCache:
    """Per-layer caches of recent requests, found again by longest common token prefix.

    Args:
        max_entries: How many entries are kept at most; 0 disables the cache.
        max_bytes: How many bytes of cache are kept at most; 0 disables the cache.
    """

    def __init__(self, *, max_entries: int = 10, max_bytes: int = 1 << 62) -> None:
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("max_entries and max_bytes must not be negative")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        # Least recently used first; entries are few, so lists and linear scans suffice.
        self._entries: list[_Entry] = []
        self._nbytes = 0
        self._lookups = 0
        self._hits = 0
        self._partial_hits = 0
        self._misses = 0
        self._tokens_reused = 0
        self._last_miss: dict[str, Any] | None = None

    @property
    def entries(self) -> int:
        """How many entries are stored."""
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes held by the stored entries."""
        return self._nbytes

    @property
    def enabled(self) -> bool:
        """False when ``max_entries`` or ``max_bytes`` is 0: nothing is ever stored."""
        return self.max_entries > 0 and self.max_bytes > 0

    def fetch(self, tokens: Sequence[int], key: Hashable = (), partition: str = "") -> CacheLookup:
        """Find the entry that covers most of ``tokens`` and return a private copy of it.

        Args:
            tokens: The prompt's token ids.
            key: Only entries inserted with an equal key are considered.
            partition: ...and with an equal partition (the caller).

        Returns:
            A :class:`CacheLookup`; run ``tokens[lookup.reused:]`` through
            ``lookup.cache`` (or through a fresh cache when it is ``None``).
        """
        prompt = token_array(tokens)
        limit = prompt.size - 1
        closest, candidates = self._candidates(prompt, (key, partition))
        for usable, entry in candidates:
            cache = _copy_trimmed(entry, usable)
            if cache is None:
                continue
            self._entries.remove(entry)
            self._entries.append(entry)
            if usable == limit:
                return self._record(CacheLookup(cache, usable, None, (), "hit"), prompt.size)
            reason = _shortfall(closest, usable, limit)
            if reason is None:  # the entry was a prefix of the prompt and nothing held more
                return self._record(CacheLookup(cache, usable, None, (), "hit"), prompt.size)
            return self._record(
                CacheLookup(cache, usable, *_divergence(closest), "partial", reason), prompt.size
            )
        return self._record(CacheLookup(None, 0, *_divergence(closest), "miss",
                                        _shortfall(closest, 0, limit) or "prompt diverged"), prompt.size)

    def reusable(self, tokens: Sequence[int], key: Hashable = (), partition: str = "") -> int:
        """How many of ``tokens`` a :meth:`fetch` could reuse at most (nothing is copied,
        no counter moves): for a second tier (:mod:`mlxrt.cache.prompt_store`) to know if it can do better."""
        _closest, candidates = self._candidates(token_array(tokens), (key, partition))
        return candidates[0][0] if candidates else 0

    def close(self) -> None:
        """Release what the cache holds beyond memory (nothing here; see :mod:`mlxrt.cache.prompt_store`)."""

    def _candidates(self, prompt: TokenIds, key: tuple[Hashable, str]
                    ) -> tuple[tuple[int, _Entry] | None, list[tuple[int, _Entry]]]:
        """The same-key (and partition) entry with the longest common prefix, and the usable entries, best first."""
        limit = prompt.size - 1
        closest: tuple[int, _Entry] | None = None
        candidates: list[tuple[int, _Entry]] = []
        # Most recent first, so a strict ">" and a stable sort keep ties on the newest.
        for entry in reversed(self._entries):
            if entry.key != key:
                continue
            common = common_prefix(entry.tokens, prompt)
            if closest is None or common > closest[0]:
                closest = (common, entry)
            usable = min(common, limit)
            if usable > 0 and (usable == entry.tokens.size or entry.trimmable):
                candidates.append((usable, entry))
        candidates.sort(key=lambda c: -c[0])
        return closest, candidates

    def insert(self, tokens: Sequence[int], cache: list[Any], key: Hashable = (), partition: str = "") -> None:
        """Store ``cache`` as the most recently used entry for ``tokens`` under ``key`` in
        ``partition``.

        The cache takes ownership of ``cache``: the caller must not use it afterwards. It
        must hold exactly ``tokens`` (for a finished generation: the prompt and every
        generated token that was run through the model, which excludes the last sampled
        one). Entries are evicted, least recently used first, until the bounds hold; a
        cache larger than ``max_bytes`` is dropped, and so is everything when disabled.

        Raises:
            ValueError: a layer's ``offset`` says it holds a different number of tokens.
        """
        stored = token_array(tokens)
        if not self.enabled or stored.size == 0:
            return
        for layer in cache:
            offset = getattr(layer, "offset", None)
            if isinstance(offset, int) and offset != stored.size:
                raise ValueError(
                    f"cache holds {offset} tokens but {stored.size} token ids were given"
                )
        nbytes = _cache_nbytes(cache)
        if nbytes > self.max_bytes:
            return
        # A lazy array would keep the graph that produced it alive for as long as it is cached.
        mx.eval([layer.state for layer in cache])
        entry = _Entry((key, partition), stored, cache, nbytes, can_trim_prompt_cache(cache))
        for old in list(self._entries):
            if old.key != entry.key or old.tokens.size > stored.size:
                continue
            if common_prefix(old.tokens, stored) == old.tokens.size and (
                old.tokens.size == stored.size or entry.trimmable
            ):
                self._drop(old)
        self._entries.append(entry)
        self._nbytes += nbytes
        while len(self._entries) > self.max_entries:
            self._drop(self._entries[0])
        self.trim_to(self.max_bytes)

    def insert_turn(self, tokens: Sequence[int], cache: list[Any] | None,
                    snapshots: Sequence[tuple[Sequence[int], list[Any]]] = (), key: Hashable = (),
                    partition: str = "") -> None:
        """Store what a finished request leaves: its final ``cache`` holding ``tokens`` (if
        any) and its prompt ``snapshots`` ``(tokens, cache)`` (see the module docstring). The
        snapshots go in first (they are evicted first) and only when the final cache cannot be
        trimmed back to them; everything is owned by the cache afterwards.

        Raises:
            ValueError: as :meth:`insert` (the others are still stored).
        """
        final = cache is not None and len(tokens) > 0
        problem: ValueError | None = None
        if not (final and can_trim_prompt_cache(cache)):
            for held, layers in snapshots:
                try:
                    self.insert(held, layers, key, partition)
                except ValueError as exc:
                    problem = exc
        if final:
            self.insert(tokens, cache, key, partition)
        if problem is not None:
            raise problem

    def trim_to(self, max_bytes: int) -> None:
        """Evict least-recently-used entries until at most ``max_bytes`` bytes are held.

        ``max_bytes`` is a one-off target (under memory pressure, say); the configured
        ``max_bytes`` of the cache does not change.
        """
        while self._entries and self._nbytes > max_bytes:
            self._drop(self._entries[0])

    def clear(self) -> None:
        """Drop every entry. The counters in :meth:`stats` are kept."""
        self._entries.clear()
        self._nbytes = 0

    def stats(self) -> dict[str, Any]:
        """Occupancy and lookup counters, for the engine's status report.

        Returns:
            ``entries``, ``bytes``, ``max_entries``, ``max_bytes``; ``lookups``, ``hits``,
            ``partial_hits``, ``misses``; ``hit_rate`` (hits and partial hits over lookups,
            0.0 before the first); ``tokens_reused`` (summed over lookups); ``last_miss``,
            the most recent lookup that was not a full hit, as ``{"diverged_at",
            "prompt_tokens", "reason"}`` (no token ids: the report is shared by every client), or
            ``None``.
        """
        reused = self._hits + self._partial_hits
        return {
            "entries": len(self._entries),
            "bytes": self._nbytes,
            "max_entries": self.max_entries,
            "max_bytes": self.max_bytes,
            "lookups": self._lookups,
            "hits": self._hits,
            "partial_hits": self._partial_hits,
            "misses": self._misses,
            "hit_rate": reused / self._lookups if self._lookups else 0.0,
            "tokens_reused": self._tokens_reused,
            "last_miss": None if self._last_miss is None else dict(self._last_miss),
        }

    def _record(self, lookup: CacheLookup, prompt_tokens: int) -> CacheLookup:
        self._lookups += 1
        self._tokens_reused += lookup.reused
        if lookup.status == "hit":
            self._hits += 1
            return lookup
        if lookup.status == "partial":
            self._partial_hits += 1
        else:
            self._misses += 1
        # Positions, lengths and reasons only: the token ids would decode to another request's prompt.
        self._last_miss = {"diverged_at": lookup.diverged_at, "prompt_tokens": prompt_tokens,
                           "reason": lookup.reason}
        return lookup

    def _drop(self, entry: _Entry) -> None:
        self._entries.remove(entry)
        self._nbytes -= entry.nbytes


def token_array(tokens: Sequence[int]) -> TokenIds:
    """``tokens`` as the cache keeps them (a copy: the caller's sequence may change later).

    :raises ValueError: an id that is not an int32 integer.
    """
    try:
        return TokenIds(tokens)
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"token ids must be a flat sequence of int32 integers: {exc}") from exc


def _divergence(closest: tuple[int, _Entry] | None) -> tuple[int | None, tuple[int, ...]]:
    if closest is None:
        return None, ()
    at, entry = closest
    return at, entry.tokens[at : at + EXPECTED_TOKENS]


def _shortfall(closest: tuple[int, _Entry] | None, reused: int, limit: int) -> str | None:
    """Why a lookup that reused ``reused`` tokens got no more (None: nothing more was there)."""
    if closest is None:
        return "no cached prompt"
    common, entry = closest
    if min(common, limit) <= reused:
        # The closest entry shares no more than was reused: the prompt went elsewhere, or it
        # extends the entry (a prefix of the prompt reused whole is a full hit).
        return None if common == entry.tokens.size or reused == limit else "prompt diverged"
    return _rewind_blocker(entry.cache) or "prompt diverged"


def _rewind_blocker(cache: list[Any]) -> str | None:
    """What keeps ``cache`` from being rewound: recurrent state or a sliding window that has
    rolled past its first tokens; None when every layer can be trimmed."""
    for layer in cache:
        if not layer.is_trimmable():
            if isinstance(getattr(layer, "max_size", None), int):
                return "sliding window"
            return "recurrent state"
    return None


def keeps_snapshots(cache: list[Any]) -> bool:
    """Whether a model whose fresh cache is ``cache`` needs prompt snapshots (see the module
    docstring): some layer cannot be rewound, or is a sliding window that stops being
    rewindable once a prompt outgrows it. Plain (or quantized) KV caches never need them."""
    return snapshots_from(cache) is not None


def snapshots_from(cache: list[Any]) -> int | None:
    """Context length (prompt + generated tokens) from which a request on a model whose fresh
    cache is ``cache`` needs snapshots: 0 with recurrent state (always), the smallest sliding
    window otherwise (a cache that stays inside every window can still be trimmed), ``None``
    when every layer can always be trimmed."""
    windows = []
    for layer in cache:
        if not layer.is_trimmable():
            return 0
        if isinstance(getattr(layer, "max_size", None), int):
            windows.append(layer.max_size)
    return min(windows) if windows else None


def _copy_trimmed(entry: _Entry, keep: int) -> list[Any] | None:
    cache = copy.deepcopy(entry.cache)
    excess = entry.tokens.size - keep
    if excess == 0:
        return cache
    # Trimmed layer by layer (not trim_prompt_cache, which reports only the first layer):
    # a chunked layer that already dropped its front cannot rewind that far, and a cache
    # whose layers disagree about their length would give wrong logits.
    if any(layer.trim(excess) != excess for layer in cache):
        return None
    return cache


def _cache_nbytes(cache: list[Any]) -> int:
    total = 0
    for layer in cache:
        try:
            total += layer.nbytes
        except NotImplementedError:
            # A cache class without nbytes: count the arrays in its state.
            total += sum(v.nbytes for _, v in tree_flatten(layer.state)
                         if isinstance(v, mx.array))
    return total
