"""The batch lane's own token loop (:mod:`mlxrt.engine.batch_steps`) against the serial loop
(:mod:`mlxrt.engine.steps`): rows that join and leave a running batch get the tokens they get
alone, on plain, sliding-window and recurrent caches, with caches handed back that hold
exactly the tokens reported; and the per-row adapter tags ride every model call."""

from __future__ import annotations

import pytest

from mlxrt.testing import write_tiny_checkpoint

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

PROMPTS = [[(7 * i + 3 * k) % 90 + 5 for i in range(n)] for k, n in enumerate((40, 9, 23, 1, 57))]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from mlx_lm.utils import load_model

    root = tmp_path_factory.mktemp("batch_steps")
    return {t: load_model(write_tiny_checkpoint(root / t, t))[0] for t in ("llama", "qwen3_5", "gemma3_text")}


def _stream():
    return mx.default_stream(mx.default_device())


def _alone(model, prompt, max_tokens, sampler=None, processors=None):
    from mlx_lm.models.cache import make_prompt_cache

    from mlxrt.engine.steps import token_steps

    steps = token_steps(mx.array(prompt), model, cache=make_prompt_cache(model), stream=_stream(),
                        max_tokens=max_tokens, sampler=sampler, processors=processors, prefill_step_size=16)
    return [(token, logprobs) for token, logprobs in steps]


def _drain(gen, wanted, early=()):
    """Run ``gen`` until every uid in ``wanted`` finished: {uid: [(token, logprobs)]}, {uid: response}
    (``early``: responses already taken from it)."""
    got: dict[int, list] = {uid: [] for uid in wanted}
    ends: dict[int, object] = {}
    responses = list(early)
    while True:
        for r in responses:
            got[r.uid].append((r.token, r.logprobs))
            if r.finish_reason is not None:
                ends[r.uid] = r
        if len(ends) == len(wanted):
            return got, ends
        _, responses = gen.next()


@pytest.mark.parametrize("model_type", ["llama", "qwen3_5", "gemma3_text"])
def test_rows_joining_a_running_batch_get_the_tokens_they_get_alone(models, model_type):
    """Greedy rows of different prompt lengths (one of a single token), inserted while others
    decode, prefilled in chunks: the same tokens and log-probabilities as the serial loop, and
    each finished row's cache holds exactly its prompt and every reported token."""
    from mlxrt.engine.batch_steps import BatchSteps

    model = models[model_type]
    lengths = [12, 7, 9, 5, 10]
    alone = [_alone(model, p, n) for p, n in zip(PROMPTS, lengths, strict=True)]
    gen = BatchSteps(model, completion_batch_size=4, prefill_batch_size=2, prefill_step_size=16, stream=_stream())
    uids = gen.insert(PROMPTS[:2], max_tokens=lengths[:2])
    early = [r for _ in range(4) for r in gen.next()[1]]
    assert early  # the first two decode before the others come
    uids += gen.insert(PROMPTS[2:], max_tokens=lengths[2:])  # one waits: 4 rows at most
    got, ends = _drain(gen, uids, early)
    for uid, prompt, expected in zip(uids, PROMPTS, alone, strict=True):
        assert [t for t, _ in got[uid]] == [t for t, _ in expected]
        for (_, a), (_, b) in zip(got[uid], expected, strict=True):
            assert mx.allclose(a, b, atol=1e-4).item()
        end = ends[uid]
        assert end.finish_reason == "length"
        assert end.all_tokens == prompt + [t for t, _ in expected]
        offsets = {layer.offset for layer in end.prompt_cache if isinstance(getattr(layer, "offset", None), int)}
        assert offsets <= {len(end.all_tokens)}
    assert len(gen) == 0


