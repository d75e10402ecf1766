"""Sampling: the built-in chain (mlx-lm's sampler and processors) and the request fields
that configure it, unit-level and through the official openai client."""

from __future__ import annotations

import mlx.core as mx
import pytest
from support import openai_client
from tokenizers import Tokenizer

from mlxrt.engine.sampling import (
    build_logits_processors,
    build_sampler,
    resolve_sampling,
    xtc_special_tokens,
)
from mlxrt.host import make_host
from mlxrt.records import GenerationRequest, ModelInfo, SamplingParams

MSG = [{"role": "user", "content": "Tell me about the sea."}]


class FakeTokenizer:
    eos_token_ids = {9}

    def encode(self, text, add_special_tokens=True):
        assert text == "\n" and not add_special_tokens
        return [7]


def _sampler(**sampling):
    host = make_host()
    request = GenerationRequest(request_id="r", prompt_ids=(1,), max_tokens=1, sampling=SamplingParams(**sampling))
    return build_sampler(host, request, ModelInfo(model_id="m", path=".", model_type="x"), FakeTokenizer())


def _processors(**sampling):
    request = GenerationRequest(request_id="r", prompt_ids=(1,), max_tokens=1, sampling=SamplingParams(**sampling))
    return build_logits_processors(make_host(), request, ModelInfo(model_id="m", path=".", model_type="x"))


def _apply(processors, tokens, logits):
    out = mx.array([logits], dtype=mx.float32)
    for proc in processors:
        out = proc(mx.array(tokens), out)
    return out[0].tolist()


def test_xtc_special_tokens_are_eos_and_newline():
    assert xtc_special_tokens(FakeTokenizer()) == [7, 9]


def test_xtc_removes_every_likely_token_but_the_least_likely_one():
    probs = [0.5, 0.3, 0.15, 0.05] + [0.0] * 6
    logprobs = mx.log(mx.array([[max(p, 1e-9) for p in probs]]))
    sample = _sampler(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.1)
    mx.random.seed(0)
    seen = {int(sample(logprobs).item()) for _ in range(200)}
    assert seen <= {2, 3, 7, 9} and 2 in seen and 0 not in seen and 1 not in seen


def test_xtc_spares_eos_and_newline():
    probs = [0.0] * 7 + [0.3, 0.0, 0.5] + [0.2]
    logprobs = mx.log(mx.array([[max(p, 1e-9) for p in probs]]))
    sample = _sampler(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.1)
    mx.random.seed(1)
    seen = {int(sample(logprobs).item()) for _ in range(300)}
    assert {7, 9} <= seen  # both above the threshold, neither removed


def test_xtc_threshold_above_half_is_a_no_op_not_an_error():
    logprobs = mx.log(mx.array([[0.9, 0.05, 0.05]]))
    sample = _sampler(temperature=1e-3, xtc_probability=1.0, xtc_threshold=0.8)
    assert int(sample(logprobs).item()) == 0


def test_logit_bias_adds_to_the_logit():
    out = _apply(_processors(logit_bias={2: 5.0, 0: -1.5}), [1], [0.0, 0.0, 0.0, 0.0])
    assert out == [-1.5, 0.0, 5.0, 0.0]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    out = _apply(_processors(repetition_penalty=2.0), [0, 1], [4.0, -4.0, 4.0])
    assert out == [2.0, -8.0, 4.0]


@pytest.mark.parametrize(("size", "expected"), [(2, [4.0, 2.0, 2.0, 4.0]), (0, [2.0, 2.0, 2.0, 4.0])])
def test_context_size_windows_and_zero_is_the_whole_history(size, expected):
    out = _apply(_processors(repetition_penalty=2.0, repetition_context_size=size), [0, 1, 2], [4.0] * 4)
    assert out == expected


def test_presence_penalty_once_per_token_frequency_per_occurrence():
    tokens = [0, 0, 0, 1]
    assert _apply(_processors(presence_penalty=1.0), tokens, [0.0] * 3) == [-1.0, -1.0, 0.0]
    assert _apply(_processors(frequency_penalty=1.0), tokens, [0.0] * 3) == [-3.0, -1.0, 0.0]
    windowed = _processors(frequency_penalty=1.0, frequency_context_size=2)
    assert _apply(windowed, tokens, [0.0] * 3) == [-1.0, -1.0, 0.0]
    whole = _processors(presence_penalty=0.5, presence_context_size=0)
    assert _apply(whole, [2] + [0] * 30, [0.0] * 3) == [-0.5, 0.0, -0.5]


