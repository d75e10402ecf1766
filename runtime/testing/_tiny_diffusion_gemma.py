"""The tiny DiffusionGemma checkpoint of :func:`mlxrt.testing.write_tiny_checkpoint`.

``DiffusionGemmaForBlockDiffusion`` in the real Hugging Face layout: the decoder's weights
(``model.decoder.*``: 5 Gemma-4 MoE layers, 4 experts top-2, self-conditioning), the
encoder's own ``layer_scalar`` buffers (everything else of the encoder is tied to the
decoder, so it is not stored), and, unless ``vision=False``, a 2-layer Gemma-4 vision
tower (``model.encoder.vision_tower.*``) with its projector (``model.encoder.embed_vision``).
No ``lm_head`` (tied). ``canvas_length`` is 16 (real: 256) so a denoising step is cheap.
The tokenizer is the generated Gemma 4 one (real special-token ids, compact vocabulary).
transformers loads the folder with no missing or unexpected keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["write_diffusion_gemma"]

LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]
_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
          "post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2")


def _text_config(vocab: int, ids: Mapping[str, int]) -> dict:
    return {
        "model_type": "diffusion_gemma_text", "vocab_size": vocab, "hidden_size": 48, "intermediate_size": 96,
        "moe_intermediate_size": 32, "num_experts": 4, "top_k_experts": 2, "num_hidden_layers": len(LAYER_TYPES),
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_global_key_value_heads": 1, "head_dim": 16,
        "global_head_dim": 32, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6, "sliding_window": 8, "layer_types": list(LAYER_TYPES),
        "final_logit_softcapping": 30.0, "use_bidirectional_attention": "vision", "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": True,
        "pad_token_id": ids["<pad>"], "bos_token_id": ids["<bos>"], "eos_token_id": ids["<eos>"],
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    }


VISION_CONFIG = {
    "model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6, "patch_size": 16, "pooling_kernel_size": 3, "position_embedding_size": 128,
    "use_clipped_linears": False, "standardize": True, "attention_bias": False, "attention_dropout": 0.0,
    "max_position_embeddings": 131072,
}


def _text_weights(w, c: dict, num_tokens: int, unused: list[int]) -> None:
    H, V, nh, FF, E, MI = (c["hidden_size"], c["vocab_size"], c["num_attention_heads"], c["intermediate_size"],
                          c["num_experts"], c["moe_intermediate_size"])
    d = "model.decoder"
    w.normal(f"{d}.embed_tokens.weight", (V, H), 3.0 / H**0.5)
    emb = w[f"{d}.embed_tokens.weight"]
    emb[num_tokens:] *= 0.02  # padding rows past the tokenizer: logits ~0, never chosen
    emb[unused] *= 0.02  # <unusedN> fillers likewise
    for i, lt in enumerate(c["layer_types"]):
        q = f"{d}.layers.{i}"
        full = lt == "full_attention"
        hd, kvh = (c["global_head_dim"], c["num_global_key_value_heads"]) if full else (c["head_dim"],
                                                                                      c["num_key_value_heads"])
        w.linear(f"{q}.self_attn.q_proj.weight", nh * hd, H)
        w.linear(f"{q}.self_attn.k_proj.weight", kvh * hd, H)
        if not full:  # full-attention layers reuse K as V
            w.linear(f"{q}.self_attn.v_proj.weight", kvh * hd, H)
        w.linear(f"{q}.self_attn.o_proj.weight", H, nh * hd)
        w.norm(f"{q}.self_attn.q_norm.weight", hd)
        w.norm(f"{q}.self_attn.k_norm.weight", hd)
        w.linear(f"{q}.mlp.gate_proj.weight", FF, H)
        w.linear(f"{q}.mlp.up_proj.weight", FF, H)
        w.linear(f"{q}.mlp.down_proj.weight", H, FF)
        for n in _NORMS:
            w.norm(f"{q}.{n}.weight", H)
        w.normal(f"{q}.router.proj.weight", (E, H), 3.0 / H**0.5)  # peaked routing: experts matter
        w.normal(f"{q}.router.scale", (H,), 0.1, 1.0)
        w.normal(f"{q}.router.per_expert_scale", (E,), 0.1, 1.0)
        w.normal(f"{q}.experts.gate_up_proj", (E, 2 * MI, H), H**-0.5)
        w.normal(f"{q}.experts.down_proj", (E, H, MI), MI**-0.5)
        w[f"{q}.layer_scalar"] = w.rng.uniform(0.6, 1.2, (1,)).astype(np.float32)
        w[f"model.encoder.language_model.layers.{i}.layer_scalar"] = w.rng.uniform(0.6, 1.2, (1,)).astype(np.float32)
    w.norm(f"{d}.norm.weight", H)
    w.norm(f"{d}.self_conditioning.pre_norm.weight", H)
    w.linear(f"{d}.self_conditioning.gate_proj.weight", FF, H)
    w.linear(f"{d}.self_conditioning.up_proj.weight", FF, H)
    w.linear(f"{d}.self_conditioning.down_proj.weight", H, FF)


def _vision_weights(w, v: dict, text_hidden: int) -> None:
    """The Gemma 4 vision tower's tensors (patch embedder with x/y position tables, ViT layers
    with q/k/v norms and sandwich norms, standardization) and the projector."""
    p = "model.encoder.vision_tower"
    vh, vi, ps, hd = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["head_dim"]
    w.linear(f"{p}.patch_embedder.input_proj.weight", vh, 3 * ps * ps)
    w.normal(f"{p}.patch_embedder.position_embedding_table", (2, v["position_embedding_size"], vh), 0.3)
    for i in range(v["num_hidden_layers"]):
        q = f"{p}.encoder.layers.{i}"
        for name, out_f, in_f in (("q_proj", v["num_attention_heads"] * hd, vh),
                                  ("k_proj", v["num_key_value_heads"] * hd, vh),
                                  ("v_proj", v["num_key_value_heads"] * hd, vh),
                                  ("o_proj", vh, v["num_attention_heads"] * hd)):
            w.linear(f"{q}.self_attn.{name}.linear.weight", out_f, in_f)
        w.norm(f"{q}.self_attn.q_norm.weight", hd)
        w.norm(f"{q}.self_attn.k_norm.weight", hd)
        w.linear(f"{q}.mlp.gate_proj.linear.weight", vi, vh)
        w.linear(f"{q}.mlp.up_proj.linear.weight", vi, vh)
        w.linear(f"{q}.mlp.down_proj.linear.weight", vh, vi)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w.norm(f"{q}.{n}.weight", vh)
    w.normal(f"{p}.std_bias", (vh,), 0.1)
    w.normal(f"{p}.std_scale", (vh,), 0.1, 1.0)
    w.linear("model.encoder.embed_vision.embedding_projection.weight", text_hidden, vh)


def write_diffusion_gemma(out: Path, *, seed: int = 0, dtype: str = "float32", vision: bool = True,
                          config_overrides: Mapping[str, object] | None = None) -> Path:
    """Write the tiny checkpoint into ``out``; ``vision=False`` leaves the tower out.

    ``config_overrides`` merges into config.json (put text fields under ``text_config``);
    ``generation_config`` keys in it go to generation_config.json instead.
    """
    from mlxrt.testing._checkpoint_files import (
        Weights,
        merge,
        save_safetensors,
        write_generated_tokenizer,
        write_json,
    )

    out.mkdir(parents=True, exist_ok=True)
    num_tokens, ids, tcfg = write_generated_tokenizer(out, "gemma4_text")
    vocab = -(-num_tokens // 64) * 64
    overrides = dict(config_overrides or {})
    gen_over = overrides.pop("generation_config", {})
    config = {
        "architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
        "text_config": _text_config(vocab, ids), "canvas_length": 16,
        "boi_token_id": ids["<|image>"], "eoi_token_id": ids["<image|>"], "image_token_id": ids["<|image|>"],
        "initializer_range": 0.02, "tie_word_embeddings": True, "dtype": dtype, "transformers_version": "5.24.0",
    }
    if vision:
        config["vision_config"] = dict(VISION_CONFIG)
    config = merge(config, overrides)
    w = Weights(np.random.default_rng(seed))
    unused = [i for tok, i in ids.items() if tok.startswith("<unused")]
    _text_weights(w, config["text_config"], num_tokens, unused)
    if vision:
        _vision_weights(w, config["vision_config"], config["text_config"]["hidden_size"])
    save_safetensors(out / "model.safetensors", w, dtype)
    write_json(out / "config.json", config)
    eos = [ids[t] for t in ("<eos>", "<turn|>", "<|tool_response>")]
    gen = {"bos_token_id": ids["<bos>"], "eos_token_id": eos, "pad_token_id": ids["<pad>"],
           "max_new_tokens": 256, "max_denoising_steps": 16, "t_min": 0.4, "t_max": 0.8,
           "stability_threshold": 1, "confidence_threshold": 0.005,
           "sampler_config": {"entropy_bound": 0.1, "_cls_name": "EntropyBoundSamplerConfig"},
           "transformers_version": "5.24.0", **gen_over}
    write_json(out / "generation_config.json", gen)
    if vision:
        write_json(out / "processor_config.json", {
            "processor_class": "Gemma4Processor", "image_seq_length": 280,
            "image_processor": {"image_processor_type": "Gemma4ImageProcessor", "do_convert_rgb": True,
                                "do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255,
                                "do_normalize": False, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
                                "patch_size": 16, "max_soft_tokens": 70, "pooling_kernel_size": 3}})
    return out