def test_stop_tokens_removal_and_continued_caches(models):
    """A stop token ends its row; a removed row hands back its cache and ids; a row continued
    from a handed-back cache goes on as if it never left; per-row samplers and logits
    processors (seen with the whole history) are each row's own."""
    from mlx_lm.sample_utils import make_logits_processors

    from mlxrt.engine.batch_steps import BatchSteps

    model = models["llama"]
    plain = [t for t, _ in _alone(model, PROMPTS[0], 12)]
    gen = BatchSteps(model, completion_batch_size=4, prefill_batch_size=4, prefill_step_size=8,
                     stop_tokens=[plain[3]], stream=_stream())
    (stopping,) = gen.insert([PROMPTS[0]], max_tokens=[12])
    got, ends = _drain(gen, [stopping])
    stop_at = plain.index(plain[3])  # the first time that token comes
    assert [t for t, _ in got[stopping]] == plain[:stop_at + 1] and ends[stopping].finish_reason == "stop"

    gen = BatchSteps(model, completion_batch_size=4, prefill_batch_size=4, prefill_step_size=8, stream=_stream())
    penalty = make_logits_processors(repetition_penalty=1.5, repetition_context_size=20)
    penalised = [t for t, _ in _alone(model, PROMPTS[2], 10, processors=penalty)]
    assert penalised != [t for t, _ in _alone(model, PROMPTS[2], 10)]  # the processor changes the text
    uids = gen.insert([PROMPTS[0], PROMPTS[2]], max_tokens=[12, 10], logits_processors=[(), penalty])
    first: list[int] = []
    early = []
    while len(first) < 5:
        _, responses = gen.next()
        first += [r.token for r in responses if r.uid == uids[0]]
        early += [r for r in responses if r.uid == uids[1]]
    cache, held = gen.remove([uids[0]], return_prompt_caches=True)[uids[0]]
    assert first == plain[:5] and held == PROMPTS[0] + first
    got, _ = _drain(gen, [uids[1]], early)
    assert [t for t, _ in got[uids[1]]] == penalised
    # continued: the cache holds every reported token, so the row feeds on from the last
    from mlx_lm.models.cache import trim_prompt_cache

    trim_prompt_cache(cache, 1)
    (again,) = gen.insert([first[-1:]], max_tokens=[12 - len(first)], caches=[cache], all_tokens=[held[:-1]])
    got, _ = _drain(gen, [again])
    assert first + [t for t, _ in got[again]] == plain


def test_the_batch_loop_keeps_row_tags_in_step(tmp_path):
    """The batch lane's RowTag (the last entry of each row's cache list, see mlxrt.engine.lanes) names
    the rows of every model call of the batch loop, in row order: prefill chunks, decode steps
    after rows join, after a removal, and in the caches handed back."""
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    from mlxrt.engine.batch_steps import BatchSteps
    from mlxrt.engine.lanes import RowTag

    model, _ = load_model(write_tiny_checkpoint(tmp_path / "q", "qwen3"))
    calls: list[list[str]] = []

    class Recording:
        def __getattr__(self, name):
            return getattr(model, name)

        def __call__(self, inputs, *args, cache=None, **kwargs):
            tag = cache[-1]
            assert isinstance(tag, RowTag) and len(tag.rows) == inputs.shape[0]
            calls.append(list(tag.rows))
            return model(inputs, *args, cache=cache[:-1], **kwargs)

    def tagged(name):
        return [*make_prompt_cache(model), RowTag([name])]

    gen = BatchSteps(Recording(), completion_batch_size=4, prefill_batch_size=4, prefill_step_size=4,
                     stream=_stream())
    short, long_ = gen.insert([[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]], max_tokens=[6, 6],
                              caches=[tagged("short"), tagged("long")])
    gen.next()
    (late,) = gen.insert([[5]], max_tokens=[6], caches=[tagged("late")])
    for _ in range(3):
        gen.next()
    cache, _tokens = gen.remove([short], return_prompt_caches=True)[short]
    assert cache[-1].rows == ["short"]
    names = {long_: "long", late: "late"}
    while len(gen):
        _, responses = gen.next()
        assert all(r.prompt_cache is None or r.prompt_cache[-1].rows == [names[r.uid]] for r in responses)
    gen.close()
    assert ["short"] in calls and ["long"] in calls  # each prefilled on its own cache
    assert ["short", "late"] in calls  # decoding together while "long" still prefills
    assert ["short", "late", "long"] in calls  # "long" joined the running batch
    assert ["late", "long"] in calls  # decoding on after the removal


