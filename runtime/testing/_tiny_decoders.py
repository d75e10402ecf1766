"""The tiny decoder checkpoints mlx-lm loads itself (:data:`mlxrt.testing.writers.TINY_MODEL_TYPES`
and the ``qwen3_embedding`` layout): configs, seeded weights in the real parameter names, the
tokenizer (generated or copied) and the generation config.

Written through :func:`mlxrt.testing.write_tiny_checkpoint`; the multimodal Gemma 4 writer
(:mod:`mlxrt.testing._tiny_gemma4_vision`) builds on :func:`write_decoder` for its text stack.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from mlxrt.testing._checkpoint_files import (
    DTYPES,
    Weights,
    merge,
    save_safetensors,
    write_generated_tokenizer,
    write_json,
)
from mlxrt.testing._tokenizer_factory import CHAT_TEMPLATES

__all__ = ["DECODER_TYPES", "EMBEDDING_LAYOUTS", "write_decoder"]

#: The decoder families written here (the ``model_type`` in config.json).
DECODER_TYPES: tuple[str, ...] = ("llama", "qwen3", "qwen3_5", "gemma3_text", "gemma4_text", "minicpm")
#: Another layout of one of those graphs: layout -> the model_type its config.json says.
EMBEDDING_LAYOUTS: dict[str, str] = {"qwen3_embedding": "qwen3"}

# Family end-of-turn tokens that go into generation_config.eos_token_id (if present).
_EOS = {"llama": ["<|im_end|>"], "qwen3": ["<|im_end|>", "<|endoftext|>"],
        "qwen3_5": ["<|im_end|>", "<|endoftext|>"], "gemma4_text": ["<eos>", "<turn|>", "<|tool_response>"],
        "gemma3_text": ["<eos>", "<end_of_turn>", "<turn|>", "<|tool_response>"],  # a real Gemma 3 tokenizer, or ours
        "minicpm": ["</s>", "<|im_end|>"], "qwen3_embedding": ["<|endoftext|>", "<|im_end|>"]}


def write_decoder(
    path: str | os.PathLike,
    model_type: str,
    *,
    tokenizer_dir: str | os.PathLike | None = None,
    seed: int = 0,
    dtype: str = "float32",
    config_overrides: Mapping[str, object] | None = None,
) -> Path:
    """Write a tiny ``model_type`` decoder (a key of :data:`DECODER_TYPES` or of
    :data:`EMBEDDING_LAYOUTS`) into ``path``; the arguments are
    :func:`mlxrt.testing.write_tiny_checkpoint`'s, which checks ``model_type``."""
    variant, model_type = model_type, EMBEDDING_LAYOUTS.get(model_type, model_type)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, not {dtype!r}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is None:
        num_tokens, ids, tcfg = write_generated_tokenizer(out, _TOKENIZER_FAMILY.get(model_type, model_type))
        if variant == "qwen3_embedding":
            tcfg = _embedding_tokenizer(out, ids, tcfg)
    else:
        num_tokens, ids, tcfg = _copy_tokenizer(out, model_type, Path(tokenizer_dir))

    def tid(name: str) -> int | None:
        tok = tcfg.get(name)
        tok = tok.get("content") if isinstance(tok, dict) else tok
        return ids.get(tok) if tok else None

    eos = [ids[t] for t in _EOS[variant] if t in ids]
    if tid("eos_token") is not None and tid("eos_token") not in eos:
        eos.append(tid("eos_token"))
    if not eos:
        raise ValueError(f"the tokenizer has no EOS token for {model_type}")
    tok_ids = {"bos": tid("bos_token"), "eos": eos, "pad": tid("pad_token"), "ids": ids}
    vocab = -(-num_tokens // 64) * 64
    config = merge(_CONFIGS[model_type](vocab, tok_ids, dtype), dict(config_overrides or {}))
    tensors = _WEIGHTS[model_type](config, np.random.default_rng(seed))
    for name, t in tensors.items():  # rows past the tokenizer: logits ~0, never sampled
        if name.endswith(("embed_tokens.weight", "lm_head.weight")) and t.shape[0] > num_tokens:
            t[num_tokens:] *= 0.02
    if variant == "qwen3_embedding":  # as Qwen3Model saves them: no "model." prefix
        tensors = {name.removeprefix("model."): t for name, t in tensors.items()}
        _write_sentence_transformers(out, config["hidden_size"])
    save_safetensors(out / "model.safetensors", tensors, dtype)
    write_json(out / "config.json", config)
    gen = {"bos_token_id": tok_ids["bos"], "eos_token_id": eos if len(eos) > 1 else eos[0],
           "pad_token_id": tok_ids["pad"]}
    write_json(out / "generation_config.json", {k: v for k, v in gen.items() if v is not None})
    return out


# --------------------------------------------------------------------------- tokenizer


def _copy_tokenizer(out: Path, family: str, src: Path) -> tuple[int, dict, dict]:
    """Copy a real tokenizer; add our family template when it ships none."""
    st = (src / "tokenizer.json").stat()
    num_tokens, added, vocab = _read_tokenizer_json(str((src / "tokenizer.json").resolve()), st.st_mtime_ns, st.st_size)
    tcfg = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):  # usually added tokens already
        tok = tcfg.get(name)
        tok = tok.get("content") if isinstance(tok, dict) else tok
        if tok and tok not in added and tok in vocab:
            added = {**added, tok: vocab[tok]}
    shutil.copyfile(src / "tokenizer.json", out / "tokenizer.json")
    for extra in ("special_tokens_map.json", "chat_template.jinja", "added_tokens.json"):
        if (src / extra).exists():
            shutil.copyfile(src / extra, out / extra)
        else:  # do not keep one from an earlier write into the same folder
            (out / extra).unlink(missing_ok=True)
    if tcfg.get("chat_template") or (src / "chat_template.jinja").exists():
        shutil.copyfile(src / "tokenizer_config.json", out / "tokenizer_config.json")
    else:
        tcfg["chat_template"] = CHAT_TEMPLATES[family]
        write_json(out / "tokenizer_config.json", tcfg)
    return num_tokens, dict(added), tcfg


