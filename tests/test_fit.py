"""The static memory contract (mlxrt.sources.fit) against what the engine measures at load."""

from __future__ import annotations

import json
import struct
import subprocess

import pytest
from support import MLXRT_BIN

from mlxrt.engine.memory import MARGIN, plan_memory
from mlxrt.sources.fit import assess, read_safetensors_header, static_kv, weights_summary


@pytest.mark.parametrize("model_type,dtype", [
    ("llama", "float32"), ("qwen3", "float32"), ("minicpm", "float32"),
    ("qwen3_5", "float32"), ("qwen3_5", "bfloat16"),      # linear attention: fixed state, f32 recurrent
    ("gemma4_text", "float32"), ("gemma4_text", "bfloat16"),  # sliding window + global head dim + KV sharing
])
def test_static_estimate_agrees_with_the_engine_measurement(tmp_path, model_type, dtype):
    from mlx_lm.utils import load_model

    from mlxrt.engine.memory import measure_kv, weight_bytes
    from mlxrt.testing import write_tiny_checkpoint

    folder = write_tiny_checkpoint(tmp_path / model_type, model_type, dtype=dtype)
    model, _ = load_model(folder)
    measured, loaded = measure_kv(model), weight_bytes(model)
    report = assess(folder, ctx=1024, budget=50 * 10**6)
    assert report.kv == measured
    assert report.weight_bytes == loaded
    # ...so the budget split is the engine's own: the same safe context
    plan = plan_memory(loaded, measured, budget=50 * 10**6, prompt_cache_bytes=None)
    assert report.safe_context == plan.safe_context and report.prompt_cache_bytes == plan.prompt_cache_bytes


def test_sliding_layers_are_capped_at_their_window(tiny_models):
    folder = tiny_models("gemma4_text")
    config = json.loads((folder / "config.json").read_text())
    kv = static_kv(config, 2)
    # one sliding and one full layer own caches (the other two share them)
    assert kv.fixed == 2 * 2 * 16 * 2 * config["sliding_window"]
    assert kv.per_token == 2 * 2 * 32 * 2
    short, long = assess(folder, ctx=100, budget=10**9), assess(folder, ctx=100_000, budget=10**9)
    assert long.kv_bytes - short.kv_bytes == (100_000 - 100) * long.kv.per_token


def test_gqa_heads_and_head_dim_set_the_per_token_cost():
    config = {"num_hidden_layers": 10, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    assert static_kv(config, 2).per_token == 10 * 2 * 8 * 128 * 2
    assert static_kv({**config, "head_dim": 64}, 2).per_token == 10 * 2 * 8 * 64 * 2
    assert static_kv({**config, "sliding_window": 4096, "sliding_window_pattern": 5}, 2).per_token == \
        2 * 2 * 8 * 128 * 2


def test_only_the_header_is_read(tmp_path, tiny_models):
    folder = tmp_path / "cut"
    folder.mkdir()
    src = tiny_models("qwen3")
    data = (src / "model.safetensors").read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    (folder / "model.safetensors").write_bytes(data[:8 + size])  # the tensors themselves are gone
    (folder / "config.json").write_bytes((src / "config.json").read_bytes())
    assert assess(folder, ctx=10, budget=10**9).weight_bytes == assess(src, ctx=10, budget=10**9).weight_bytes
    (folder / "model.safetensors").write_bytes(b"\x07")
    with pytest.raises(Exception, match="not a readable safetensors file"):
        read_safetensors_header(folder / "model.safetensors")


def _write_header(path, tensors):
    header = {}
    offset = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_quantized_weights_count_unpacked_parameters(tmp_path):
    # 4-bit, group 64: a 128×256 linear packs into 128×32 uint32 words with 128×4 scales
    _write_header(tmp_path / "model.safetensors", {
        "model.embed_tokens.weight": ("U32", [100, 8], 3200),
        "model.embed_tokens.scales": ("BF16", [100, 1], 200),
        "model.embed_tokens.biases": ("BF16", [100, 1], 200),
        "model.layers.0.mlp.up_proj.weight": ("U32", [128, 32], 128 * 32 * 4),
        "model.layers.0.mlp.up_proj.scales": ("BF16", [128, 4], 128 * 4 * 2),
        "model.layers.0.mlp.up_proj.biases": ("BF16", [128, 4], 128 * 4 * 2),
        "model.norm.weight": ("BF16", [64], 128),
        "model.visual.patch_embed.weight": ("BF16", [10], 20),
    })
    summary = weights_summary(tmp_path, {"quantization": {"bits": 4, "group_size": 64}})
    assert summary.params == 100 * 64 + 128 * 256 + 64
    assert summary.activation_dtype == "bfloat16"  # the embedding's scales
    assert summary.other_bytes == 20


def test_a_budget_that_cannot_hold_the_model_does_not_fit(tiny_models):
    report = assess(tiny_models("qwen3"), ctx=100, budget=10**5)
    assert not report.fits and report.max_safe_context == 0
    assert "cannot serve this model" in report.reason  # the engine's own refusal text
    over_window = assess(tiny_models("qwen3"), ctx=50_000, budget=10**12)
    assert not over_window.fits and "context window" in over_window.reason
    assert over_window.max_safe_context == 40960


def test_fit_command_json_and_text(tiny_models):
    folder = tiny_models("qwen3")
    out = subprocess.run([MLXRT_BIN, "fit", str(folder), "--ctx", "2048", "--memory-budget", "0.02", "--json"],
                         capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["fits"] is True and body["budget_bytes"] == 2 * 10**7 and body["kv_bytes_per_token"] == 512
    usable = int(2 * 10**7 * (1 - MARGIN)) - body["weight_bytes"]
    assert body["safe_context"] == (usable - usable // 4) // 512
    text = subprocess.run([MLXRT_BIN, "fit", str(folder), "--ctx", "10000000", "--memory-budget", "20MB"],
                          capture_output=True, text=True, cwd="/")
    assert text.returncode == 0 and "fits             no" in text.stdout
    bad = subprocess.run([MLXRT_BIN, "fit", str(folder), "--memory-budget", "lots"], capture_output=True,
                         text=True, cwd="/")
    assert bad.returncode == 2 and "not a size" in bad.stderr