class _Faulty:
    """The model, but a prefill chunk holding ``POISON`` raises, and so does the next decode
    step once ``fail_decode`` is set (a model or plugin bug hitting one request, or every row)."""

    POISON = 99  # PROMPTS hold ids 5..94 only

    def __init__(self, model):
        self.model = model
        self.fail_decode = False
        self.prefill_faults = 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, inputs, *args, cache=None, **kwargs):
        if inputs.shape[1] > 1 and self.POISON in inputs.tolist()[0]:
            self.prefill_faults += 1
            raise RuntimeError("poisoned prefill")
        if inputs.shape[1] == 1 and self.fail_decode:
            self.fail_decode = False
            raise RuntimeError("decode step exploded")
        return self.model(inputs, *args, cache=cache, **kwargs)


def _run(gen, rounds=None):
    """Run ``gen`` until it holds nothing (or for ``rounds``): tokens by uid, prefill failures by
    uid, responses that ended a row by uid."""
    tokens: dict[int, list] = {}
    failed: dict[int, Exception] = {}
    ends: dict[int, object] = {}
    n = 0
    while len(gen) and (rounds is None or n < rounds):
        progress, responses = gen.next()
        n += 1
        for p in progress:
            if p.error is not None:
                assert p.uid not in failed
                failed[p.uid] = p.error
        for r in responses:
            if r.error is None:
                tokens.setdefault(r.uid, []).append((r.token, r.logprobs))
            if r.finish_reason is not None:
                assert r.uid not in ends
                ends[r.uid] = r
    return tokens, failed, ends


def test_a_failing_prefill_ends_only_its_row(models):
    """A newcomer whose second prefill chunk raises is dropped with its cache and reported with
    its error, once; a row decoding meanwhile and a newcomer prefilling beside it get exactly
    the tokens and log-probs they get alone, and the loop takes new rows afterwards."""
    from mlxrt.engine.batch_steps import BatchSteps

    model = models["llama"]
    faulty = _Faulty(model)
    poisoned = PROMPTS[0][:20] + [_Faulty.POISON] + PROMPTS[0][20:]  # its first chunk (16) goes through
    alone = {0: _alone(model, PROMPTS[1], 14), 1: _alone(model, PROMPTS[4], 8), 2: _alone(model, PROMPTS[2], 6)}
    gen = BatchSteps(faulty, completion_batch_size=4, prefill_batch_size=2, prefill_step_size=16, stream=_stream())
    (running,) = gen.insert([PROMPTS[1]], max_tokens=[14])
    early, _, _ = _run(gen, rounds=3)
    assert len(early[running]) == 1  # decoding when the others come
    bad, beside = gen.insert([poisoned, PROMPTS[4]], max_tokens=[8, 8])
    tokens, failed, ends = _run(gen)
    assert faulty.prefill_faults == 1
    assert list(failed) == [bad] and str(failed[bad]) == "poisoned prefill"
    assert bad not in tokens and bad not in ends
    for uid, key in ((running, 0), (beside, 1)):
        got = early.get(uid, []) + tokens[uid]
        assert [t for t, _ in got] == [t for t, _ in alone[key]]
        for (_, a), (_, b) in zip(got, alone[key], strict=True):
            assert mx.allclose(a, b, atol=1e-4).item()
        assert ends[uid].finish_reason == "length"
    assert gen.extract_cache([bad]) == {} and len(gen) == 0
    (after,) = gen.insert([PROMPTS[2]], max_tokens=[6])
    tokens, failed, _ = _run(gen)
    assert not failed and [t for t, _ in tokens[after]] == [t for t, _ in alone[2]]


