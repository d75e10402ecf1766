"""The static memory contract (mlxrt.loading.fit) against what the engine measures at load."""

from __future__ import annotations

import json
import os
import struct
import subprocess

import pytest
from support import MLXRT_BIN

from mlxrt.engine.memory import MARGIN, plan_memory
from mlxrt.loading import blas
from mlxrt.loading.dtype_choice import Machine
from mlxrt.loading.fit import assess
from mlxrt.loading.sizes import read_safetensors_header, static_kv, weights_summary

FAST = Machine(on_cpu=True, blas_fast=True, blas_name="OpenBLAS")
BUNDLED = Machine(on_cpu=True, blas_fast=False, blas_name="bundled")


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
    report = assess(folder, ctx=1024, budget=50 * 10**6, dtype="stored")  # as mlx-lm loaded it, uncast
    assert report.kv == measured
    assert report.weight_bytes == loaded
    # ...so the budget split is the engine's own: the same safe context
    plan = plan_memory(loaded, measured, budget=50 * 10**6, prompt_cache_bytes=None)
    assert report.safe_context == plan.safe_context and report.prompt_cache_bytes == plan.prompt_cache_bytes


def test_sliding_layers_are_capped_at_their_window(mlxrt_tiny_checkpoint):
    folder = mlxrt_tiny_checkpoint("gemma4_text")
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


def test_only_the_header_is_read(tmp_path, mlxrt_tiny_checkpoint):
    folder = tmp_path / "cut"
    folder.mkdir()
    src = mlxrt_tiny_checkpoint("qwen3")
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


def test_a_budget_that_cannot_hold_the_model_does_not_fit(mlxrt_tiny_checkpoint):
    report = assess(mlxrt_tiny_checkpoint("qwen3"), ctx=100, budget=10**5)
    assert not report.fits and report.max_safe_context == 0
    assert "cannot serve this model" in report.reason  # the engine's own refusal text
    over_window = assess(mlxrt_tiny_checkpoint("qwen3"), ctx=50_000, budget=10**12)
    assert not over_window.fits and "context window" in over_window.reason
    assert over_window.max_safe_context == 40960


def test_fit_command_json_and_text(mlxrt_tiny_checkpoint):
    folder = mlxrt_tiny_checkpoint("qwen3")
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


# --- the dtype `mlxrt serve` would serve (--dtype, default auto) ---------------------------------


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    from mlxrt.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("bf16") / "qwen3-bf16", "qwen3", dtype="bfloat16")


@pytest.fixture(scope="module")
def q4(tmp_path_factory, bf16):
    """The bf16 checkpoint quantized to 4 bits, group 32, as mlx-lm saves one."""
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    folder = tmp_path_factory.mktemp("q4") / "qwen3-q4"
    model, config = load_model(bf16)
    model, config = quantize_model(model, config, group_size=32, bits=4)
    save_model(folder, model)
    save_config(config, folder / "config.json")
    return folder


@pytest.mark.parametrize("blas_status,served", [
    (blas.BlasStatus("openblas", path="/usr/lib/libopenblas.so.0"), "float32"),
    (blas.BlasStatus("bundled", reason="MLXRT_BLAS=bundled"), "bfloat16"),
])
def test_auto_assesses_a_bf16_checkpoint_as_serve_would_serve_it(bf16, monkeypatch, blas_status, served):
    # the machine's BLAS, as an mlxrt command would find it, decides (mlx runs on the CPU here)
    monkeypatch.setattr(blas, "expected", lambda environ=None: blas_status)
    stored = assess(bf16, ctx=1024, budget=10**8, dtype="stored")
    report = assess(bf16, ctx=1024, budget=10**8)
    assert (report.dtype.requested, report.dtype.stored, report.dtype.served) == ("auto", "bfloat16", served)
    width = 2 if served == "float32" else 1  # bf16 → float32: twice the weights, twice the KV
    assert report.weight_bytes == width * stored.weight_bytes == width * 2 * report.params
    assert report.kv.per_token == width * stored.kv.per_token and report.kv_dtype == served
    assert report.stored_weight_bytes == stored.weight_bytes
    assert (report.safe_context < stored.safe_context) == (served == "float32")
    body = report.describe()
    assert body["dtype"]["served"] == served and body["dtype"]["reason"] == report.dtype.reason
    assert report.dtype.reason.startswith("auto: CPU with OpenBLAS;" if served == "float32" else
                                          "auto keeps the stored dtype: no fast BLAS (bundled)")


def test_stored_gpu_and_tight_budgets_keep_the_stored_figures(bf16, q4):
    stored = assess(bf16, ctx=1024, budget=10**8, dtype="stored", machine=FAST)
    assert stored.dtype.reason == "--dtype stored" and stored.weight_bytes == 2 * stored.params
    assert stored.kv_dtype == "bfloat16" and stored.stored_weight_bytes == stored.weight_bytes
    gpu = assess(bf16, ctx=1024, budget=10**8, machine=Machine(on_cpu=False, blas_fast=True, blas_name="MKL"))
    assert gpu.dtype.reason == "auto keeps the stored dtype on a GPU" and gpu.weight_bytes == stored.weight_bytes
    # float32 weights + KV for 8192 tokens (512 B each) do not fit 3 MB: auto keeps bf16
    tight = assess(bf16, ctx=100, budget=3 * 10**6, machine=FAST)
    assert tight.dtype.served == "bfloat16" and "exceed" in tight.dtype.reason
    assert tight.weight_bytes == stored.weight_bytes
    half = assess(q4, ctx=100, budget=10**8, dtype="float16", machine=BUNDLED)  # explicit: cast as asked
    assert half.dtype.stored == "quantized 4-bit" and half.dtype.reason == "--dtype float16"
    assert half.weight_bytes == 2 * half.params and half.kv_dtype == "float16"
    q4_stored = assess(q4, ctx=100, budget=10**8, machine=BUNDLED)
    assert q4_stored.weight_bytes < half.weight_bytes and q4_stored.weight_bytes == q4_stored.stored_weight_bytes


