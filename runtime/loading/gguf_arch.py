"""GGUF architectures -> the Hugging Face ``config.json`` mlx-lm expects, and GGUF tensor names
-> the names of that mlx-lm model's parameters.

One builder per ``general.architecture`` turns the ``{arch}.*`` metadata into a config (the
conventions llama.cpp bakes into its graph, such as Gemma's attention scale, written out as the
config keys mlx-lm reads). Names are not listed by hand: the mlx-lm model the config describes
is instantiated (lazily: nothing is allocated) and each of its parameter names is mapped by the
``gguf`` package's own HF -> GGUF table (``gguf.get_tensor_name_map``), then inverted.

Two stored conventions of llama.cpp are undone per tensor (:func:`hf_tensor`): the interleaved
Q/K rows of ``llama`` files, and the ``+1`` on every RMSNorm weight of the Gemma family (its
norms compute ``x * (1 + w)``; llama.cpp's ``x * w``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from mlxrt.loading.gguf_format import GGUFFile, UnsupportedGGUF
from mlxrt.loading.gguf_format import metadata_value as _md

__all__ = ["ArchPlan", "plan_architecture", "ARCHITECTURES", "VISION_PREFIXES"]


@attrs.frozen
class ArchPlan:
    """How one GGUF becomes an HF checkpoint: its ``config`` and the GGUF -> HF tensor names."""

    config: dict[str, Any]
    names: dict[str, str]  # GGUF tensor name -> HF parameter name
    permute_qk: bool  # llama.cpp's interleaved Q/K rows to undo
    norm_plus_one: bool  # Gemma: the stored RMSNorm weights are w + 1
    skipped: frozenset[str]  # GGUF tensors folded into the config (rope factors)


class _Meta:
    """``{arch}.key`` lookups with errors that name the missing key."""

    def __init__(self, md: dict[str, Any], arch: str):
        self.md, self.arch = md, arch

    def get(self, key: str, default: Any = None) -> Any:
        return _md(self.md, f"{self.arch}.{key}", default)

    def need(self, key: str) -> Any:
        v = self.get(key)
        if v is None:
            raise UnsupportedGGUF(f"GGUF metadata is missing {self.arch}.{key}")
        if isinstance(v, list):
            if len(set(v)) != 1:
                raise UnsupportedGGUF(f"per-layer {self.arch}.{key} ({sorted(set(v))}) is not supported")
            v = v[0]
        return v


def _common(m: _Meta, vocab_rows: int) -> dict[str, Any]:
    hidden = int(m.need("embedding_length"))
    heads = int(m.need("attention.head_count"))
    kv = m.get("attention.head_count_kv")
    kv_heads = int(m.need("attention.head_count_kv")) if kv is not None else heads
    head_dim = int(m.get("attention.key_length", hidden // heads))
    if int(m.get("attention.value_length", head_dim)) != head_dim:
        raise UnsupportedGGUF("attention.key_length differs from attention.value_length")
    eps = float(m.get("attention.layer_norm_rms_epsilon", 1e-5))
    cfg: dict[str, Any] = {
        "hidden_size": hidden,
        "num_hidden_layers": int(m.need("block_count")),
        "intermediate_size": int(m.need("feed_forward_length")) if m.get("feed_forward_length") else 0,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(f"{eps:.6g}"),  # stored as float32: back to the decimal it was
        "rope_theta": float(m.get("rope.freq_base", 10000.0)),
        "vocab_size": int(m.get("vocab_size", vocab_rows)),
        "hidden_act": "silu",
    }
    if m.get("context_length"):
        cfg["max_position_embeddings"] = int(m.get("context_length"))
    rope_dim = int(m.get("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        cfg["partial_rotary_factor"] = rope_dim / head_dim
    stype = m.get("rope.scaling.type")
    factor = m.get("rope.scaling.factor") or m.get("rope.scale_linear")
    if stype in (None, "none") and m.get("rope.scale_linear"):
        stype = "linear"
    if stype == "linear" and factor and float(factor) != 1.0:
        cfg["rope_scaling"] = {"rope_type": "linear", "type": "linear", "factor": float(factor)}
    elif stype == "yarn" and factor:
        cfg["rope_scaling"] = {"rope_type": "yarn", "type": "yarn", "factor": float(factor),
                               "original_max_position_embeddings":
                                   int(m.get("rope.scaling.original_context_length", 0)) or None}
    elif stype not in (None, "none", "linear"):
        raise UnsupportedGGUF(f"RoPE scaling type {stype!r} is not supported")
    return cfg


def llama3_rope_scaling(freq_factors: Any, theta: float, head_dim: int) -> dict[str, Any]:
    """Recover HF ``rope_scaling`` (type llama3) from llama.cpp's ``rope_freqs`` tensor."""
    import numpy as np

    ff = np.asarray(freq_factors, dtype=np.float64).reshape(-1)
    if ff.shape[0] != head_dim // 2:
        raise UnsupportedGGUF(f"rope_freqs has {ff.shape[0]} entries, expected {head_dim // 2}")
    if np.allclose(ff, 1.0):
        return {}
    factor = float(ff.max())
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv
    for orig in (8192, 4096, 2048, 16384, 32768, 65536, 131072):
        for low in (1.0, 2.0, 0.5):
            for high in (4.0, 2.0, 8.0, 1.0 + low):
                if high <= low:
                    continue
                lw, hw = orig / low, orig / high
                smooth = (orig / wavelen - low) / (high - low)
                exp = np.where(wavelen < hw, 1.0,
                               np.where(wavelen > lw, factor, 1.0 / ((1 - smooth) / factor + smooth)))
                if np.allclose(exp, ff, rtol=1e-4, atol=1e-5):
                    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                            "high_freq_factor": high, "original_max_position_embeddings": orig}
    raise UnsupportedGGUF("rope_freqs tensor does not match any llama3 RoPE scaling this converter can express")


