"""Tiny random-weight checkpoints in the real Hugging Face layout, for tests.

`write_tiny_checkpoint` writes a folder that `mlx_lm.load(path)` loads and
generates with, in a few hundred milliseconds, with no download::

    from mlxrt.testing import write_tiny_checkpoint
    path = write_tiny_checkpoint(tmp_path / "qwen3", "qwen3")
    model, tokenizer = mlx_lm.load(str(path))

The folder holds what a real repo holds: `config.json`, `model.safetensors`
(parameter names exactly as the real checkpoints name them, e.g.
`model.layers.0.self_attn.q_proj.weight`; Qwen3.5 as
`Qwen3_5ForConditionalGeneration` saves it, `model.language_model.*` plus a tiny
`model.visual.*` tower), `tokenizer.json`, `tokenizer_config.json` (with the
family's chat template and bos/eos/pad tokens), `special_tokens_map.json` and
`generation_config.json` (the family's EOS list).

The weights are seeded (`numpy.random.default_rng(seed)`): the same seed gives
byte-identical files. They are scaled so the random model is context-sensitive
(different prompts give different greedy outputs). Embedding rows past the
tokenizer (the padding up to a multiple of 64) are shrunk so they are never
chosen. The tokenizer is either generated (a small BPE with the family's real
special tokens, see `mlxrt.testing._tokenizer_factory`) or copied from `tokenizer_dir`
(a folder with a real `tokenizer.json` + `tokenizer_config.json`); our own
templates carry the Jinja comment ``{# mlxrt test template #}``.

Families (`TINY_MODEL_TYPES`, the `model_type` written to config.json):
  llama        LlamaForCausalLM in the SmolLM2 style (ChatML, tied embeddings).
  qwen3        Qwen3ForCausalLM (q/k norm, tied); Qwen3 template, <think>, JSON tools.
  qwen3_5      Qwen3_5ForConditionalGeneration: gated-DeltaNet + gated full
               attention (nested text_config); thinking opens by default.
  gemma3_text  Gemma3ForCausalLM: sliding-window layers (window 32, every other
               layer) + full attention, so short test prompts outgrow the window
               (mlx-lm RotatingKVCache); the Gemma 4 generated tokenizer and template
               (or a real Gemma 3 tokenizer through `tokenizer_dir`).
  gemma4_text  Gemma4ForCausalLM: sliding + full layers, per-layer inputs,
               KV-shared layers; Gemma 4 tokens at their real ids.
  minicpm      MiniCPMForCausalLM (mlx-lm `minicpm`, untied lm_head) with the
               MiniCPM5 tokenizer and template. A real MiniCPM5 repo is
               Llama-shaped with the same parameter names: pass
               ``config_overrides={"model_type": "llama", "architectures": ["LlamaForCausalLM"]}``.

Layout variants (`TINY_VARIANTS`: another layout of one of those model types):
  qwen3_embedding  the Qwen3-Embedding repo layout: the qwen3 graph (model_type
               "qwen3") with weights saved WITHOUT the `model.` prefix, as
               `Qwen3Model` saves them (plain `mlx_lm.load` rejects it; the qwen
               family plugin re-prefixes on load), sentence-transformers files
               (`modules.json`, `1_Pooling/config.json` with
               `pooling_mode_lasttoken`, `config_sentence_transformers.json` with
               the `Instruct: ...\nQuery:` prompt), EOS `<|endoftext|>`, left
               padding, and a post-processor that appends `<|endoftext|>`.
  gemma4       Gemma4ForConditionalGeneration: the gemma4_text stack under
               `model.language_model.` plus a vision tower and projector in the real
               HF names (`mlxrt.testing._tiny_gemma4_vision`).

Family-loaded types (`TINY_FAMILY_TYPES`: mlx-lm cannot load them, their family plugin does):
  diffusion_gemma  DiffusionGemmaForBlockDiffusion with a tiny vision tower
               (`mlxrt.testing._tiny_diffusion_gemma`); `diffusion_gemma_no_vision` without it.

`config_overrides` is merged into config.json (dicts merge recursively; for
qwen3_5 put text fields under "text_config") before the weights are drawn, so
sizes such as `num_hidden_layers` can be changed; keep them consistent.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from mlxrt.testing._checkpoint_files import write_json
from mlxrt.testing._tiny_decoders import DECODER_TYPES, write_decoder

__all__ = ["TINY_MODEL_TYPES", "TINY_VARIANTS", "TINY_FAMILY_TYPES", "write_tiny_checkpoint",
           "write_random_adapter"]

TINY_MODEL_TYPES: tuple[str, ...] = DECODER_TYPES
#: Layout variants: variant -> the model_type its config.json says.
TINY_VARIANTS: dict[str, str] = {"qwen3_embedding": "qwen3", "gemma4": "gemma4"}
#: Checkpoints mlx-lm cannot load (their family plugin does), with their own writers.
TINY_FAMILY_TYPES: dict[str, str] = {"diffusion_gemma": "diffusion_gemma",
                                     "diffusion_gemma_no_vision": "diffusion_gemma"}


def write_tiny_checkpoint(
    path: str | os.PathLike,
    model_type: str,
    *,
    tokenizer_dir: str | os.PathLike | None = None,
    seed: int = 0,
    dtype: str = "float32",
    config_overrides: Mapping[str, object] | None = None,
) -> Path:
    """Write a tiny random-weight `model_type` checkpoint into `path` (created) and return it.

    `model_type`: one of `TINY_MODEL_TYPES` or a layout variant from `TINY_VARIANTS`.
    `tokenizer_dir`: copy a real tokenizer from there instead of generating one
    (config `vocab_size` then covers it). `dtype`: float32, bfloat16 or float16
    on disk. `config_overrides`: merged into config.json before weights are drawn.
    """
    if TINY_FAMILY_TYPES.get(model_type) == "diffusion_gemma":  # tokenizer_dir is not supported there
        from mlxrt.testing._tiny_diffusion_gemma import write_diffusion_gemma

        return write_diffusion_gemma(Path(path), seed=seed, dtype=dtype, vision=model_type == "diffusion_gemma",
                                     config_overrides=config_overrides)
    if model_type == "gemma4":  # multimodal: the gemma4_text stack plus a vision tower
        from mlxrt.testing._tiny_gemma4_vision import write_tiny_gemma4_vision

        return write_tiny_gemma4_vision(Path(path), seed=seed, dtype=dtype, tokenizer_dir=tokenizer_dir,
                                        config_overrides=config_overrides)
    if model_type not in TINY_MODEL_TYPES and model_type not in TINY_VARIANTS:
        raise ValueError(f"model_type must be one of {TINY_MODEL_TYPES + tuple(TINY_VARIANTS)}, "
                         f"not {model_type!r}")
    return write_decoder(path, model_type, tokenizer_dir=tokenizer_dir, seed=seed, dtype=dtype,
                         config_overrides=config_overrides)


def write_random_adapter(path: Path, model_path: Path, *, seed: int = 0, rank: int = 4, scale: float = 2.0,
                         keys: tuple[str, ...] = ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"),
                         std: float = 0.3, num_layers: int | None = None) -> Path:
    """Write a random LoRA adapter in mlx-lm's format (``adapter_config.json`` +
    ``adapters.safetensors``) for the checkpoint at ``model_path``; return ``path``.

    Nothing is trained: ``lora_a`` and ``lora_b`` are drawn N(0, ``std``) (mlx-lm starts
    ``lora_b`` at zero, which would change nothing), so the adapter visibly changes the output.
    ``keys`` are module paths inside each decoder layer, as in mlx-lm's ``lora_parameters.keys``;
    the last ``num_layers`` layers (all by default) get one.
    """
    from safetensors.numpy import save_file

    config = json.loads((Path(model_path) / "config.json").read_text())
    config = config.get("text_config", config)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_out, kv_out = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    dims = {"self_attn.q_proj": (hidden, q_out), "self_attn.k_proj": (hidden, kv_out),
            "self_attn.v_proj": (hidden, kv_out), "self_attn.o_proj": (q_out, hidden),
            "mlp.gate_proj": (hidden, inter), "mlp.up_proj": (hidden, inter), "mlp.down_proj": (inter, hidden)}
    layers = config["num_hidden_layers"]
    first = layers - (num_layers if num_layers is not None else layers)
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for i in range(max(first, 0), layers):
        for key in keys:
            inp, out = dims[key]
            tensors[f"model.layers.{i}.{key}.lora_a"] = rng.normal(0, std, (inp, rank)).astype(np.float32)
            tensors[f"model.layers.{i}.{key}.lora_b"] = rng.normal(0, std, (rank, out)).astype(np.float32)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapters.safetensors"), metadata={"format": "mlx"})
    write_json(path / "adapter_config.json", {
        "fine_tune_type": "lora", "num_layers": layers - max(first, 0), "model": str(model_path),
        "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0, "keys": list(keys)}})
    return path