def _embedding_tokenizer(out: Path, ids: Mapping[str, int], tcfg: dict) -> dict:
    """Make the generated Qwen3 tokenizer Qwen3-Embedding's: EOS <|endoftext|>, appended by the
    post-processor (the updated official tokenizer does this), left padding."""
    eot = "<|endoftext|>"
    tj = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    tail = {"SpecialToken": {"id": eot, "type_id": 0}}
    tj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}, tail],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, tail, {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": eot, "type_id": 1}}],
        "special_tokens": {eot: {"id": eot, "ids": [ids[eot]], "tokens": [eot]}},
    }
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    tcfg = {**tcfg, "eos_token": eot, "padding_side": "left"}
    write_json(out / "tokenizer_config.json", tcfg)
    stm = json.loads((out / "special_tokens_map.json").read_text(encoding="utf-8"))
    write_json(out / "special_tokens_map.json", {**stm, "eos_token": eot})
    return tcfg


def _write_sentence_transformers(out: Path, hidden: int) -> None:
    """modules.json (Transformer -> last-token Pooling -> Normalize) and its module configs."""
    write_json(out / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ])
    (out / "1_Pooling").mkdir(exist_ok=True)
    write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": True, "include_prompt": True,
    })
    write_json(out / "config_sentence_transformers.json", {
        "prompts": {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query"
                             "\nQuery:", "document": ""},
        "default_prompt_name": None, "similarity_fn_name": "cosine",
    })
    write_json(out / "sentence_bert_config.json", {"max_seq_length": 32768, "do_lower_case": False})


@functools.lru_cache(maxsize=8)
def _read_tokenizer_json(path: str, mtime_ns: int, size: int) -> tuple[int, dict, dict]:
    """(ids in use, added token -> id, vocab piece -> id) of a tokenizer.json; parsed once per file version."""
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    added = {a["content"]: a["id"] for a in tj.get("added_tokens", [])}
    vocab = tj["model"]["vocab"]
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        vocab = {p[0]: i for i, p in enumerate(vocab)}
    num_tokens = max(max(vocab.values(), default=-1), max(added.values(), default=-1)) + 1
    return num_tokens, added, vocab


# --------------------------------------------------------------------------- configs


def _llama_config(vocab: int, t: dict, dtype: str) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": t["bos"], "eos_token_id": t["eos"][0],
        "pad_token_id": t["pad"], "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
        "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 8192,
        "mlp_bias": False, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "pretraining_tp": 1, "rms_norm_eps": 1e-5, "rope_scaling": None, "rope_theta": 100000.0,
        "tie_word_embeddings": True, "torch_dtype": dtype, "transformers_version": "4.42.3",
        "use_cache": True, "vocab_size": vocab,
    }


def _qwen3_config(vocab: int, t: dict, dtype: str) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": t["ids"].get("<|endoftext|>"), "eos_token_id": t["eos"][0],
        "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 128, "max_position_embeddings": 40960, "max_window_layers": 2,
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
        "torch_dtype": dtype, "transformers_version": "4.51.0", "use_cache": True,
        "use_sliding_window": False, "vocab_size": vocab,
    }


