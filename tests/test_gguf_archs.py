"""Every GGUF architecture and quantization type the converter knows, on tiny files written by
llama.cpp's ``gguf`` package (tests/gguf_files.py): the converted folder, loaded by mlx-lm, must
give the logits of the same weights held in floating point (the values gguf itself decodes).

Lossless types (affine groups of 32) must match within float tolerance; re-quantized types
(groups of 16: Q2_K/Q3_K/Q6_K) within one step of the MLX grid they become (mx.quantize rounds to
nearest on a grid it shifts so that 0 is exact), the bound docs/models.md states.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf_files import CONFIGS, logits, write_tiny

from mlxrt.loading.gguf_quant import LAYOUTS

# a mix of lossless types, so each architecture's names, layouts and per-module bits are proven
MIXED = {"token_embd": "Q8_0", "output": "Q5_K", "attn_q": "Q4_K", "attn_k": "Q5_0", "attn_v": "Q8_0",
         "attn_qkv": "Q4_K", "attn_output": "Q4_1", "ffn_gate": "Q5_K", "ffn_up": "Q4_0", "ffn_down": "Q5_1",
         "ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q5_K", "ffn_down_exps": "IQ4_NL"}


def _convert(tmp_path, arch, types, seed=0, kernel=False):
    from mlx_lm import load

    from mlxrt.loading.gguf import convert_gguf

    src = tmp_path / f"{arch}.gguf"
    ref = write_tiny(src, arch, types, seed=seed)
    out = convert_gguf(src, tmp_path / f"{arch}-hf", dtype="float32", kernel=kernel)
    model, _ = load(str(out))
    return ref, model, json.loads((out / "config.json").read_text())


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_architecture_logits_match(tmp_path, arch):
    ref, model, cfg = _convert(tmp_path, arch, MIXED)
    assert cfg["model_type"] == CONFIGS[arch]["model_type"]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"):
        assert cfg[key] == CONFIGS[arch][key], key
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "sliding_window", "num_experts",
                "num_experts_per_tok", "moe_intermediate_size", "query_pre_attn_scalar"):
        if key in CONFIGS[arch]:
            assert cfg[key] == CONFIGS[arch][key], key
    assert cfg["tie_word_embeddings"] is CONFIGS[arch].get("tie_word_embeddings", True)
    assert cfg["quantization"]["group_size"] == 32
    want, got = logits(ref), logits(model)
    assert np.abs(want).max() > 0.5
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=0)


def test_llama_qk_rows_are_put_back(tmp_path):
    """A wrong un-permutation changes the logits: the reference is not permutation-blind."""
    ref, model, _ = _convert(tmp_path, "llama", "F32")
    q_ref = np.array(ref.model.layers[1].self_attn.q_proj.weight)
    np.testing.assert_array_equal(np.array(model.model.layers[1].self_attn.q_proj.weight), q_ref)
    model.model.layers[1].self_attn.q_proj.weight = model.model.layers[1].self_attn.q_proj.weight[::-1]
    assert np.abs(logits(model) - logits(ref)).max() > 1e-3


def test_gemma_norms_lose_the_stored_plus_one(tmp_path):
    ref, model, _ = _convert(tmp_path, "gemma3", "F32")
    got = np.array(model.model.layers[0].input_layernorm.weight)
    np.testing.assert_array_equal(got, np.array(ref.model.layers[0].input_layernorm.weight))
    assert np.abs(got).mean() < 0.5  # near 0 (x * (1 + w)), not near 1 as stored


@pytest.mark.parametrize("type_name", ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                                       "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"])
def test_each_quantization_type(tmp_path, type_name):
    import mlx.core as mx

    ref, model, cfg = _convert(tmp_path, "llama", type_name, seed=3)
    layout = LAYOUTS[type_name]
    proj = model.model.layers[0].mlp.down_proj
    want_w = np.array(ref.model.layers[0].mlp.down_proj.weight)
    if layout.bits is None:
        assert "quantization" not in cfg
        np.testing.assert_array_equal(np.array(proj.weight), want_w)
    else:
        assert (proj.bits, proj.group_size) == (layout.bits, 32)
        got_w = np.array(mx.dequantize(proj.weight, proj.scales, proj.biases, group_size=32, bits=proj.bits))
        err = np.abs(got_w - want_w)
        if layout.lossless and type_name != "IQ4_XS":  # the very values gguf decodes
            np.testing.assert_array_equal(got_w, want_w)
        elif layout.lossless:  # s·(k+128) − 128·s: s·(k+128) can need 25 bits, one float32 rounding
            assert err.max() <= 2**-23 * np.abs(want_w).max()
        else:  # mx.quantize's grid (shifted so that 0 is exact): within one step of each group
            step = np.repeat(np.abs(np.array(proj.scales)), 32, axis=-1)
            assert (err <= step * (1 + 1e-5) + 1e-7).all()
            assert err.max() > 0  # re-quantized: not silently exact
    want, got = logits(ref), logits(model)
    bound = 2e-4 if layout.lossless else 0.05
    np.testing.assert_allclose(got, want, atol=bound * np.abs(want).max(), rtol=0)


def test_layouts_the_kernel_does_not_cover_fall_back(tmp_path):
    """mlxrt-qmv takes the widths it lists (``BITS``: 4 and 8 everywhere; 3, 5 and 6 too with its
    AVX-512 and portable 8-bit kernels); the others a Q4_K_M file brings stay MLX's."""
    from mlxrt.engine import qmv

    st = qmv.load()
    if not st.active:
        pytest.skip(f"mlxrt-qmv is not loaded: {st.text}")
    types = {"token_embd": "Q8_0", "output": "Q6_K", "attn_q": "Q4_K", "attn_k": "Q5_0", "attn_v": "Q5_K",
             "attn_output": "Q4_K", "ffn_gate": "Q5_1", "ffn_up": "Q4_K", "ffn_down": "Q6_K"}
    ref, model, _ = _convert(tmp_path, "llama", types, seed=5)
    import mlx.nn as nn

    before = logits(model)
    quantized = [m for _, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    assert sorted({m.bits for m in quantized}) == [4, 5, 8]
    widths = st.module.BITS
    assert 4 in widths and 8 in widths
    assert qmv.install(model, st) == sum(m.bits in widths for m in quantized)
    # the kernel's layers are new objects in the model (Module.update_modules): look again
    quantized = [m for _, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    for m in quantized:
        assert (type(m) in (nn.QuantizedLinear, nn.QuantizedEmbedding)) is (m.bits not in widths)
    after = logits(model)
    if "int8" in st.kernel or "vnni" in st.kernel:
        # the default kernels round activations to 8 bits per block of 32 (docs/performance.md,
        # "8-bit activations": +0.3-1.2 % perplexity on SmolLM2); random weights amplify it
        assert np.sqrt(np.mean((after - before) ** 2) / np.mean(before**2)) < 0.05
    else:  # the exact kernels sum in another order: equal to float rounding, not bit for bit
        np.testing.assert_allclose(after, before, atol=1e-3 * np.abs(before).max(), rtol=0)


def test_conversion_writes_shards_as_they_fill(tmp_path, monkeypatch):
    """Converting holds one shard of converted weights at a time; mlx-lm loads every shard."""
    from mlxrt.loading import gguf

    monkeypatch.setattr(gguf, "SHARD_BYTES", 200_000)
    ref, model, _ = _convert(tmp_path, "qwen3", MIXED)
    shards = sorted(p.name for p in (tmp_path / "qwen3-hf").glob("*.safetensors"))
    assert len(shards) > 3 and shards[0] == "model-00002.safetensors" and "model.safetensors" in shards
    want = logits(ref)
    np.testing.assert_allclose(logits(model), want, atol=2e-4 * np.abs(want).max(), rtol=0)


def test_kernel_widths_widen_to_8_bits(tmp_path):
    """With the CPU kernel, 5- and 6-bit layouts become 8-bit: the lossless ones still exact."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlxrt.engine import qmv
    from mlxrt.loading.gguf_quant import KERNEL_BITS, served_layout

    types = {"token_embd": "Q8_0", "output": "Q2_K", "attn_q": "Q5_0", "attn_k": "Q5_1", "attn_v": "Q5_K",
             "attn_output": "Q4_K", "ffn_gate": "Q3_K", "ffn_up": "Q4_1", "ffn_down": "Q6_K"}
    ref, model, cfg = _convert(tmp_path, "llama", types, seed=7, kernel=True)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    assert {m.bits for m in layers.values()} == set(KERNEL_BITS)
    assert all(qmv.eligible(m) for m in layers.values())
    for name in ("q_proj", "k_proj", "v_proj"):  # Q5_0/Q5_1/Q5_K at 8 bits: gguf's values exactly
        got, want = getattr(model.model.layers[0].self_attn, name), getattr(ref.model.layers[0].self_attn, name)
        w = mx.dequantize(got.weight, got.scales, got.biases, group_size=32, bits=8)
        np.testing.assert_array_equal(np.array(w), np.array(want.weight))
    assert served_layout("Q5_0", KERNEL_BITS).lossless and not served_layout("Q3_K", KERNEL_BITS).lossless
    assert served_layout("Q5_0", None).bits == 5
    want = logits(ref)
    np.testing.assert_allclose(logits(model), want, atol=0.05 * np.abs(want).max(), rtol=0)


#: What a kernel that unpacks 3-, 5- and 6-bit rows in registers reports (mlxrt_qmv.FAST_BITS on
#: AVX-512 with VBMI).
PACKED = (3, 4, 5, 6, 8)


def test_lossless_5_bit_layers_stay_5_bits_where_the_kernel_computes_them_fast(tmp_path):
    """Q5_0/Q5_1/Q5_K stay 5 bits, gguf's values exactly, for a kernel whose 5-bit product is
    fast; the re-quantized types are 8 bits as for any kernel. The folder is plain MLX 5-bit
    layers (it loads without the kernel), and with the kernel installed its logits are the widened
    conversion's bit for bit: the kernel's 5-bit products are its 8-bit ones."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlxrt.engine import qmv
    from mlxrt.loading.gguf_quant import served_layout

    types = {"token_embd": "Q8_0", "output": "Q2_K", "attn_q": "Q5_0", "attn_k": "Q5_1", "attn_v": "Q5_K",
             "attn_output": "Q4_K", "ffn_gate": "Q3_K", "ffn_up": "Q4_1", "ffn_down": "Q6_K"}
    ref, model, _ = _convert(tmp_path, "llama", types, seed=7, kernel=PACKED)
    marker = json.loads((tmp_path / "llama-hf" / "mlxrt_gguf.json").read_text())
    assert marker["kernel_widths"] == list(PACKED) and marker["layouts"]["Q5_0"] == {"bits": 5, "lossless": True}
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert [attn.q_proj.bits, attn.k_proj.bits, attn.v_proj.bits] == [5, 5, 5]
    assert [mlp.gate_proj.bits, mlp.up_proj.bits, mlp.down_proj.bits, model.lm_head.bits] == [8, 4, 8, 8]
    for name in ("q_proj", "k_proj", "v_proj"):
        got, want = getattr(attn, name), getattr(ref.model.layers[0].self_attn, name)
        w = mx.dequantize(got.weight, got.scales, got.biases, group_size=32, bits=5)
        np.testing.assert_array_equal(np.array(w), np.array(want.weight))
    assert served_layout("Q5_K", PACKED).bits == 5 and served_layout("Q3_K", PACKED).bits == 8
    assert served_layout("IQ3_S", PACKED).bits == 8 and served_layout("Q4_0", PACKED).bits == 4
    want = logits(ref)
    np.testing.assert_allclose(logits(model), want, atol=0.05 * np.abs(want).max(), rtol=0)

    st = qmv.load()
    if not st.active or 5 not in st.module.BITS:
        return
    (tmp_path / "widened").mkdir()
    _, widened, _ = _convert(tmp_path / "widened", "llama", types, seed=7, kernel=True)
    for m in (model, widened):
        assert qmv.install(m) == sum(isinstance(x, (nn.QuantizedLinear, nn.QuantizedEmbedding))
                                     for _, x in m.named_modules())
    np.testing.assert_array_equal(logits(model), logits(widened))  # a prompt's rows: the band loops
    for ids in ([5], [17]):  # one row: the lone row's loops
        np.testing.assert_array_equal(logits(model, ids), logits(widened, ids))


def test_a_vision_tower_in_the_file_is_left_out(tmp_path):
    """Ollama's Gemma 3 blobs carry the vision tower (``v.*``) and projector (``mm.*``) beside the
    text model: the text-only conversion and fit's estimate both leave them out."""
    from mlx.utils import tree_flatten
    from mlx_lm import load

    from mlxrt.loading.gguf import convert_gguf
    from mlxrt.loading.gguf_library import gguf_static

    src = tmp_path / "gemma3-vision.gguf"
    tower = {"v.blk.0.attn_q.weight": np.ones((64, 64)), "mm.input_projection.weight": np.ones((64, 256))}
    ref = write_tiny(src, "gemma3", "Q8_0", extra=tower)
    out = convert_gguf(src, tmp_path / "hf", dtype="float32", kernel=False)
    model, _ = load(str(out))
    want = logits(ref)
    np.testing.assert_allclose(logits(model), want, atol=2e-4 * np.abs(want).max(), rtol=0)
    _, summary = gguf_static(src)
    assert summary.params == sum(v.size for _, v in tree_flatten(ref.parameters()))
