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