def _llama(g: GGUFFile, m: _Meta, cfg: dict[str, Any]) -> dict[str, Any]:
    if m.get("expert_count"):
        raise UnsupportedGGUF("mixture-of-experts llama GGUFs (Mixtral) are not supported")
    cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
    if "rope_freqs.weight" in g.tensors:
        scaling = llama3_rope_scaling(g.raw("rope_freqs.weight"), cfg["rope_theta"], cfg["head_dim"])
        if scaling:
            cfg["rope_scaling"] = scaling
    names = set(g.tensors)
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    cfg["mlp_bias"] = "blk.0.ffn_up.bias" in names
    return cfg


def _qwen2(g: GGUFFile, m: _Meta, cfg: dict[str, Any]) -> dict[str, Any]:
    cfg.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    return cfg


def _qwen3(g: GGUFFile, m: _Meta, cfg: dict[str, Any]) -> dict[str, Any]:
    cfg.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    return cfg


def _qwen3moe(g: GGUFFile, m: _Meta, cfg: dict[str, Any]) -> dict[str, Any]:
    experts = int(m.need("expert_count"))
    cfg.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
               num_experts=experts, num_experts_per_tok=int(m.need("expert_used_count")),
               moe_intermediate_size=int(m.need("expert_feed_forward_length")),
               decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    cfg["intermediate_size"] = cfg["intermediate_size"] or cfg["moe_intermediate_size"]
    return cfg


def _gemma_scale(cfg: dict[str, Any]) -> int:
    # llama.cpp scales queries by 1/sqrt(head_dim), except Gemma 2/3 27B (1/sqrt(hidden/heads));
    # an int, as transformers' config class (which mlx-lm's tokenizer loader runs) demands
    if cfg["num_hidden_layers"] in (46, 62) and cfg["hidden_size"] in (4608, 5376):
        return cfg["hidden_size"] // cfg["num_attention_heads"]
    return int(cfg["head_dim"])


def _gemma2(g: GGUFFile, m: _Meta, cfg: dict[str, Any]) -> dict[str, Any]:
    cfg.update(model_type="gemma2", architectures=["Gemma2ForCausalLM"], hidden_act="gelu_pytorch_tanh",
               attn_logit_softcapping=float(m.get("attn_logit_softcapping", 50.0)),
               final_logit_softcapping=float(m.get("final_logit_softcapping", 30.0)),
               query_pre_attn_scalar=_gemma_scale(cfg))
    if m.get("attention.sliding_window"):
        cfg["sliding_window"] = int(m.get("attention.sliding_window"))
    return cfg