def _qwen3_5_config(vocab: int, t: dict, dtype: str) -> dict:
    ids = t["ids"]
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "image_token_id": ids.get("<|image_pad|>"), "video_token_id": ids.get("<|video_pad|>"),
        "vision_start_token_id": ids.get("<|vision_start|>"), "vision_end_token_id": ids.get("<|vision_end|>"),
        "tie_word_embeddings": True, "torch_dtype": dtype, "transformers_version": "5.24.0",
        "text_config": {
            "model_type": "qwen3_5_text", "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "hidden_act": "silu", "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
            "attn_output_gate": True, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
            "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "full_attention_interval": 2, "layer_types": ["linear_attention", "full_attention"] * 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                "mrope_section": [1, 1, 0], "mrope_interleaved": True},
            "bos_token_id": None, "eos_token_id": t["eos"][0], "pad_token_id": None,
        },
        "vision_config": {
            "model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32, "intermediate_size": 64,
            "num_heads": 2, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "out_hidden_size": 64, "num_position_embeddings": 64,
            "hidden_act": "gelu_pytorch_tanh",
        },
    }


def _gemma4_config(vocab: int, t: dict, dtype: str) -> dict:
    return {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "vocab_size": vocab,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": None,
        "attention_k_eq_v": False, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "sliding_window": 512,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "final_logit_softcapping": 30.0, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": vocab,
        "num_kv_shared_layers": 2, "use_double_wide_mlp": True, "enable_moe_block": False,
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True,
        "pad_token_id": t["pad"], "bos_token_id": t["bos"], "eos_token_id": t["eos"],
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "dtype": dtype, "transformers_version": "5.24.0",
    }


def _gemma3_config(vocab: int, t: dict, dtype: str) -> dict:
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": vocab,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "query_pre_attn_scalar": 32, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "sliding_window": 32, "sliding_window_pattern": 2,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True,
        "pad_token_id": t["pad"], "bos_token_id": t["bos"], "eos_token_id": t["eos"],
        "dtype": dtype, "transformers_version": "4.50.0",
    }


def _minicpm_config(vocab: int, t: dict, dtype: str) -> dict:
    return {
        "architectures": ["MiniCPMForCausalLM"], "model_type": "minicpm", "bos_token_id": t["bos"],
        "eos_token_id": t["eos"], "pad_token_id": t["pad"], "hidden_act": "silu", "hidden_size": 64,
        "initializer_range": 0.1, "intermediate_size": 128, "max_position_embeddings": 131072,
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "rope_theta": 5000000.0, "scale_emb": 1.0, "dim_model_base": 64,
        "scale_depth": 1.4, "tie_word_embeddings": False, "torch_dtype": dtype, "use_cache": True,
        "vocab_size": vocab,
    }


_CONFIGS = {"llama": _llama_config, "qwen3": _qwen3_config, "qwen3_5": _qwen3_5_config,
            "gemma3_text": _gemma3_config, "gemma4_text": _gemma4_config, "minicpm": _minicpm_config}
#: Model types that borrow another family's generated tokenizer (and chat template).
_TOKENIZER_FAMILY = {"gemma3_text": "gemma4_text"}


# --------------------------------------------------------------------------- weights


# A tied embedding of std 1 makes the logits (h . E) so peaked that a random
# model repeats its last input token whatever the context; std 1/sqrt(hidden)
# (logits of std ~1) gave distinct greedy outputs for different prompts across
# seeds. Untied models use std 1 embeddings and a 1/sqrt(fan_in) lm_head.
_TIED_STD = 1.0


def _attention_projections(w: Weights, p: str, H: int, nh: int, nkv: int, hd: int) -> None:
    """Layer ``p``'s q/k/v/o projections (grouped-query attention), in the checkpoint's order."""
    w.linear(f"{p}.self_attn.q_proj.weight", nh * hd, H)
    w.linear(f"{p}.self_attn.k_proj.weight", nkv * hd, H)
    w.linear(f"{p}.self_attn.v_proj.weight", nkv * hd, H)
    w.linear(f"{p}.self_attn.o_proj.weight", H, nh * hd)


