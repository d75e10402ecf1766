"""``--dtype auto``: float32 on a CPU with a fast BLAS when it fits the budget, else the stored
dtype; explicit values as asked; what /stats and the start-up line say."""

from __future__ import annotations

import httpx
import mlx.core as mx
import mlx.nn as nn
import pytest

from mlxrt.loading import blas
from mlxrt.loading.dtype_choice import choose_dtype, float32_bytes, stored_dtype
from mlxrt.records import ModelInfo
from mlxrt.testing import write_tiny_checkpoint

FAST_BLAS = blas.find_system_blas(environ={}) is not None or blas.find_mkl() is not None
needs_fast_blas = pytest.mark.skipif(not FAST_BLAS, reason="no system OpenBLAS and no MKL (pip install 'mlxrt[mkl]')")

CONFIG = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
          "max_position_embeddings": 4096}
INFO = ModelInfo(model_id="m", path=None, model_type="llama", config=CONFIG)
# KV at float32 for 4096 tokens: 2 layers × 2 (K, V) × 2 heads × 16 dims × 4 bytes × 4096
KV_BYTES = 2 * 2 * 2 * 16 * 4 * 4096


def _quantized_model() -> nn.Module:
    model = nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 128), nn.Linear(128, 256))
    nn.quantize(model, group_size=32, bits=4)
    return model


def _choose(model, requested="auto", *, budget=10**9, fast=True, on_cpu=True, lazy=False):
    return choose_dtype(requested, model, INFO, budget=budget, blas_fast=fast, blas_name="MKL" if fast else "bundled",
                        on_cpu=on_cpu, lazy=lazy)


def test_stored_dtype_and_float32_size_of_a_quantized_model():
    model = _quantized_model()
    assert stored_dtype(model) == "quantized 4-bit"
    params = 256 * 64 + (64 * 128 + 128) + (128 * 256 + 256)
    assert float32_bytes(model) == 4 * params
    plain = nn.Linear(8, 4)
    plain.set_dtype(mx.bfloat16)
    assert stored_dtype(plain) == "bfloat16" and float32_bytes(plain) == 4 * (8 * 4 + 4)


def test_auto_casts_to_float32_on_a_cpu_with_a_fast_blas_when_it_fits():
    model = _quantized_model()
    need = float32_bytes(model) + KV_BYTES
    choice = _choose(model, budget=int(need / 0.9) + 1000)
    assert (choice.cast, choice.served, choice.stored) == ("float32", "float32", "quantized 4-bit")
    assert choice.reason.startswith("auto: CPU with MKL;") and "KV for 4096 tokens" in choice.reason
    tight = _choose(model, budget=int(need / 0.9) - 1000)
    assert tight.cast is None and tight.served == "quantized 4-bit"
    assert "exceed" in tight.reason and "(--memory-budget)" in tight.reason
    # --max-models shares the budget: each model gets its part
    shared = choose_dtype("auto", model, INFO, budget=int(need / 0.9) + 1000, blas_fast=True, blas_name="MKL",
                          on_cpu=True, models=2)
    assert shared.cast is None and "(--memory-budget / --max-models 2)" in shared.reason


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"fast": False}, "auto keeps the stored dtype: no fast BLAS (bundled), float32 would be no faster"),
    ({"on_cpu": False}, "auto keeps the stored dtype on a GPU"),
    ({"lazy": True}, "auto keeps the stored dtype: --distributed loads the weights lazily"),
])
def test_auto_keeps_the_stored_dtype(kwargs, reason):
    choice = _choose(_quantized_model(), **kwargs)
    assert choice.cast is None and choice.reason == reason


def test_auto_leaves_a_float32_checkpoint_and_explicit_values_win():
    assert _choose(nn.Linear(8, 4)).reason == "auto: stored as float32"
    model = _quantized_model()
    assert _choose(model, "float16", fast=False).cast == "float16"
    assert _choose(model, "float32", on_cpu=False).reason == "--dtype float32"
    assert _choose(model, "stored").cast is None and _choose(model, "stored").reason == "--dtype stored"


def test_auto_without_a_budget_uses_a_share_of_ram(monkeypatch):
    from mlxrt.loading import sizes
    monkeypatch.setattr(sizes, "machine_budget", lambda: 10**12)
    assert "(a share of RAM)" in _choose(_quantized_model(), budget=None).reason
    monkeypatch.setattr(sizes, "machine_budget", lambda: 1000)
    assert _choose(_quantized_model(), budget=None).cast is None


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("bf16") / "qwen3", "qwen3", dtype="bfloat16")


def _stats_and_answer(server) -> tuple[dict, dict]:
    stats = httpx.get(f"{server.url}/stats", timeout=30).json()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return stats, reply.json()


def test_auto_keeps_bfloat16_on_the_bundled_blas(bf16_model, server_process):
    server = server_process([str(bf16_model)], env={"MLXRT_BLAS": "bundled"})
    stats, _ = _stats_and_answer(server)
    assert stats["dtype"]["served"] == "bfloat16" and stats["dtype"]["requested"] == "auto"
    assert "no fast BLAS" in stats["dtype"]["reason"]
    assert "dtype: bfloat16 (auto keeps the stored dtype: no fast BLAS" in server.stop()


@needs_fast_blas
def test_auto_serves_float32_on_a_fast_blas_unless_the_budget_is_too_small(bf16_model, server_process):
    server = server_process([str(bf16_model)])
    stats, _ = _stats_and_answer(server)
    assert stats["blas"]["active"] in ("openblas", "mkl")
    assert (stats["dtype"]["served"], stats["dtype"]["stored"]) == ("float32", "bfloat16")
    assert "dtype: float32 (auto: CPU with" in server.stop()
    # 4 MB: the bf16 weights and some context fit, the float32 weights + KV for the default context do not
    small = server_process([str(bf16_model), "--memory-budget", "0.004"])
    stats, _ = _stats_and_answer(small)
    assert stats["dtype"]["served"] == "bfloat16" and "exceed" in stats["dtype"]["reason"]
    explicit = server_process([str(bf16_model), "--dtype", "stored"])
    assert _stats_and_answer(explicit)[0]["dtype"]["reason"] == "--dtype stored"
