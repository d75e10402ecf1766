"""Quantized KV caches through the HTTP API: greedy output equals mlx-lm's with the same
KV quantization; a model folder's kv_config.json applies unless --kv-quant off; quantized-KV
servers run every request in the serial lane."""

from __future__ import annotations

import json
import shutil

import pytest

from mlxrt.engine.kv_quant import KVScheme, resolve_kv_scheme
from mlxrt.errors import ModelLoadError

PROMPT = "the quick brown fox jumps over the lazy dog and then"


def _text(client, prompt: str = PROMPT, max_tokens: int = 24) -> str:
    resp = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["text"]


def _mlx_lm_text(model, prompt: str = PROMPT, max_tokens: int = 24, **kv) -> str:
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.generate import generate_step

    m, tok = mlx_lm.load(str(model))
    eos = set(tok.eos_token_ids)
    ids = []
    for token, _ in generate_step(mx.array(tok.encode(prompt)), m, max_tokens=max_tokens, **kv):
        if int(token) in eos:
            break
        ids.append(int(token))
    return tok.decode(ids, skip_special_tokens=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from mlxrt.testing import write_tiny_checkpoint

    # MLX quantizes the head dim in groups of 32/64/128: the default tiny qwen3 (head dim 16)
    # cannot take it, so this one has 2 heads of 64 (q/k/v projections grow accordingly).
    return write_tiny_checkpoint(tmp_path_factory.mktemp("kvq") / "qwen3", "qwen3",
                                 config_overrides={"head_dim": 64, "num_attention_heads": 2,
                                                   "num_key_value_heads": 1})


def test_a_group_size_the_head_dim_cannot_take_is_refused_at_load(tmp_path, mlxrt_serve):
    from mlxrt.testing import write_tiny_checkpoint

    narrow = write_tiny_checkpoint(tmp_path / "narrow", "qwen3")  # head dim 16
    with pytest.raises(ModelLoadError, match="head dim 16.*cannot be quantized"):
        mlxrt_serve(narrow, options={"kv_quant": "8"})


def test_kv8_and_kv_bits_match_mlx_lm_with_the_same_quantization(model, mlxrt_serve):
    kv8 = mlxrt_serve(model, options={"kv_quant": "8", "batch": 4})
    stats = kv8.get("/stats").json()["engine"]
    assert stats["lane"] == "serial" and stats["kv_quant"]["bits"] == 8
    expected = _mlx_lm_text(model, kv_bits=8, kv_group_size=64, quantized_kv_start=0)
    assert _text(kv8) == expected
    assert _text(kv8) == expected  # again, from the prompt cache's (quantized) entry
    assert kv8.get("/stats").json()["engine"]["prompt_cache"]["hits"] >= 1
    kv4 = mlxrt_serve(model, options={"kv_bits": 4, "quantized_kv_start": 8})
    assert _text(kv4) == _mlx_lm_text(model, kv_bits=4, kv_group_size=64, quantized_kv_start=8)
    assert _text(kv4) != _text(mlxrt_serve(model))  # 4-bit keys do change this tiny model's output


def test_kv_config_applies_per_layer_unless_kv_quant_off(model, mlxrt_serve, tmp_path):
    folder = tmp_path / "with-config"
    shutil.copytree(model, folder)
    (folder / "kv_config.json").write_text(json.dumps(
        [{"layer_idx": 0, "bits": 8, "group_size": 64}, {"layer_idx": 1, "bits": 8, "group_size": 64}]))
    configured = mlxrt_serve(folder)
    described = configured.get("/stats").json()["engine"]["kv_quant"]
    assert described["source"] == "kv_config.json" and set(described["layers"]) == {"0", "1"}
    assert _text(configured) == _mlx_lm_text(model, kv_bits=8, quantized_kv_start=0)
    off = mlxrt_serve(folder, options={"kv_quant": "off"})
    assert off.get("/stats").json()["engine"]["kv_quant"] is None
    assert _text(off) == _mlx_lm_text(model)


def test_scheme_resolution_and_bad_configs(tmp_path):
    assert resolve_kv_scheme(kv_quant=None, kv_bits=None, kv_group_size=64, quantized_kv_start=None,
                             model_path=tmp_path) is None
    scheme = resolve_kv_scheme(kv_quant=None, kv_bits=8, kv_group_size=32, quantized_kv_start=None,
                               model_path=tmp_path)
    assert scheme == KVScheme(bits=8, group_size=32, start=5000, source="--kv-bits 8")
    (tmp_path / "kv_config.json").write_text('{"full_attention": 4, "sliding_window": {"bits": 8}}')
    kinds = resolve_kv_scheme(kv_quant=None, kv_bits=None, kv_group_size=64, quantized_kv_start=None,
                              model_path=tmp_path)
    assert kinds.kinds == {"full_attention": (4, 64), "sliding_window": (8, 64)}
    (tmp_path / "kv_config.json").write_text('[{"layer_idx": 0, "bits": 7}]')
    with pytest.raises(ModelLoadError, match="bits must be one of"):
        resolve_kv_scheme(kv_quant=None, kv_bits=None, kv_group_size=64, quantized_kv_start=None,
                          model_path=tmp_path)
    assert resolve_kv_scheme(kv_quant="off", kv_bits=None, kv_group_size=64, quantized_kv_start=None,
                             model_path=tmp_path) is None
