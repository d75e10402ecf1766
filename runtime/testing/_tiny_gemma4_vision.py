"""Tiny random-weight Gemma 4 multimodal checkpoint (``Gemma4ForConditionalGeneration``):
the tiny ``gemma4_text`` stack under ``model.language_model.`` plus a two-layer vision tower
(``model.vision_tower.``) and its projector (``model.embed_vision.``), with the real parameter
names and shapes (``../shared/tools/tiny_families/make_gemma4.py``), a nested config
(``text_config`` / ``vision_config``, top-level ``vocab_size`` and image token ids) and a
``processor_config.json`` whose image budget is 70 soft tokens.

Written through :func:`mlxrt.testing.write_tiny_checkpoint` as model type ``gemma4``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mlxrt.testing._checkpoint_files import save_safetensors, write_json
from mlxrt.testing._tiny_decoders import write_decoder

__all__ = ["write_tiny_gemma4_vision", "VISION_CONFIG"]

VISION_CONFIG = {
    "model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6, "patch_size": 16, "pooling_kernel_size": 3, "position_embedding_size": 128,
    "use_clipped_linears": False, "standardize": True, "attention_bias": False, "attention_dropout": 0.0,
    "max_position_embeddings": 131072, "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0},
}

IMAGE_PROCESSOR = {
    "image_processor_type": "Gemma4ImageProcessor", "do_convert_rgb": True, "do_resize": True,
    "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": False,
    "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0], "patch_size": 16,
    "max_soft_tokens": 70, "pooling_kernel_size": 3,
}


def _vision_weights(rng: np.random.Generator, c: dict, text_hidden: int) -> dict[str, np.ndarray]:
    vh, vi, ps, hd = c["hidden_size"], c["intermediate_size"], c["patch_size"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    out: dict[str, np.ndarray] = {}

    def normal(name: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> None:
        out[name] = rng.normal(mean, std, shape).astype(np.float32)

    def linear(name: str, o: int, i: int) -> None:
        normal(name, (o, i), i**-0.5)

    p = "model.vision_tower"
    linear(f"{p}.patch_embedder.input_proj.weight", vh, 3 * ps * ps)
    normal(f"{p}.patch_embedder.position_embedding_table", (2, c["position_embedding_size"], vh), 0.3)
    for i in range(c["num_hidden_layers"]):
        q = f"{p}.encoder.layers.{i}"
        linear(f"{q}.self_attn.q_proj.linear.weight", nh * hd, vh)
        linear(f"{q}.self_attn.k_proj.linear.weight", nkv * hd, vh)
        linear(f"{q}.self_attn.v_proj.linear.weight", nkv * hd, vh)
        linear(f"{q}.self_attn.o_proj.linear.weight", vh, nh * hd)
        normal(f"{q}.self_attn.q_norm.weight", (hd,), 0.1, 1.0)
        normal(f"{q}.self_attn.k_norm.weight", (hd,), 0.1, 1.0)
        linear(f"{q}.mlp.gate_proj.linear.weight", vi, vh)
        linear(f"{q}.mlp.up_proj.linear.weight", vi, vh)
        linear(f"{q}.mlp.down_proj.linear.weight", vh, vi)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            normal(f"{q}.{n}.weight", (vh,), 0.1, 1.0)
    normal(f"{p}.std_bias", (vh,), 0.1)
    normal(f"{p}.std_scale", (vh,), 0.1, 1.0)
    # Large enough that image rows move the text model's output visibly.
    normal("model.embed_vision.embedding_projection.weight", (text_hidden, vh), 1.0)
    return out


def write_tiny_gemma4_vision(path: Path, *, seed: int = 0, dtype: str = "float32", **text_kwargs: object) -> Path:
    """Write the multimodal checkpoint into ``path``; return it."""
    from safetensors.numpy import load_file

    out = write_decoder(path, "gemma4_text", seed=seed, dtype="float32", **text_kwargs)
    text = json.loads((out / "config.json").read_text())
    tensors = {name.replace("model.", "model.language_model.", 1): t
               for name, t in load_file(str(out / "model.safetensors")).items()}
    tensors.update(_vision_weights(np.random.default_rng(seed + 1), VISION_CONFIG, text["hidden_size"]))
    save_safetensors(out / "model.safetensors", tensors, dtype)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}
    text.pop("architectures", None)
    text.pop("transformers_version", None)
    text.pop("dtype", None)
    write_json(out / "config.json", {
        "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
        "vocab_size": text["vocab_size"], "text_config": text, "vision_config": VISION_CONFIG,
        "audio_config": None, "boi_token_id": ids["<|image>"], "eoi_token_id": ids["<image|>"],
        "image_token_id": ids["<|image|>"], "video_token_id": ids.get("<|video|>"),
        "boa_token_id": ids.get("<|audio>"), "eoa_token_index": ids.get("<audio|>"),
        "audio_token_id": ids.get("<|audio|>"), "initializer_range": 0.02, "tie_word_embeddings": True,
        "dtype": dtype, "transformers_version": "5.24.0",
    })
    write_json(out / "processor_config.json", {
        "processor_class": "Gemma4Processor", "image_seq_length": 280, "image_processor": IMAGE_PROCESSOR,
    })
    return out
