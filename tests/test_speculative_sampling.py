"""Speculative decoding (--draft-model) under the built-in samplers: top-p, min-p and top-k
requests draft, whether the nucleus filter is mlx-lm's or the mlxrt-qmv kernel's (which wraps
mlx-lm's chain), because ``build_sampler`` marks what it builds stateless; a plugin's sampler
carries no mark and decodes without the draft."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import apply_top_p
from support import openai_client

from mlxrt.engine import qmv
from mlxrt.engine.sampling import build_sampler, is_stateless, seeded
from mlxrt.host import make_host
from mlxrt.records import GenerationRequest, ModelInfo, SamplingParams

#: Sampled requests, one per filter and all together (temperature 0.8 each).
FILTERS = ({"top_p": 0.9}, {"min_p": 0.1}, {"top_k": 5}, {"top_p": 0.9, "min_p": 0.05, "top_k": 20, "seed": 3})


def _nucleus(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which nucleus filter ``build_sampler`` wraps mlx-lm's chain with."""
    if kind == "kernel":
        if qmv.top_p_filter() is None:
            pytest.skip("the mlxrt-qmv kernel (with sort and exp) is not loaded")
    elif kind == "wrapped":  # a filter of the kernel's shape where the kernel is not built
        monkeypatch.setattr(qmv, "top_p_filter", lambda: apply_top_p)
    else:  # the kernel off, as MLXRT_QMV=0 turns it off (no layers, no filter): mlx-lm's chain
        monkeypatch.setattr(qmv, "_status", qmv.QmvStatus(reason="MLXRT_QMV=0"))
        assert qmv.top_p_filter() is None


def _sampler(**sampling):
    request = GenerationRequest(request_id="r", prompt_ids=(1,), max_tokens=1,
                                sampling=SamplingParams(temperature=0.8, **sampling))
    return build_sampler(make_host(), request, ModelInfo(model_id="m", path=".", model_type="x"))


@pytest.mark.parametrize("kind", ["kernel", "wrapped", "off"])
def test_built_in_samplers_are_marked_stateless_and_others_are_not(kind, monkeypatch):
    _nucleus(kind, monkeypatch)
    for sampling in FILTERS:
        sampler = _sampler(**{k: v for k, v in sampling.items() if k != "seed"})
        assert is_stateless(sampler) and is_stateless(seeded(sampler, 1)), sampling
        assert sampler(mx.array([[0.0] + [-1e9] * 63])).item() == 0  # and still a sampler
    greedy = build_sampler(make_host(), GenerationRequest(request_id="g", prompt_ids=(1,), max_tokens=1),
                           ModelInfo(model_id="m", path=".", model_type="x"))
    assert is_stateless(greedy) and is_stateless(None)

    def plugins(logprobs):
        return mx.argmax(logprobs, axis=-1)

    assert not is_stateless(plugins) and not is_stateless(seeded(plugins, 1))


@pytest.mark.parametrize("kind", ["kernel", "wrapped", "off"])
def test_top_p_min_p_and_top_k_requests_draft(kind, monkeypatch, mlxrt_tiny_checkpoint, mlxrt_serve):
    _nucleus(kind, monkeypatch)
    model = mlxrt_tiny_checkpoint("qwen3")
    http = mlxrt_serve(model, options={"draft_model": str(model), "num_draft_tokens": 3})
    client = openai_client(http)
    for sampling in FILTERS:
        reply = client.completions.create(model="m", prompt="Once upon a time", max_tokens=12, temperature=0.8,
                                          extra_body=sampling)
        assert reply.usage.completion_tokens > 0, sampling
    stats = http.get("/stats").json()
    if kind != "wrapped":  # the kernel's own filter, or none at all
        assert stats["quantized_kernel"]["active"] is (kind == "kernel"), stats["quantized_kernel"]
    spec = stats["engine"]["speculative"]
    assert spec["requests"] == len(FILTERS) and spec["requests_without_draft"] == 0, spec
    assert spec["tokens"] > 0