def _gemma3(g: GGUFFile, m: _Meta, cfg: dict[str, Any]) -> dict[str, Any]:
    cfg.update(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_act="gelu_pytorch_tanh",
               query_pre_attn_scalar=_gemma_scale(cfg),
               sliding_window=int(m.get("attention.sliding_window", 512)),
               # llama.cpp's fixed Gemma 3 pattern: five local layers (RoPE base 10k), one global
               sliding_window_pattern=6, rope_local_base_freq=10000.0)
    if m.get("final_logit_softcapping"):
        cfg["final_logit_softcapping"] = float(m.get("final_logit_softcapping"))
    return cfg


def _phi3(g: GGUFFile, m: _Meta, cfg: dict[str, Any]) -> dict[str, Any]:
    cfg.update(model_type="phi3", architectures=["Phi3ForCausalLM"])
    if "rope_factors_long.weight" in g.tensors:
        cfg["rope_scaling"] = {
            "type": "longrope",
            "long_factor": [float(x) for x in g.raw("rope_factors_long.weight")],
            "short_factor": [float(x) for x in g.raw("rope_factors_short.weight")],
        }
        cfg["original_max_position_embeddings"] = int(m.need("rope.scaling.original_context_length"))
    if m.get("attention.sliding_window"):
        cfg["sliding_window"] = int(m.get("attention.sliding_window"))
    return cfg


#: general.architecture -> (the config builder, the gguf package's MODEL_ARCH name).
ARCHITECTURES: dict[str, Callable[[GGUFFile, _Meta, dict[str, Any]], dict[str, Any]]] = {
    "llama": _llama,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen3moe": _qwen3moe,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "phi3": _phi3,
}
#: Tensor-name prefixes of a vision tower and projector that llama.cpp writes beside the text model.
VISION_PREFIXES = ("v.", "mm.")
_FOLDED = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})


def _hf_names(config: dict[str, Any], arch: str) -> dict[str, str]:
    """GGUF tensor name -> the mlx-lm model's parameter name, for every parameter."""
    import importlib

    import gguf
    from mlx.utils import tree_flatten

    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")  # each is its own module
    model = module.Model(module.ModelArgs.from_dict(config))  # lazy arrays: nothing is computed
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    table = gguf.get_tensor_name_map(arch_id, config["num_hidden_layers"])
    out: dict[str, str] = {}
    for name, _ in tree_flatten(model.parameters()):
        base, _, suffix = name.rpartition(".")
        gname = table.get_name(base.replace(".switch_mlp.", ".experts."))
        if gname is None:
            raise UnsupportedGGUF(f"no GGUF name for {arch} parameter {name!r}")
        out[f"{gname}.{suffix}"] = name
    return out


def plan_architecture(g: GGUFFile) -> ArchPlan:
    """The config and tensor names of ``g``'s architecture, or :class:`UnsupportedGGUF`."""
    arch = g.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedGGUF(f"GGUF architecture {arch!r} is not supported "
                              f"(supported: {', '.join(ARCHITECTURES)})")
    if "token_embd.weight" not in g.tensors:
        raise UnsupportedGGUF("GGUF has no token_embd.weight tensor")
    m = _Meta(g.metadata, arch)
    cfg = ARCHITECTURES[arch](g, m, _common(m, g.tensors["token_embd.weight"].shape[0]))
    cfg["tie_word_embeddings"] = "output.weight" not in g.tensors
    names = _hf_names(cfg, arch)
    # a vision tower in the same file (Ollama's Gemma 3 blobs): a text-only load drops it
    tower = {n for n in g.tensors if n.startswith(VISION_PREFIXES)}
    return ArchPlan(config=cfg, names=names, permute_qk=arch == "llama",
                    norm_plus_one=arch in ("gemma2", "gemma3"), skipped=frozenset(_FOLDED & set(g.tensors) | tower))


def unpermute_rows(x: Any, n_head: int) -> Any:
    """Undo llama.cpp's interleaving of Q/K rows (HF row ``h*hd + s*hd/2 + i`` is stored at
    ``h*hd + 2*i + s``). Whole rows move, so it holds for packed quantized rows, their per-row
    scales and biases, and 1-D biases alike."""
    rows = x.shape[0]
    if rows % (2 * n_head):
        raise UnsupportedGGUF(f"cannot un-permute {rows} rows over {n_head} heads")
    rest = tuple(x.shape[1:])
    return x.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(x.shape)