def _dense_decoder(c: dict, rng, qk_norm: bool) -> Weights:
    """Llama / Qwen3 / MiniCPM: model.embed_tokens, model.layers.N.{self_attn,mlp}.*, model.norm."""
    w = Weights(rng)
    H, L, V, nh, nkv = (c["hidden_size"], c["num_hidden_layers"], c["vocab_size"],
                        c["num_attention_heads"], c["num_key_value_heads"])
    hd, ffn, tied = c.get("head_dim") or H // nh, c["intermediate_size"], c.get("tie_word_embeddings", True)
    w.normal("model.embed_tokens.weight", (V, H), _TIED_STD * H**-0.5 if tied else 1.0)
    for i in range(L):
        p = f"model.layers.{i}"
        _attention_projections(w, p, H, nh, nkv, hd)
        if qk_norm:
            w.norm(f"{p}.self_attn.q_norm.weight", hd)
            w.norm(f"{p}.self_attn.k_norm.weight", hd)
        w.linear(f"{p}.mlp.gate_proj.weight", ffn, H)
        w.linear(f"{p}.mlp.up_proj.weight", ffn, H)
        w.linear(f"{p}.mlp.down_proj.weight", H, ffn)
        w.norm(f"{p}.input_layernorm.weight", H)
        w.norm(f"{p}.post_attention_layernorm.weight", H)
    w.norm("model.norm.weight", H)
    if not tied:
        w.linear("lm_head.weight", V, H)
    return w