def test_a_failing_decode_step_ends_every_row_of_the_step_and_only_those(models):
    """The batched model call cannot be pinned on one row: every row in it ends with the error
    (a Response with finish_reason "error", no token, once), while a newcomer still prefilling
    on its own cache goes on to exactly the tokens it gets alone, as do rows inserted afterwards."""
    from mlxrt.engine.batch_steps import BatchSteps

    model = models["llama"]
    faulty = _Faulty(model)
    late_alone = _alone(model, PROMPTS[4], 7)
    gen = BatchSteps(faulty, completion_batch_size=4, prefill_batch_size=2, prefill_step_size=16, stream=_stream())
    decoding = gen.insert([PROMPTS[1], PROMPTS[2]], max_tokens=[20, 20])
    before, _, _ = _run(gen, rounds=4)
    assert all(len(before[uid]) >= 1 for uid in decoding)
    (late,) = gen.insert([PROMPTS[4]], max_tokens=[7])  # 57 tokens: four chunks of prefill
    gen.next()  # its first chunk
    faulty.fail_decode = True
    progress, responses = gen.next()
    assert sorted(r.uid for r in responses) == sorted(decoding)
    for r in responses:
        assert r.finish_reason == "error" and r.token is None and r.prompt_cache is None
        assert str(r.error) == "decode step exploded"
    assert [p.uid for p in progress] == [late] and progress[0].error is None  # its prefill went on
    assert len(gen) == 1 and gen.extract_cache(decoding) == {}
    tokens, failed, ends = _run(gen)
    assert not failed and set(ends) == {late}
    assert [t for t, _ in tokens[late]] == [t for t, _ in late_alone]
    (after,) = gen.insert([PROMPTS[1]], max_tokens=[5])
    tokens, _, _ = _run(gen)
    assert [t for t, _ in tokens[after]] == [t for t, _ in _alone(model, PROMPTS[1], 5)]


def test_a_cache_that_cannot_join_the_batch_ends_only_its_row(models):
    """Two newcomers ready in the same round, one of whose caches cannot merge: the other joins
    and gets the tokens it gets alone; the broken one is reported once, with its error."""
    from mlx_lm.models.cache import make_prompt_cache

    from mlxrt.engine.batch_steps import BatchSteps

    model = models["llama"]

    class Tag:  # a last cache entry the model never sees; a broken one refuses to merge
        state: list = []

        def __init__(self, ok):
            self.ok = ok

        def merge(self, tags):
            if not all(tag.ok for tag in tags):
                raise ValueError("this cache cannot join a batch")
            return Tag(True)

        def extend(self, other):
            pass

        def filter(self, keep):
            pass

        def extract(self, idx):
            return Tag(True)

    class Stripping:
        def __getattr__(self, name):
            return getattr(model, name)

        def __call__(self, inputs, *args, cache=None, **kwargs):
            return model(inputs, *args, cache=cache[:-1], **kwargs)

    gen = BatchSteps(Stripping(), completion_batch_size=4, prefill_batch_size=2, prefill_step_size=64,
                     stream=_stream())
    good, broken = gen.insert([PROMPTS[1], PROMPTS[2]], max_tokens=[6, 6],
                              caches=[[*make_prompt_cache(model), Tag(ok)] for ok in (True, False)])
    tokens, failed, ends = _run(gen)
    assert list(failed) == [broken] and "cannot join" in str(failed[broken])
    assert set(ends) == {good} and broken not in tokens
    assert [t for t, _ in tokens[good]] == [t for t, _ in _alone(model, PROMPTS[1], 6)]


@pytest.mark.parametrize("small_model", [True, False])
def test_rows_leaving_release_the_buffer_cache_only_for_a_small_model(models, monkeypatch, small_model):
    """Rows finishing at different steps change the batch's shape. Where the cached buffers
    outweigh 1/CACHE_SHARE of the memory in use (a tiny model: its decode buffers outweigh its
    weights), rows leaving release them, and a drained batch leaves MLX's buffer cache all but empty;
    a model whose weights dwarf them keeps them for reuse. (The module's three tiny models
    stand for either, with CACHE_SHARE set to make the cache large or small beside them.)"""
    import mlxrt.engine.batch_steps as batch_steps

    monkeypatch.setattr(batch_steps, "CACHE_SHARE", 10**9 if small_model else 0)
    gen = batch_steps.BatchSteps(models["llama"], completion_batch_size=8, prefill_batch_size=8,
                                 prefill_step_size=16, stream=_stream())
    mx.clear_cache()
    uids = gen.insert([PROMPTS[k % len(PROMPTS)] for k in range(8)], max_tokens=[3 + 4 * k for k in range(8)])
    got, _ends = _drain(gen, uids)
    assert [len(got[uid]) for uid in uids] == [3 + 4 * k for k in range(8)]
    assert len(gen) == 0
    # released: a few bytes at most (the last step's scalars, freed after the release); kept:
    # the decode buffers of each batch size (~0.7 MB here)
    if small_model:
        assert mx.get_cache_memory() < 1024
    else:
        assert mx.get_cache_memory() > 100_000