def test_neutral_settings_add_no_processors():
    assert _processors() == []
    assert _processors(repetition_penalty=1.0) == []


def test_plugin_processors_run_after_the_builtin_ones():
    from mlxrt import hookimpl

    seen = []

    class Watcher:
        @hookimpl
        def mlxrt_logits_processors(self, request, info):
            def watch(tokens, logits):
                seen.append(logits[0].tolist())
                return logits

            return [watch]

    request = GenerationRequest(request_id="r", prompt_ids=(1,), max_tokens=1,
                                sampling=SamplingParams(logit_bias={0: 3.0}))
    procs = build_logits_processors(make_host(extra=[("watcher", Watcher())]), request,
                                    ModelInfo(model_id="m", path=".", model_type="x"))
    _apply(procs, [1], [0.0, 0.0])
    assert seen == [[3.0, 0.0]]


def test_resolve_sampling_precedence_for_the_new_fields():
    s = resolve_sampling({"presence_penalty": 0.5}, {"temp": 0.3}, {"repetition_penalty": 1.1, "temperature": 0.9})
    assert (s.temperature, s.repetition_penalty, s.presence_penalty) == (0.3, 1.1, 0.5)
    assert (s.repetition_context_size, s.xtc_threshold, s.xtc_probability) == (20, 0.1, 0.0)
    assert resolve_sampling({"repetition_penalty": 0}, {}, {"repetition_penalty": 1.1}).repetition_penalty == 0.0


# -- through the API ------------------------------------------------------------------------------


def _token_id(model_dir, text):
    (tid,) = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    return tid


def _chat(client, **kw):
    body = {"model": "m", "messages": MSG, "max_tokens": 12, "temperature": 0, **kw}
    extra = {k: body.pop(k) for k in list(body) if k not in ("model", "messages", "max_tokens", "temperature",
                                                              "seed", "logit_bias", "presence_penalty",
                                                              "frequency_penalty", "logprobs", "top_logprobs")}
    return openai_client(client).chat.completions.create(**body, extra_body=extra or None)


def test_logit_bias_forces_a_token(mlxrt_tiny_checkpoint, mlxrt_client):
    dog = _token_id(mlxrt_tiny_checkpoint("qwen3"), "dog")
    out = _chat(mlxrt_client, logit_bias={str(dog): 100})
    assert out.choices[0].message.content == "dog" * 12
    assert out.choices[0].finish_reason == "length"


def test_logit_bias_on_completions(mlxrt_tiny_checkpoint, mlxrt_client):
    dog = _token_id(mlxrt_tiny_checkpoint("qwen3"), " dog")
    out = openai_client(mlxrt_client).completions.create(model="m", prompt="A", max_tokens=5, temperature=0,
                                                         logit_bias={str(dog): 100})
    assert out.choices[0].text == " dog" * 5


def test_repetition_penalty_changes_greedy_output(mlxrt_client):
    plain = _chat(mlxrt_client).choices[0].message.content
    penalised = _chat(mlxrt_client, repetition_penalty=5.0).choices[0].message.content
    assert penalised != plain
    assert _chat(mlxrt_client, repetition_penalty=5.0).choices[0].message.content == penalised


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_additive_penalties_over_the_whole_history_never_repeat_a_token(mlxrt_client, field):
    plain = _chat(mlxrt_client, logprobs=True, max_tokens=16)
    plain_ids = [e.model_extra["id"] for e in plain.choices[0].logprobs.content]
    assert len(set(plain_ids)) < len(plain_ids)  # the random model loops when left alone
    out = _chat(mlxrt_client, logprobs=True, max_tokens=16, **{field: 50.0, field.replace("penalty", "context_size"): 0})
    ids = [e.model_extra["id"] for e in out.choices[0].logprobs.content]
    assert len(set(ids)) == len(ids) == 16


def test_xtc_with_threshold_zero_keeps_only_the_least_likely_and_special_tokens(mlxrt_tiny_checkpoint, mlxrt_client):
    out = _chat(mlxrt_client, temperature=1.0, seed=3, xtc_probability=1.0, xtc_threshold=0.0,
                logprobs=True, top_logprobs=11, max_tokens=10)
    greedy = _chat(mlxrt_client, max_tokens=10).choices[0].message.content
    assert out.choices[0].message.content != greedy
    special = {_token_id(mlxrt_tiny_checkpoint("qwen3"), "\n")}
    for entry in out.choices[0].logprobs.content:
        if entry.model_extra["id"] not in special:
            assert entry.logprob < entry.top_logprobs[-1].logprob  # never one of the 11 likeliest


