"""PromptCache: prefix reuse checked against a real (tiny) mlx_lm model, plus the LRU policy."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models import llama
from mlx_lm.models.cache import ArraysCache, ChunkedKVCache, KVCache, make_prompt_cache

from mlxrt.cache.prompt_cache import PromptCache

PROMPT = [5, 17, 3, 99, 42, 8, 8, 61, 23, 7, 110, 4, 19, 33, 2, 71, 90, 12, 6, 50]


@pytest.fixture(scope="module")
def model():
    mx.random.seed(0)
    args = llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=128,
        tie_word_embeddings=True,
    )
    m = llama.Model(args)
    mx.eval(m.parameters())
    return m


def run(model, tokens, cache) -> mx.array:
    """Run ``tokens`` through ``model`` into ``cache``; the logits of the last token."""
    logits = model(mx.array([list(tokens)]), cache=cache)[0, -1]
    mx.eval(logits)
    return logits


def cold(model, tokens) -> mx.array:
    return run(model, tokens, make_prompt_cache(model))


def filled(model, tokens) -> list:
    cache = make_prompt_cache(model)
    run(model, tokens, cache)
    return cache


def assert_same_logits(a: mx.array, b: mx.array) -> None:
    assert mx.allclose(a, b, atol=1e-4).item(), float(mx.abs(a - b).max())


def arrays_entry(n_floats: int) -> list:
    """A non-trimmable one-layer cache of exactly ``4 * n_floats`` bytes."""
    layer = ArraysCache(size=1)
    layer[0] = mx.zeros((1, n_floats))
    return [layer]


class TokenLog:
    """A stand-in cache layer that records the token ids it holds, to check what a copy holds."""

    def __init__(self, tokens, *, trimmable: bool = True, tag: str = "") -> None:
        self.tokens = list(tokens)
        self.trimmable = trimmable
        self.tag = tag

    @property
    def offset(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return 4 * len(self.tokens)

    @property
    def state(self) -> list:
        return []

    def is_trimmable(self) -> bool:
        return self.trimmable

    def trim(self, n: int) -> int:
        n = min(n, len(self.tokens))
        del self.tokens[len(self.tokens) - n :]
        return n


# -- reuse gives the same logits as a cold run ------------------------------------------------

def test_cached_prefix_then_rest_matches_cold_run(model):
    pc = PromptCache()
    pc.insert(PROMPT[:12], filled(model, PROMPT[:12]))
    got = pc.fetch(PROMPT)
    assert (got.status, got.reused, got.diverged_at, got.expected) == ("hit", 12, None, ())
    assert_same_logits(run(model, PROMPT[12:], got.cache), cold(model, PROMPT))


def test_partial_hit_trims_the_copy_and_gives_correct_logits(model):
    cached = PROMPT[:8] + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    prompt = PROMPT[:8] + [100, 101, 102, 103, 104]
    pc = PromptCache()
    pc.insert(cached, filled(model, cached))
    got = pc.fetch(prompt)
    assert (got.status, got.reused, got.diverged_at) == ("partial", 8, 8)
    assert got.expected == (1, 2, 3, 4, 5, 6, 7, 8)
    assert all(layer.offset == 8 for layer in got.cache)
    assert_same_logits(run(model, prompt[8:], got.cache), cold(model, prompt))
    # The comparison is sensitive: without the trim the same suffix gives other logits.
    untrimmed = filled(model, cached)
    assert not mx.allclose(run(model, prompt[8:], untrimmed), cold(model, prompt), atol=1e-4)


def test_exact_repeat_reuses_all_but_the_last_token(model):
    pc = PromptCache()
    pc.insert(PROMPT, filled(model, PROMPT))
    got = pc.fetch(PROMPT)
    assert (got.status, got.reused) == ("hit", len(PROMPT) - 1)
    assert_same_logits(run(model, PROMPT[-1:], got.cache), cold(model, PROMPT))
    # A prompt that is a prefix of the entry: the entry is trimmed to all but its last token.
    shorter = PROMPT[:6]
    got = pc.fetch(shorter)
    assert (got.status, got.reused, got.diverged_at) == ("hit", 5, None)
    assert_same_logits(run(model, shorter[-1:], got.cache), cold(model, shorter))
    # Prompts too short to leave a token to run reuse nothing.
    assert pc.fetch(PROMPT[:1]).reused == 0
    assert pc.fetch([]).reused == 0


def test_running_a_fetched_copy_leaves_the_stored_entry_intact(model):
    pc = PromptCache()
    pc.insert(PROMPT, filled(model, PROMPT))
    stored = [np.array(layer.keys[..., : len(PROMPT), :]) for layer in pc._entries[0].cache]
    # A partial hit trims the copy to 10 tokens; the new tokens overwrite positions 10.. of
    # the copy's buffers, which would be the entry's own if the copy shared them.
    other = PROMPT[:10] + [120, 121, 122, 123, 124, 125, 126]
    got = pc.fetch(other)
    assert got.reused == 10
    run(model, other[10:], got.cache)
    run(model, [1, 2, 3], got.cache)
    after = [np.array(layer.keys[..., : len(PROMPT), :]) for layer in pc._entries[0].cache]
    assert all(np.array_equal(a, b) for a, b in zip(stored, after, strict=True))
    again = pc.fetch(PROMPT)
    assert again.reused == len(PROMPT) - 1
    assert_same_logits(run(model, PROMPT[-1:], again.cache), cold(model, PROMPT))


# -- keys, choice and bounds ------------------------------------------------------------------

def test_keys_never_mix():
    pc = PromptCache()
    pc.insert([1, 2, 3, 4], [TokenLog([1, 2, 3, 4], tag="lora")], key=("lora-a",))
    miss = pc.fetch([1, 2, 3, 4, 5])
    assert (miss.status, miss.reused, miss.diverged_at, miss.expected) == ("miss", 0, None, ())
    assert pc.fetch([1, 2, 3, 4, 5], key=("lora-b",)).status == "miss"
    hit = pc.fetch([1, 2, 3, 4, 5], key=("lora-a",))
    assert (hit.status, hit.reused, hit.cache[0].tag) == ("hit", 4, "lora")
    # The same tokens under another key are a separate entry, not a replacement.
    pc.insert([1, 2, 3, 4], [TokenLog([1, 2, 3, 4], tag="base")])
    assert pc.entries == 2
    assert pc.fetch([1, 2, 3, 4, 5]).cache[0].tag == "base"
    assert pc.fetch([1, 2, 3, 4, 5], key=("lora-a",)).cache[0].tag == "lora"


def test_longest_usable_prefix_wins_and_ties_go_to_the_most_recent():
    pc = PromptCache()
    pc.insert([1, 2, 3, 10], [TokenLog([1, 2, 3, 10], tag="a")])
    pc.insert([1, 2, 3, 20], [TokenLog([1, 2, 3, 20], tag="b")])
    pc.insert([1, 9], [TokenLog([1, 9], tag="c")])
    assert pc.fetch([1, 2, 3, 30, 31]).cache[0].tag == "b"
    longest = pc.fetch([1, 2, 3, 10, 11])
    assert (longest.cache[0].tag, longest.reused, longest.status) == ("a", 4, "hit")
    # That lookup made "a" the most recently used, so it now wins the tie.
    tie = pc.fetch([1, 2, 3, 30, 31])
    assert (tie.cache[0].tag, tie.cache[0].tokens, tie.reused) == ("a", [1, 2, 3], 3)


def test_lru_eviction_by_count():
    pc = PromptCache(max_entries=2)
    pc.insert([1, 1], arrays_entry(4))
    pc.insert([2, 2], arrays_entry(4))
    assert pc.fetch([1, 1, 5]).status == "hit"  # [1, 1] is now the most recently used
    pc.insert([3, 3], arrays_entry(4))
    assert pc.entries == 2
    assert pc.fetch([2, 2, 5]).status == "miss"
    assert pc.fetch([1, 1, 5]).status == "hit"
    assert pc.fetch([3, 3, 5]).status == "hit"


def test_lru_eviction_by_bytes_and_oversize_entry_not_stored():
    pc = PromptCache(max_bytes=100)
    pc.insert([1, 1], arrays_entry(10))  # 40 bytes
    pc.insert([2, 2], arrays_entry(10))
    assert (pc.entries, pc.nbytes) == (2, 80)
    pc.insert([3, 3], arrays_entry(10))  # 120 > 100: the least recently used goes
    assert (pc.entries, pc.nbytes) == (2, 80)
    assert pc.fetch([1, 1, 5]).status == "miss"
    pc.insert([4, 4], arrays_entry(26))  # 104 bytes on its own: never stored
    assert (pc.entries, pc.nbytes) == (2, 80)
    assert pc.fetch([4, 4, 5]).status == "miss"
    assert pc.fetch([3, 3, 5]).status == "hit"
    pc.trim_to(40)  # [2, 2] is the least recently used now
    assert (pc.entries, pc.nbytes, pc.max_bytes) == (1, 40, 100)
    assert pc.fetch([3, 3, 5]).status == "hit"
    pc.clear()
    assert (pc.entries, pc.nbytes) == (0, 0)


def test_real_cache_bytes_are_counted(model):
    cache = filled(model, PROMPT)
    expected = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache)
    pc = PromptCache(max_bytes=expected)
    pc.insert(PROMPT, cache)
    assert pc.nbytes == expected > 0
    pc.insert(PROMPT[:5] + [1], filled(model, PROMPT[:5] + [1]))
    assert pc.entries == 1


def test_same_tokens_replace_and_a_trimmable_extension_drops_its_prefix():
    pc = PromptCache()
    pc.insert([1, 2, 3], [TokenLog([1, 2, 3], tag="old")])
    pc.insert([1, 2, 3], [TokenLog([1, 2, 3], tag="new")])
    assert (pc.entries, pc.nbytes) == (1, 12)
    assert pc.fetch([1, 2, 3, 4]).cache[0].tag == "new"
    pc.insert([1, 2, 3, 4, 5], [TokenLog([1, 2, 3, 4, 5], tag="longer")])
    assert (pc.entries, pc.nbytes) == (1, 20)
    got = pc.fetch([1, 2, 3, 9, 9])
    assert (got.cache[0].tag, got.cache[0].tokens, got.status) == ("longer", [1, 2, 3], "partial")
    # A non-trimmable extension cannot serve its prefix's prompts, so both stay.
    pc.insert([7, 7], arrays_entry(1))
    pc.insert([7, 7, 7, 7], arrays_entry(1))
    assert pc.entries == 3
    assert pc.fetch([7, 7, 7]).reused == 2


# -- diagnostics ------------------------------------------------------------------------------

def test_miss_and_partial_report_where_the_prompt_diverged():
    pc = PromptCache()
    entry = list(range(10, 30))
    pc.insert(entry, [TokenLog(entry)])
    miss = pc.fetch([99] + entry)
    assert (miss.status, miss.reused, miss.cache) == ("miss", 0, None)
    assert (miss.diverged_at, miss.expected) == (0, tuple(range(10, 18)))
    assert pc.stats()["last_miss"] == {"diverged_at": 0, "prompt_tokens": 21,  # no token ids (shared)
                                       "reason": "prompt diverged"}
    partial = pc.fetch(entry[:15] + [1, 2, 3])
    assert (partial.status, partial.reused, partial.diverged_at) == ("partial", 15, 15)
    assert partial.expected == (25, 26, 27, 28, 29)  # fewer than 8 left in the entry
    assert pc.stats()["last_miss"]["prompt_tokens"] == 18
    # A full hit leaves the last miss alone.
    assert pc.fetch(entry + [1]).status == "hit"
    assert pc.stats()["last_miss"]["diverged_at"] == 15
    # Of two equally close entries the most recently used is reported.
    pc.insert([1, 2, 3, 10], arrays_entry(1))
    pc.insert([1, 2, 3, 20], arrays_entry(1))
    tie = pc.fetch([1, 2, 3, 30, 31])
    assert (tie.status, tie.diverged_at, tie.expected) == ("miss", 3, (20,))


def test_stats_count_lookups():
    pc = PromptCache()
    assert pc.stats() == {
        "entries": 0, "bytes": 0, "max_entries": 10, "max_bytes": 1 << 62, "lookups": 0,
        "hits": 0, "partial_hits": 0, "misses": 0, "hit_rate": 0.0, "tokens_reused": 0,
        "last_miss": None,
    }
    assert pc.fetch([1, 2, 3]).status == "miss"
    pc.insert([1, 2, 3, 4], [TokenLog([1, 2, 3, 4])])
    pc.fetch([1, 2, 3, 4, 5])  # hit, 4
    pc.fetch([1, 2, 9, 9])  # partial, 2
    pc.fetch([5, 5])  # miss
    s = pc.stats()
    assert (s["lookups"], s["hits"], s["partial_hits"], s["misses"]) == (4, 1, 1, 2)
    assert (s["hit_rate"], s["tokens_reused"], s["entries"], s["bytes"]) == (0.5, 6, 1, 16)
    assert s["last_miss"] == {"diverged_at": 0, "prompt_tokens": 2, "reason": "prompt diverged"}


# -- caches that cannot be rewound ------------------------------------------------------------

@pytest.mark.parametrize("mixed", [False, True], ids=["arrays", "kv+arrays"])
def test_non_trimmable_cache_is_only_reused_as_a_proper_prefix(mixed):
    def make():
        layers = arrays_entry(4)
        if mixed:
            kv = KVCache()
            kv.update_and_fetch(mx.zeros((1, 2, 4, 8)), mx.zeros((1, 2, 4, 8)))
            layers.insert(0, kv)
        return layers

    pc = PromptCache()
    pc.insert([1, 2, 3, 4], make())
    hit = pc.fetch([1, 2, 3, 4, 5])
    assert (hit.status, hit.reused) == ("hit", 4)
    hit.cache[-1][0] = mx.ones((1, 4))  # the copy is private
    assert mx.array_equal(pc._entries[0].cache[-1][0], mx.zeros((1, 4))).item()
    exact = pc.fetch([1, 2, 3, 4])  # would need rewinding one token
    assert (exact.status, exact.reused, exact.diverged_at, exact.expected) == ("miss", 0, 4, ())
    assert exact.reason == "recurrent state"
    diverged = pc.fetch([1, 2, 3, 9, 9])
    assert (diverged.status, diverged.reused, diverged.diverged_at) == ("miss", 0, 3)
    assert diverged.expected == (4,) and diverged.reason == "recurrent state"
    assert pc.fetch([7, 7]).reason == "prompt diverged" and pc.fetch([1, 2], key="other").reason == "no cached prompt"
    shorter = pc.fetch([1, 2, 3])
    assert (shorter.status, shorter.diverged_at, shorter.expected) == ("miss", 3, (4,))


def test_a_snapshot_serves_what_a_rolled_sliding_window_cannot(model):
    """A RotatingKVCache past its window cannot be trimmed: the finished request's cache only
    serves prompts that extend it, the snapshot at the prompt's last token serves the repeat."""
    from mlx_lm.models.cache import RotatingKVCache

    def rolled(n):
        layer = RotatingKVCache(max_size=4)
        layer.update_and_fetch(mx.zeros((1, 1, n, 8)), mx.zeros((1, 1, n, 8)))
        return [layer]

    prompt = list(range(1, 11))
    pc = PromptCache()
    pc.insert_turn(prompt + [50, 51], rolled(12), [(prompt[:-1], rolled(9))])
    assert pc.entries == 2
    repeat = pc.fetch(prompt)
    assert (repeat.status, repeat.reused) == ("hit", 9)
    edited = pc.fetch(prompt + [50, 99])  # left the finished entry midway: only the snapshot fits
    assert (edited.status, edited.reused, edited.diverged_at, edited.reason) == ("partial", 9, 11, "sliding window")
    # A finished cache that can still be trimmed covers the snapshot: it is not stored.
    kv = PromptCache()
    kv.insert_turn([1, 2, 3, 4], filled(model, [1, 2, 3, 4]), [([1, 2], filled(model, [1, 2]))])
    assert kv.entries == 1
    assert (kv.fetch([1, 2, 3]).reused, kv.fetch([1, 2, 3, 4, 5]).reused) == (2, 4)