@pytest.mark.parametrize("requested", ["auto", "stored", "float16"])
@pytest.mark.parametrize("machine,budget", [(FAST, 10**8), (FAST, 3 * 10**6), (BUNDLED, 10**8),
                                            (Machine(on_cpu=False, blas_fast=True, blas_name="MKL"), 10**8)])
@pytest.mark.parametrize("checkpoint", ["bf16", "q4"])
def test_the_static_rule_and_the_load_time_choice_agree(request, checkpoint, machine, budget, requested):
    from mlx_lm.utils import load_model

    from mlxrt.engine.memory import weight_bytes
    from mlxrt.loading import cast_weights
    from mlxrt.loading.dtype_choice import choose_dtype
    from mlxrt.records import ModelInfo

    folder = request.getfixturevalue(checkpoint)
    model, config = load_model(folder)
    info = ModelInfo(model_id="m", path=folder, model_type=config["model_type"], config=config)
    loaded = choose_dtype(requested, model, info, budget=budget, blas_fast=machine.blas_fast,
                          blas_name=machine.blas_name, on_cpu=machine.on_cpu)
    static = assess(folder, ctx=100, budget=budget, dtype=requested, machine=machine)
    assert static.dtype == loaded  # the same requested, stored, served dtype and reason, word for word
    if loaded.cast:
        cast_weights(model, loaded.cast)
    assert static.weight_bytes == weight_bytes(model)  # what the engine will measure once served


def test_fit_command_shows_the_served_dtype(bf16):
    env = {**os.environ, "MLXRT_BLAS": "bundled"}
    out = subprocess.run([MLXRT_BIN, "fit", str(bf16), "--ctx", "1000", "--json"], capture_output=True, text=True,
                         cwd="/", env=env)
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["dtype"]["requested"] == "auto" and body["dtype"]["served"] == "bfloat16"
    assert "no fast BLAS (bundled)" in body["dtype"]["reason"] and body["weight_bytes"] == 2 * body["params"]
    cast = subprocess.run([MLXRT_BIN, "fit", str(bf16), "--ctx", "1000", "--dtype", "float32"],
                          capture_output=True, text=True, cwd="/", env=env)
    assert cast.returncode == 0, cast.stderr
    assert "dtype            float32 (--dtype float32)" in cast.stdout
    assert f"({body['params'] // 1000}" in cast.stdout and "as stored)" in cast.stdout
    assert "KV per token     512 bytes (float32)" in cast.stdout
    bad = subprocess.run([MLXRT_BIN, "fit", str(bf16), "--dtype", "int8"], capture_output=True, text=True, cwd="/")
    assert bad.returncode == 2 and "int8" in bad.stderr


@pytest.mark.skipif(blas.find_system_blas(environ={}) is None and blas.find_mkl() is None,
                    reason="no system OpenBLAS and no MKL (pip install 'mlxrt[mkl]')")
def test_fit_command_auto_takes_float32_with_the_fast_blas_serve_would_load(bf16):
    out = subprocess.run([MLXRT_BIN, "fit", str(bf16), "--ctx", "1000"], capture_output=True, text=True, cwd="/",
                         env={k: v for k, v in os.environ.items() if not k.startswith("MLXRT_")})
    assert out.returncode == 0, out.stderr
    assert "dtype            float32 (auto: CPU with " in out.stdout and "KV per token     512 bytes (float32)" in out.stdout


def test_fit_route_assesses_the_dtype_this_server_serves(bf16, mlxrt_serve, monkeypatch):
    # this server's BLAS is fast: its engine casts the bf16 weights to float32, and /fit says so
    monkeypatch.setattr(blas, "current", lambda: blas.BlasStatus("mkl", path="/x/libmkl_rt.so.2", threading="SEQUENTIAL"))
    client = mlxrt_serve(bf16, options={"memory_budget": 0.1})
    served = client.get("/fit", params={"ctx": 1000}).json()
    assert served["dtype"]["served"] == "float32" and served["dtype"]["reason"].startswith("auto: CPU with MKL;")
    assert served["weight_bytes"] == served["measured"]["weight_bytes"] == 2 * served["stored_weight_bytes"]
    assert served["kv_bytes_per_token"] == served["measured"]["kv_bytes_per_token"]
    assert served["safe_context"] == served["measured"]["safe_context"]
    stored = client.get("/fit", params={"ctx": 1000, "dtype": "stored"}).json()
    assert stored["dtype"]["served"] == "bfloat16" and stored["weight_bytes"] == served["stored_weight_bytes"]
    assert stored["kv_bytes_per_token"] * 2 == served["kv_bytes_per_token"]
    bad = client.get("/fit", params={"dtype": "int8"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "dtype" and "int8" in bad.json()["error"]["message"]