SAMPLED = [
    {},
    {"top_p": 0.5},
    {"top_k": 5},
    {"min_p": 0.2},
    {"repetition_penalty": 1.5, "repetition_context_size": 4},
    {"presence_penalty": 1.0},
    {"frequency_penalty": 1.0, "frequency_context_size": 0},
    {"xtc_probability": 0.5, "xtc_threshold": 0.05},
    {"logit_bias": {"5": 2.0}},
]


@pytest.mark.parametrize("fields", SAMPLED, ids=lambda f: ",".join(f) or "plain")
def test_same_seed_same_text_with_each_field(mlxrt_client, fields):
    def run(seed):
        return _chat(mlxrt_client, temperature=1.0, seed=seed, max_tokens=16, **fields).choices[0].message.content

    first = run(11)
    assert run(11) == first
    assert any(run(s) != first for s in (12, 13, 14))


BAD = [
    ({"logit_bias": []}, "logit_bias must be a dict of int to float"),
    ({"logit_bias": "x"}, "logit_bias must be a dict of int to float"),
    ({"logit_bias": {"a": 1}}, "logit_bias must be a dict of int to float"),
    ({"logit_bias": {"1.5": 1}}, "logit_bias must be a dict of int to float"),
    ({"logit_bias": {"1": "x"}}, "logit_bias must be a dict of int to float"),
    ({"logit_bias": {"1": True}}, "logit_bias must be a dict of int to float"),
    ({"logit_bias": {"1": None}}, "logit_bias must be a dict of int to float"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias token id 99999999 is not in the vocabulary (0 to 1151)"),
    ({"logit_bias": {"-1": 1}}, "logit_bias token id -1 is not in the vocabulary"),
    ({"repetition_penalty": -1}, "repetition_penalty must be at least 0"),
    ({"repetition_penalty": "x"}, "repetition_penalty must be of type ('float', 'int')"),
    ({"repetition_context_size": -1}, "repetition_context_size must be at least 0"),
    ({"repetition_context_size": 2.5}, "repetition_context_size must be of type int"),
    ({"presence_penalty": "x"}, "presence_penalty must be of type ('float', 'int')"),
    ({"presence_context_size": -1}, "presence_context_size must be at least 0"),
    ({"frequency_penalty": True}, "frequency_penalty must be of type ('float', 'int')"),
    ({"frequency_context_size": "20"}, "frequency_context_size must be of type int"),
    ({"xtc_probability": 1.5}, "xtc_probability must be at most 1"),
    ({"xtc_probability": -0.1}, "xtc_probability must be at least 0"),
    ({"xtc_threshold": 2}, "xtc_threshold must be at most 1"),
    ({"xtc_threshold": "x"}, "xtc_threshold must be of type ('float', 'int')"),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[m for _, m in BAD])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bad_sampling_fields_are_400s_on_both_endpoints(mlxrt_client, fields, message, endpoint):
    path, body = (("/v1/chat/completions", {"messages": MSG}) if endpoint == "chat"
                  else ("/v1/completions", {"prompt": "Once"}))
    resp = mlxrt_client.post(path, json={**body, "max_tokens": 2, **fields})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"].startswith(message)
    assert mlxrt_client.post(path, json={**body, "max_tokens": 2}).status_code == 200


def test_non_finite_logit_bias_is_refused():
    from mlxrt.errors import InvalidRequest
    from mlxrt.plugins.openai.decode import decode_logit_bias

    assert decode_logit_bias({"7": 1, "-0": 2.5}) == {7: 1.0, 0: 2.5}
    for bad in ({"1": float("nan")}, {"1": float("inf")}, {" 1": 1}, {"1_0": 1}):
        with pytest.raises(InvalidRequest, match="logit_bias must be a dict of int to float"):
            decode_logit_bias(bad)


def test_top_k_at_or_past_the_vocabulary_keeps_every_token(mlxrt_client):
    """mlx-lm's sampler raises for top_k >= vocab; such a top_k filters nothing."""
    vocab = mlxrt_client.app.state.models.primary.engine.info.config_int("vocab_size")

    def run(**kw):
        return _chat(mlxrt_client, temperature=1.0, seed=5, max_tokens=8, **kw).choices[0].message.content

    assert run(top_k=vocab) == run(top_k=10**6) == run()