def test_a_layer_that_cannot_rewind_far_enough_is_not_reused():
    layer = ChunkedKVCache(chunk_size=2)
    layer.update_and_fetch(mx.zeros((1, 1, 4, 8)), mx.zeros((1, 1, 4, 8)))
    layer.maybe_trim_front()  # keeps positions 2 and 3 only
    kv = KVCache()  # first, so a check of the first layer alone would pass
    kv.update_and_fetch(mx.zeros((1, 1, 4, 8)), mx.zeros((1, 1, 4, 8)))
    pc = PromptCache()
    pc.insert([1, 2, 3, 4], [kv, layer])
    assert pc.fetch([1, 9, 9]).status == "miss"  # rewinding 3 tokens is beyond its front
    ok = pc.fetch([1, 2, 3, 9, 9])
    assert (ok.status, ok.reused, [c.offset for c in ok.cache]) == ("partial", 3, [3, 3])


# -- switched off and misuse ------------------------------------------------------------------

@pytest.mark.parametrize("bounds", [{"max_entries": 0}, {"max_bytes": 0}])
def test_disabled_cache_stores_nothing(bounds):
    pc = PromptCache(**bounds)
    assert not pc.enabled
    pc.insert([1, 2, 3], [TokenLog([1, 2, 3])])
    assert (pc.entries, pc.nbytes) == (0, 0)
    got = pc.fetch([1, 2, 3, 4])
    assert (got.status, got.reused, got.cache, got.diverged_at) == ("miss", 0, None, None)
    assert pc.stats()["misses"] == 1
    pc.insert([1, 2, 3], [ArraysCache(size=1)])  # holds 0 bytes, still not stored
    assert pc.entries == 0