def _qwen3_5_weights(c: dict, rng) -> Weights:
    w, t, v = Weights(rng), c["text_config"], c["vision_config"]
    H, ffn, V, nh, nkv, hd = (t["hidden_size"], t["intermediate_size"], t["vocab_size"],
                              t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"])
    lk, lv, dk, dv, K = (t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"],
                         t["linear_value_head_dim"], t["linear_conv_kernel_dim"])
    conv = 2 * lk * dk + lv * dv
    pre = "model.language_model"
    w.normal(f"{pre}.embed_tokens.weight", (V, H), _TIED_STD * H**-0.5)
    for i in range(t["num_hidden_layers"]):
        p = f"{pre}.layers.{i}"
        if (i + 1) % t["full_attention_interval"]:  # gated DeltaNet
            w.normal(f"{p}.linear_attn.dt_bias", (lv,), 0.1, 1.0)
            w[f"{p}.linear_attn.A_log"] = rng.uniform(0.0, 2.5, lv).astype(np.float32)
            w.normal(f"{p}.linear_attn.conv1d.weight", (conv, 1, K), 0.5)
            w.norm(f"{p}.linear_attn.norm.weight", dv)  # gated norm: plain x*w
            w.linear(f"{p}.linear_attn.out_proj.weight", H, lv * dv)
            w.linear(f"{p}.linear_attn.in_proj_qkv.weight", conv, H)
            w.linear(f"{p}.linear_attn.in_proj_z.weight", lv * dv, H)
            w.linear(f"{p}.linear_attn.in_proj_b.weight", lv, H)
            w.linear(f"{p}.linear_attn.in_proj_a.weight", lv, H)
        else:  # gated full attention: q_proj holds the query and the output gate
            w.linear(f"{p}.self_attn.q_proj.weight", 2 * nh * hd, H)
            w.linear(f"{p}.self_attn.k_proj.weight", nkv * hd, H)
            w.linear(f"{p}.self_attn.v_proj.weight", nkv * hd, H)
            w.linear(f"{p}.self_attn.o_proj.weight", H, nh * hd)
            w.norm(f"{p}.self_attn.q_norm.weight", hd, center=0.0)
            w.norm(f"{p}.self_attn.k_norm.weight", hd, center=0.0)
        w.linear(f"{p}.mlp.gate_proj.weight", ffn, H)
        w.linear(f"{p}.mlp.up_proj.weight", ffn, H)
        w.linear(f"{p}.mlp.down_proj.weight", H, ffn)
        w.norm(f"{p}.input_layernorm.weight", H, center=0.0)  # Qwen3.5 norms are x*(1+w)
        w.norm(f"{p}.post_attention_layernorm.weight", H, center=0.0)
    w.norm(f"{pre}.norm.weight", H, center=0.0)
    vh, vi, ps, tp, m = (v["hidden_size"], v["intermediate_size"], v["patch_size"],
                         v["temporal_patch_size"], v["spatial_merge_size"])
    q = "model.visual"  # tiny Qwen3-VL-style tower, as every real Qwen3.5 repo has one
    w.normal(f"{q}.patch_embed.proj.weight", (vh, v["in_channels"], tp, ps, ps), (3 * tp * ps * ps) ** -0.5)
    w.normal(f"{q}.patch_embed.proj.bias", (vh,), 0.02)
    w.normal(f"{q}.pos_embed.weight", (v["num_position_embeddings"], vh), 0.02)
    for b in range(v["depth"]):
        p = f"{q}.blocks.{b}"
        for n, o, i in (("attn.qkv", 3 * vh, vh), ("attn.proj", vh, vh), ("mlp.linear_fc1", vi, vh),
                        ("mlp.linear_fc2", vh, vi)):
            w.linear(f"{p}.{n}.weight", o, i)
            w.normal(f"{p}.{n}.bias", (o,), 0.02)
        for n in ("norm1", "norm2"):
            w.norm(f"{p}.{n}.weight", vh)
            w.normal(f"{p}.{n}.bias", (vh,), 0.02)
    mh = vh * m * m
    w.norm(f"{q}.merger.norm.weight", vh)
    w.normal(f"{q}.merger.norm.bias", (vh,), 0.02)
    for n, o, i in (("linear_fc1", mh, mh), ("linear_fc2", v["out_hidden_size"], mh)):
        w.linear(f"{q}.merger.{n}.weight", o, i)
        w.normal(f"{q}.merger.{n}.bias", (o,), 0.02)
    return w


def _gemma3_weights(c: dict, rng) -> Weights:
    w = Weights(rng)
    H, L, V, nh, nkv, hd, ffn = (c["hidden_size"], c["num_hidden_layers"], c["vocab_size"],
                                 c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                                 c["intermediate_size"])
    w.normal("model.embed_tokens.weight", (V, H), H**-0.5)  # the model multiplies by sqrt(hidden)
    for i in range(L):
        p = f"model.layers.{i}"
        _attention_projections(w, p, H, nh, nkv, hd)
        w.norm(f"{p}.self_attn.q_norm.weight", hd, center=0.0)  # Gemma 3 norms are x*(1+w)
        w.norm(f"{p}.self_attn.k_norm.weight", hd, center=0.0)
        w.linear(f"{p}.mlp.gate_proj.weight", ffn, H)
        w.linear(f"{p}.mlp.up_proj.weight", ffn, H)
        w.linear(f"{p}.mlp.down_proj.weight", H, ffn)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w.norm(f"{p}.{n}.weight", H, center=0.0)
    w.norm("model.norm.weight", H, center=0.0)
    return w


def _gemma4_weights(c: dict, rng) -> Weights:
    w = Weights(rng)
    H, L, V, nh, nkv, ffn, ple = (c["hidden_size"], c["num_hidden_layers"], c["vocab_size"],
                                  c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"],
                                  c["hidden_size_per_layer_input"])
    first_shared = L - c["num_kv_shared_layers"]
    w.normal("model.embed_tokens.weight", (V, H), H**-0.5)  # the model multiplies by sqrt(hidden)
    for i, lt in enumerate(c["layer_types"]):
        p = f"model.layers.{i}"
        d = c["global_head_dim"] if lt == "full_attention" and c.get("global_head_dim") else c["head_dim"]
        w.linear(f"{p}.self_attn.q_proj.weight", nh * d, H)
        w.norm(f"{p}.self_attn.q_norm.weight", d)
        if i < first_shared:  # KV-shared layers reuse an earlier layer's K/V
            w.linear(f"{p}.self_attn.k_proj.weight", nkv * d, H)
            w.linear(f"{p}.self_attn.v_proj.weight", nkv * d, H)
            w.norm(f"{p}.self_attn.k_norm.weight", d)
        w.linear(f"{p}.self_attn.o_proj.weight", H, nh * d)
        f = ffn * 2 if i >= first_shared and c.get("use_double_wide_mlp") else ffn
        w.linear(f"{p}.mlp.gate_proj.weight", f, H)
        w.linear(f"{p}.mlp.up_proj.weight", f, H)
        w.linear(f"{p}.mlp.down_proj.weight", H, f)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm", "post_per_layer_input_norm"):
            w.norm(f"{p}.{n}.weight", H)
        w.linear(f"{p}.per_layer_input_gate.weight", ple, H)
        w.linear(f"{p}.per_layer_projection.weight", H, ple)
        w[f"{p}.layer_scalar"] = rng.uniform(0.6, 1.2, (1,)).astype(np.float32)
    w.norm("model.norm.weight", H)
    w.normal("model.embed_tokens_per_layer.weight", (c["vocab_size_per_layer_input"], L * ple), 0.5)
    w.linear("model.per_layer_model_projection.weight", L * ple, H)
    w.norm("model.per_layer_projection_norm.weight", ple)
    return w


_WEIGHTS = {
    "llama": lambda c, rng: _dense_decoder(c, rng, qk_norm=False),
    "qwen3": lambda c, rng: _dense_decoder(c, rng, qk_norm=True),
    "qwen3_5": _qwen3_5_weights,
    "gemma3_text": _gemma3_weights,
    "gemma4_text": _gemma4_weights,
    "minicpm": lambda c, rng: _dense_decoder(c, rng, qk_norm=False),
}
