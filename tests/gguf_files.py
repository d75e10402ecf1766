"""Tiny GGUF files for the tests, written by llama.cpp's own ``gguf`` package (``GGUFWriter``).

``write_tiny(path, arch, types)`` draws a random tiny model of one architecture, stores it the way
llama.cpp does (GGUF names from gguf's HF -> GGUF table, Q/K rows interleaved for ``llama``,
Gemma's norms stored as ``w + 1``, every matrix in the ggml type asked for) and returns the
mlx-lm model holding exactly the values the file decodes to (gguf's own dequantization), which
is what the converted folder must reproduce. Types ``gguf.quants`` cannot quantize (K-quants,
IQ types) are written as random blocks with sane scales.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "1 2"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")
IDS = [1, 60, 261, 75, 2, 100, 200, 3, 259, 150, 5, 42]

# hidden 256: K-quant rows are 256 weights
BASE = dict(hidden_size=256, num_hidden_layers=2, intermediate_size=256, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, rope_theta=10000.0,
            max_position_embeddings=256)

#: general.architecture -> the mlx-lm config of its tiny model
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {**BASE, "model_type": "llama", "tie_word_embeddings": False},
    "qwen2": {**BASE, "model_type": "qwen2", "tie_word_embeddings": True},
    "qwen3": {**BASE, "model_type": "qwen3", "tie_word_embeddings": True},
    "qwen3moe": {**BASE, "model_type": "qwen3_moe", "tie_word_embeddings": False, "num_experts": 4,
                 "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
                 "moe_intermediate_size": 256, "norm_topk_prob": True},
    "gemma2": {**BASE, "model_type": "gemma2", "query_pre_attn_scalar": 64, "attn_logit_softcapping": 50.0,
               "final_logit_softcapping": 30.0},
    "gemma3": {**BASE, "model_type": "gemma3_text", "num_hidden_layers": 6, "query_pre_attn_scalar": 64,
               "sliding_window": 4, "sliding_window_pattern": 6, "rope_local_base_freq": 10000.0},
    "phi3": {**BASE, "model_type": "phi3", "num_key_value_heads": 4, "tie_word_embeddings": False},
}


def tiny_vocab() -> list[str]:
    from mlxrt.loading.gguf_tokenizer import _bytes_to_unicode

    byte_chars = [_bytes_to_unicode()[b] for b in range(256)]
    return SPECIALS + byte_chars + ["".join(m.split(" ")) for m in MERGES]


def _block_bytes(qtype: Any) -> tuple[int, int]:
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[qtype]


# byte ranges of the float16 super-scales (d, dmin) in each block, and a value that keeps weights small
_SCALE_FIELDS = {"Q2_K": [(80, 0.002), (82, 0.002)], "Q3_K": [(108, 0.004)], "Q4_K": [(0, 0.002), (2, 0.002)],
                 "Q5_K": [(0, 0.001), (2, 0.001)], "Q6_K": [(208, 0.0005)], "IQ4_NL": [(0, 0.0008)],
                 "IQ4_XS": [(0, 0.0003)]}


def random_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random ggml blocks of ``type_name`` for a (rows, cols) matrix: random quants and sub-scales,
    the float16 super-scales set to small positive values (so weights are ~0.1)."""
    from gguf import GGMLQuantizationType

    block, size = _block_bytes(GGMLQuantizationType[type_name])
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at, scale in _SCALE_FIELDS[type_name]:
        d = (scale * (0.5 + rng.random((rows, cols // block)))).astype(np.float16)
        raw[..., at:at + 2] = d.view(np.uint8).reshape(rows, cols // block, 2)
    # sub-block scales of one sign and similar size, as llama.cpp's quantizer makes them
    n = raw.shape[:2]
    if type_name == "Q6_K":
        raw[..., 192:208] = rng.integers(40, 128, (*n, 16), dtype=np.uint8)
    elif type_name == "Q3_K":  # 6-bit (sc - 32) in 8..15: low nibbles 8..15, high bits 0b10
        raw[..., 96:104] = rng.integers(8, 16, (*n, 8), dtype=np.uint8) * 17
        raw[..., 104:108] = 0xAA
    elif type_name == "Q2_K":
        raw[..., 0:16] = (raw[..., 0:16] & 0xF0) | rng.integers(8, 16, (*n, 16), dtype=np.uint8)
    return raw.reshape(rows, -1)


def encode(w: np.ndarray, type_name: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(bytes for the writer, the values the file decodes to) for a float matrix ``w``."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    if type_name == "F32":
        return w.astype(np.float32), w.astype(np.float32)
    if type_name == "F16":
        h = w.astype(np.float16)
        return h, h.astype(np.float32)
    qtype = GGMLQuantizationType[type_name]
    flat = w.reshape(-1, w.shape[-1])
    if type_name in _SCALE_FIELDS:
        raw = random_blocks(type_name, flat.shape[0], flat.shape[1], rng)
    else:
        raw = quantize(flat.astype(np.float32), qtype)
    deq = dequantize(raw, qtype).reshape(w.shape)
    return raw.reshape(*w.shape[:-1], raw.shape[-1]), deq.astype(np.float32)


def interleave_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's storage order of Q/K rows (HF half-split RoPE -> interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _metadata(writer: Any, arch: str, cfg: dict[str, Any], vocab: list[str]) -> None:
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(cfg["head_dim"])
    writer.add_value_length(cfg["head_dim"])
    writer.add_rope_dimension_count(cfg["head_dim"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if arch == "gemma3":
        writer.add_sliding_window(cfg["sliding_window"])
    if arch == "qwen3moe":
        writer.add_expert_count(cfg["num_experts"])
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(vocab)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(vocab) - len(SPECIALS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_tiny(path: Path, arch: str, types: dict[str, str] | str = "F32", seed: int = 0,
               extra: dict[str, np.ndarray] | None = None) -> Any:
    """Write a tiny random ``arch`` model as GGUF; return the mlx-lm model of its decoded values.

    ``types``: one ggml type for every matrix, or a map from a GGUF tensor kind (``attn_q``,
    ``token_embd``…) or a whole name without ``.weight`` to its type (default F32). ``extra``:
    more float32 tensors written as they are (a vision tower's, say).
    """
    import gguf
    import mlx.core as mx
    from mlx.utils import tree_flatten

    vocab = tiny_vocab()
    cfg = {**CONFIGS[arch], "vocab_size": len(vocab)}
    module = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(cfg))
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    table = gguf.get_tensor_name_map(arch_id, cfg["num_hidden_layers"])
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    _metadata(writer, arch, cfg, vocab)
    ref: dict[str, Any] = {}
    tied = cfg.get("tie_word_embeddings", True)
    for name, p in tree_flatten(model.parameters()):
        if name == "lm_head.weight" and tied:
            continue
        base, _, suffix = name.rpartition(".")
        gname = f"{table.get_name(base.replace('.switch_mlp.', '.experts.'))}.{suffix}"
        kind = gname.split(".")[-2]
        shape = tuple(p.shape)
        is_norm = kind.endswith("norm")
        if is_norm:
            w = 0.1 * rng.standard_normal(shape) + (0.0 if arch.startswith("gemma") else 1.0)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
        w = w.astype(np.float32)
        if isinstance(types, str):
            tname = "F32" if w.ndim == 1 else types
        else:
            tname = "F32" if w.ndim == 1 else types.get(gname[: -len(".weight")], types.get(kind, "F32"))
        stored = w + 1 if (is_norm and arch.startswith("gemma")) else w
        heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
        if arch == "llama" and kind in heads:
            stored = interleave_rows(stored, heads[kind])
        raw, deq = encode(stored, tname, rng)
        # back to HF form: what the converted folder must hold
        if arch == "llama" and kind in heads:
            order = interleave_rows(np.arange(shape[0]), heads[kind])
            back = np.empty_like(deq)
            back[order] = deq
            deq = back
        if is_norm and arch.startswith("gemma"):
            deq = deq - 1
        ref[name] = mx.array(deq)
        if tname in ("F32", "F16"):
            writer.add_tensor(gname, raw)
        else:
            writer.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType[tname])
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array.astype(np.float32))
    if hasattr(model, "sanitize"):  # mlx-lm's own handling of a tied head
        ref = model.sanitize(ref)
    model.load_weights(list(ref.items()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def logits(model: Any, ids: list[int] = IDS) -> np.ndarray:
    import mlx.core as mx

    out = model(mx.array([ids]))
    mx.eval(out)
    return np.array(out.astype(mx.float32))[0]