def test_insert_rejects_a_cache_that_holds_other_than_the_tokens(model):
    pc = PromptCache()
    with pytest.raises(ValueError, match="holds 20 tokens but 21"):
        pc.insert(PROMPT + [1], filled(model, PROMPT))
    with pytest.raises(ValueError, match="negative"):
        PromptCache(max_entries=-1)
    assert pc.entries == 0


# -- property: the copy holds exactly the best usable prefix ----------------------------------

entries_st = st.lists(
    st.tuples(st.lists(st.integers(0, 2), max_size=7), st.booleans()), max_size=6
)


@settings(max_examples=200, deadline=None)
@given(entries=entries_st, prompt=st.lists(st.integers(0, 2), max_size=8))
def test_reuse_is_the_best_usable_prefix(entries, prompt):
    pc = PromptCache(max_entries=100)
    latest: dict[tuple[int, ...], bool] = {}
    for tokens, trimmable in entries:
        pc.insert(tokens, [TokenLog(tokens, trimmable=trimmable)])
        if tokens:
            latest[tuple(tokens)] = trimmable

    def usable(tokens: tuple[int, ...], trimmable: bool) -> int:
        common = 0
        while common < min(len(tokens), len(prompt)) and tokens[common] == prompt[common]:
            common += 1
        k = min(common, len(prompt) - 1)
        return k if k > 0 and (k == len(tokens) or trimmable) else 0

    best = max((usable(t, trim) for t, trim in latest.items()), default=0)
    got = pc.fetch(prompt)
    assert got.reused == best
    assert got.reused <= max(len(prompt) - 1, 0)
    if best:
        assert got.cache[0].tokens == prompt[:best]
        assert got.status in ("hit", "partial")
        assert pc.fetch(prompt).cache[0].tokens == prompt[:best]  # the entry is intact
    else:
        assert (got.cache, got.status) == (None, "miss")
