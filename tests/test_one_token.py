"""mlxrt.engine.one_token: mlx-lm's attention layers without a decode step's layout ops give
mlx-lm's bits, step after step (plain, rotating and left-padded batch caches), leave prefill to
mlx-lm's own forward, and keep the model's parameter paths."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from support import primitive_counts, tiny_mlx_lm_model

from mlxrt.engine import one_token


def _tiny(model_type: str) -> nn.Module:
    return tiny_mlx_lm_model(model_type, vocab_size=128, seed=3)


def _decode(model: nn.Module, cache: list, tokens: mx.array, n: int) -> tuple[list[np.ndarray], Counter]:
    """Each step's logits (the prompt's first) over ``n`` greedy steps, and a decode step's ops."""
    out, ops = [], Counter()
    for _ in range(n + 1):
        logits = model(tokens, cache=cache)[:, -1, :]
        ops = primitive_counts(logits)
        out.append(np.array(logits))
        tokens = mx.argmax(logits, axis=-1)[:, None]
    return out, ops


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "gemma3_text"])
def test_one_token_attention_gives_mlx_lm_s_bits_without_its_transposes(model_type):
    from mlx_lm.models.cache import make_prompt_cache

    model = _tiny(model_type)
    paths = [k for k, _ in tree_flatten(model.parameters())]
    prompt = mx.array([[5, 9, 17, 3, 44, 2]])
    before, ops_before = _decode(model, make_prompt_cache(model), prompt, 6)
    assert one_token.install(model) == 2
    assert {type(m).__name__ for _, m in model.named_modules()} >= {"OneTokenAttention"}
    assert [k for k, _ in tree_flatten(model.parameters())] == paths
    after, ops_after = _decode(model, make_prompt_cache(model), prompt, 6)
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    # four transposes a layer fewer, nothing else changed
    assert ops_before - ops_after == Counter(Transpose=8) and not ops_after - ops_before
    assert one_token.install(model) == 0  # nothing left to swap


def test_a_left_padded_batch_decodes_the_same_tokens():
    from mlx_lm.models.cache import BatchKVCache

    model = _tiny("llama")
    prompts = [[3, 4, 5, 6, 7], [40, 41], [9, 8, 7, 6]]
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    tokens = mx.array([[0] * pad + p for pad, p in zip(pads, prompts, strict=True)])
    before, _ = _decode(model, [BatchKVCache(pads) for _ in model.layers], tokens, 5)
    one_token.install(model)
    after, _ = _decode(model, [BatchKVCache(pads) for _ in model.layers], tokens, 5)
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def test_an_architecture_not_known_is_left_as_it_is():
    from mlx_lm.models import phi3

    args = phi3.ModelArgs(model_type="phi3", hidden_size=64, num_hidden_layers=1, intermediate_size=128,
                          num_attention_heads=4, rms_norm_eps=1e-5, vocab_size=128, num_key_value_heads=2)
    assert one_token.install(phi3.Model(args)) == 0
