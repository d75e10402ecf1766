"""The memory contract (pure arithmetic) and its measurement on a real tiny model."""

from __future__ import annotations

import pytest

from mlxrt.engine.memory import (
    MARGIN,
    MIN_SAFE_CONTEXT,
    KVCost,
    measure_kv,
    parse_size,
    plan_memory,
)
from mlxrt.errors import ModelLoadError


@pytest.mark.parametrize(("text", "expected"), [
    ("8GB", 8 * 10**9), ("1.5G", 1_500_000_000), ("512MiB", 512 * 2**20), ("2 gib", 2 * 2**30),
    ("1000", 1000), (4096, 4096),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_parse_size_default_unit_and_errors():
    assert parse_size("0.5", default_unit="GB") == 500_000_000
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")
    with pytest.raises(ValueError, match="not a size"):
        parse_size("3 parsecs")


def test_plan_splits_the_budget():
    kv = KVCost(per_token=1000, fixed=0)
    plan = plan_memory(100_000_000, kv, budget=1_000_000_000, prompt_cache_bytes=None)
    usable = int(1e9 * (1 - MARGIN)) - 100_000_000
    assert plan.prompt_cache_bytes == usable // 4
    assert plan.safe_context == (usable - usable // 4) // 1000
    explicit = plan_memory(100_000_000, kv, budget=1_000_000_000, prompt_cache_bytes=0)
    assert explicit.safe_context == usable // 1000
    # Fixed per-row state (sliding windows) is paid once per batch row.
    rows = plan_memory(100_000_000, KVCost(1000, 10_000_000), budget=1_000_000_000, prompt_cache_bytes=0, rows=4)
    assert rows.safe_context == (usable - 40_000_000) // 1000


def test_no_budget_refuses_nothing():
    plan = plan_memory(10**12, KVCost(10**6, 0), budget=None, prompt_cache_bytes=None)
    assert plan.safe_context is None and plan.prompt_cache_bytes == 2 * 1024**3


def test_a_budget_below_the_weights_is_refused_with_the_numbers():
    with pytest.raises(ModelLoadError) as info:
        plan_memory(2 * 10**9, KVCost(1000, 0), budget=2 * 10**9, prompt_cache_bytes=None)
    message = info.value.message
    assert "memory budget of 2.00 GB cannot serve this model" in message
    assert "weights take 2.00 GB" in message and f"at least {MIN_SAFE_CONTEXT} needed" in message


def test_measured_kv_cost_matches_the_config(mlxrt_tiny_checkpoint):
    import json

    import mlx_lm

    path = mlxrt_tiny_checkpoint("qwen3")
    config = json.loads((path / "config.json").read_text())
    model, _tok = mlx_lm.load(str(path))
    kv = measure_kv(model)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    expected = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4  # float32 K and V
    assert kv.per_token == expected and kv.fixed == 0


def test_seeded_sampler_depends_only_on_seed_and_step():
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    from mlxrt.engine.sampling import seeded

    logprobs = mx.log(mx.softmax(mx.random.normal((1, 64)), axis=-1))
    draws = lambda seed: [seeded(make_sampler(temp=1.0), seed)(logprobs).item() for _ in range(1)]  # noqa: E731
    a, b = seeded(make_sampler(temp=1.0), 7), seeded(make_sampler(temp=1.0), 7)
    first = [a(logprobs).item() for _ in range(20)]
    mx.random.seed(999)  # unrelated use of the global state in between changes nothing
    second = [b(logprobs).item() for _ in range(20)]
    assert first == second
    other = seeded(make_sampler(temp=1.0), 8)
    assert [other(logprobs).item() for _ in range(20)] != first
    assert draws(7) == first[:1]
