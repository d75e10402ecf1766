"""Convert a llama-architecture GGUF file into a Hugging Face style folder.

``convert_gguf(gguf_path, out_dir)`` writes a folder that ``mlx_lm.load`` (and, for
the tokenizer and config, ``transformers``) can read:

* ``config.json`` -- ``model_type: llama`` with every hyperparameter taken from the
  GGUF metadata, plus an mlx-lm ``quantization`` block (default bits/group size and
  per-module overrides where a module's bits differ, ``false`` for modules kept in
  floating point);
* ``model.safetensors`` -- HF llama tensor names; GGUF ``Q4_0``/``Q4_1``/``Q8_0``
  tensors stay packed in mlx's affine format (``X.weight``/``X.scales``/``X.biases``,
  group size 32) exactly as :func:`mlx.core.load` decodes them;
* ``tokenizer.json`` / ``tokenizer_config.json`` -- a byte-level BPE tokenizer rebuilt
  with the ``tokenizers`` library from ``tokenizer.ggml.tokens``/``merges``, with the
  pre-tokenizer named by ``tokenizer.ggml.pre`` and the chat template;
* ``generation_config.json`` -- BOS/EOS ids;
* ``mlxrt_gguf.json`` -- where the folder came from (source size and mtime), so a
  cache can tell when its source changed.

llama.cpp stores the rows of the Q and K projections permuted for its interleaved
("normal") RoPE.  The converter undoes that permutation -- on packed quantized rows
and on their scales/biases alike, since it only reorders whole rows -- so the result
is an ordinary HF llama checkpoint that runs with the usual half-split RoPE.

Supported tensor types are the ones ``mx.load`` decodes losslessly and natively:
F32, F16, Q4_0, Q4_1 and Q8_0.  (``mx.load`` silently dequantizes some others, e.g.
Q4_K/Q6_K/BF16, to float16 and fails on others, e.g. Q5_0; those are rejected up
front with :class:`UnsupportedGGUF` naming the tensor and its type.)  Only
``general.architecture == "llama"`` with a ``gpt2`` (byte-level BPE) tokenizer is
supported for now.

Floating-point tensors (norms, F16/F32 matrices, and the f16 scales/biases of the
quantized ones) are written as float16 when MLX runs on a GPU and as float32 on a
CPU-only MLX (``dtype="auto"``, see :func:`auto_float_dtype`): MLX's CPU float16
kernels are ~25x slower, and widening f16 to f32 is lossless.

The module is light to import: mlx, numpy and tokenizers are imported inside the
functions that need them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from mlxrt.sources.gguf_format import (
    GGML_TYPE_NAMES,
    SUPPORTED_TENSOR_TYPES,
    GGUFHeader,
    UnsupportedGGUF,
    read_gguf_header,
)
from mlxrt.sources.gguf_format import metadata_value as _md
from mlxrt.sources.gguf_tokenizer import build_tokenizer, tokenizer_config

__all__ = [
    "UnsupportedGGUF",
    "GGUFHeader",
    "GGML_TYPE_NAMES",
    "SUPPORTED_TENSOR_TYPES",
    "CONVERTER_VERSION",
    "MARKER_FILE",
    "auto_float_dtype",
    "read_gguf_header",
    "build_tokenizer",
    "convert_gguf",
]

#: Bumped whenever the output of :func:`convert_gguf` changes, so caches re-convert.
CONVERTER_VERSION = 1

#: Provenance file written into every converted folder.
MARKER_FILE = "mlxrt_gguf.json"

_GROUP_SIZE = 32  # every supported ggml block format has 32 weights per block


# --------------------------------------------------------------------------------------
# Model config
# --------------------------------------------------------------------------------------

def _llama3_rope_scaling(freq_factors, theta: float, head_dim: int) -> dict[str, Any]:
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
                               np.where(wavelen > lw, factor,
                                        1.0 / ((1 - smooth) / factor + smooth)))
                if np.allclose(exp, ff, rtol=1e-4, atol=1e-5):
                    return {"rope_type": "llama3", "factor": factor,
                            "low_freq_factor": low, "high_freq_factor": high,
                            "original_max_position_embeddings": orig}
    raise UnsupportedGGUF("rope_freqs tensor does not match any llama3 RoPE scaling "
                          "this converter can express")


def _model_config(md: dict[str, Any], vocab_rows: int) -> dict[str, Any]:
    a = "llama."

    def need(key: str) -> Any:
        v = md.get(a + key)
        if v is None:
            raise UnsupportedGGUF(f"GGUF metadata is missing {a + key}")
        return v

    if md.get(a + "expert_count"):
        raise UnsupportedGGUF("mixture-of-experts llama GGUFs (llama.expert_count) "
                              "are not supported")
    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = int(_md(md, a + "attention.head_count_kv", heads))
    if isinstance(md.get(a + "attention.head_count_kv"), list) or isinstance(
            md.get(a + "attention.head_count"), list):
        raise UnsupportedGGUF("per-layer head counts are not supported")
    head_dim = int(_md(md, a + "attention.key_length", hidden // heads))
    v_dim = int(_md(md, a + "attention.value_length", head_dim))
    if v_dim != head_dim:
        raise UnsupportedGGUF(f"key_length {head_dim} != value_length {v_dim}")
    rope_dim = int(_md(md, a + "rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise UnsupportedGGUF(f"partial RoPE (rope.dimension_count {rope_dim} != head_dim "
                              f"{head_dim}) is not supported")
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(_md(md, a + "attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_md(md, a + "rope.freq_base", 10000.0)),
        "vocab_size": int(_md(md, a + "vocab_size", vocab_rows)),
    }
    if md.get(a + "context_length"):
        cfg["max_position_embeddings"] = int(md[a + "context_length"])
    # rms eps as stored is float32; round to a tidy decimal when that is what it was
    eps = cfg["rms_norm_eps"]
    cfg["rms_norm_eps"] = float(f"{eps:.6g}")
    stype = md.get(a + "rope.scaling.type")
    factor = md.get(a + "rope.scaling.factor") or md.get(a + "rope.scale_linear")
    if stype in (None, "none") and md.get(a + "rope.scale_linear"):
        stype = "linear"
    if stype not in (None, "none"):
        if stype != "linear":
            raise UnsupportedGGUF(f"RoPE scaling type {stype!r} is not supported")
        if factor and float(factor) != 1.0:
            cfg["rope_scaling"] = {"rope_type": "linear", "type": "linear",
                                   "factor": float(factor)}
    return cfg


# --------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------

_LAYER_MAP = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_MAP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
            "output": "lm_head"}
_MATRIX_MODULES = {"token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output",
                   "ffn_gate", "ffn_up", "ffn_down"}


def _hf_module(gguf_module: str, n_layers: int) -> tuple[str, str]:
    """``blk.3.attn_q`` -> (``model.layers.3.self_attn.q_proj``, ``attn_q``)."""
    if gguf_module in _TOP_MAP:
        return _TOP_MAP[gguf_module], gguf_module
    parts = gguf_module.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_MAP:
        if int(parts[1]) >= n_layers:
            raise UnsupportedGGUF(f"tensor {gguf_module} beyond block_count {n_layers}")
        return f"model.layers.{parts[1]}.{_LAYER_MAP[parts[2]]}", parts[2]
    raise UnsupportedGGUF(f"unexpected tensor {gguf_module!r} for a llama GGUF")


def _unpermute_rows(x, n_head: int):
    """Undo llama.cpp's ``permute`` (convert_hf_to_gguf.py) on the leading axis.

    llama.cpp writes HF row ``h*hd + s*hd/2 + i`` at ``h*hd + 2*i + s``; this puts the
    rows back.  It only moves whole rows, so it is valid on packed quantized weights and
    on their per-row scales/biases as well as on 1-D biases.
    """
    rows = x.shape[0]
    if rows % (2 * n_head):
        raise UnsupportedGGUF(f"cannot un-permute {rows} rows over {n_head} heads")
    rest = tuple(x.shape[1:])
    return x.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(x.shape)


def _check_tensor_types(header: GGUFHeader) -> Counter:
    counts: Counter = Counter()
    for name, (t, _shape) in header.tensors.items():
        tname = GGML_TYPE_NAMES.get(t, f"type#{t}")
        if tname not in SUPPORTED_TENSOR_TYPES:
            raise UnsupportedGGUF(
                f"tensor {name!r} has GGUF type {tname}, which is not supported; "
                f"supported types: {', '.join(SUPPORTED_TENSOR_TYPES)}")
        counts[tname] += 1
    return counts


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def auto_float_dtype() -> str:
    """The float dtype ``dtype="auto"`` uses for quantized/F16 GGUFs on this machine.

    ``"float16"`` when MLX runs on a GPU.  On a CPU-only MLX, ``"float32"``: there
    MLX's float16 kernels (quantized matmul included) are ~25x slower than float32
    (SmolLM2-135M Q4_1: 0.2 vs 5.8 tok/s decode), and widening the f16 scales/biases
    to float32 is lossless.
    """
    import mlx.core as mx

    try:
        on_gpu = mx.default_device().type == mx.DeviceType.gpu
    except Exception:  # pragma: no cover - very old mlx
        on_gpu = False
    return "float16" if on_gpu else "float32"


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike,
                 *, overwrite: bool = False, dtype: str = "auto") -> Path:
    """Convert a llama GGUF file into an HF-format folder loadable by ``mlx_lm.load``.

    Args:
        gguf_path: the ``.gguf`` file.
        out_dir: folder to create.  It is written as a temporary sibling folder and
            renamed into place at the end, so a failed or interrupted conversion never
            leaves a half-written ``out_dir``.
        overwrite: replace ``out_dir`` if it exists (otherwise ``FileExistsError``).
        dtype: dtype of every floating-point tensor written (norms, F16/F32 matrices
            and the scales/biases of quantized ones): ``"auto"`` (float32 for an
            all-F32 file; otherwise :func:`auto_float_dtype`, i.e. float16 on a GPU and
            float32 on a CPU-only MLX), ``"float16"``, ``"bfloat16"`` (lossy for the
            f16 scales), ``"float32"``, or ``"keep"`` (as ``mx.load`` returns them:
            F32 norms, f16 scales).

    Returns:
        ``Path(out_dir)``.

    Raises:
        UnsupportedGGUF: architecture other than llama, an unsupported tensor type
            (the message names the tensor and its type), tokenizer or RoPE variant.
    """
    import mlx.core as mx

    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists (pass overwrite=True to replace it)")
    stat = gguf_path.stat()

    header = read_gguf_header(gguf_path)
    md = header.metadata
    arch = md.get("general.architecture")
    if arch != "llama":
        raise UnsupportedGGUF(f"GGUF architecture {arch!r} is not supported "
                              "(only 'llama')")
    type_counts = _check_tensor_types(header)
    if "token_embd.weight" not in header.tensors:
        raise UnsupportedGGUF("GGUF has no token_embd.weight tensor")
    vocab_rows = header.tensors["token_embd.weight"][1][0]

    config = _model_config(md, vocab_rows)
    n_layers = config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    tied = "output.weight" not in header.tensors
    config["tie_word_embeddings"] = tied

    if "rope_freqs.weight" in header.tensors:
        ff = mx.load(str(gguf_path))["rope_freqs.weight"]  # small F32 tensor
        scaling = _llama3_rope_scaling(ff.tolist(), config["rope_theta"], config["head_dim"])
        if scaling:
            config["rope_scaling"] = scaling

    tokens = md.get("tokenizer.ggml.tokens")
    if not tokens:
        raise UnsupportedGGUF("GGUF has no tokenizer (tokenizer.ggml.tokens)")
    tokenizer = build_tokenizer(md)  # fail early, before loading the weights

    has_f16 = any(header.type_name(n) == "F16" for n in header.tensors)
    has_quant = any(SUPPORTED_TENSOR_TYPES[header.type_name(n)] for n in header.tensors)
    if dtype == "auto":
        dtype_name = auto_float_dtype() if (has_quant or has_f16) else "float32"
    else:
        dtype_name = dtype
    try:
        target = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32,
                  "keep": None}[dtype_name]
    except KeyError:
        raise ValueError(f"dtype must be auto/keep/float16/bfloat16/float32, "
                         f"not {dtype!r}") from None

    raw = mx.load(str(gguf_path))
    weights: dict[str, Any] = {}
    module_bits: dict[str, int | None] = {}  # HF module path -> bits / None (float)
    attn_bias = mlp_bias = False
    for gname, (_t, _shape) in header.tensors.items():
        if gname == "rope_freqs.weight":
            continue
        gmod, _, suffix = gname.rpartition(".")
        if suffix not in ("weight", "bias"):
            raise UnsupportedGGUF(f"unexpected tensor {gname!r} for a llama GGUF")
        hf_mod, kind = _hf_module(gmod, n_layers)
        bits = SUPPORTED_TENSOR_TYPES[header.type_name(gname)]
        parts = {suffix: raw[gname]}
        if bits:
            if suffix != "weight":
                raise UnsupportedGGUF(f"quantized bias tensor {gname!r}")
            parts["scales"] = raw[f"{gmod}.scales"]
            parts["biases"] = raw[f"{gmod}.biases"]
        if suffix == "weight" and kind in _MATRIX_MODULES:
            module_bits[hf_mod] = bits
        if suffix == "bias":
            if kind.startswith("attn_"):
                attn_bias = True
            elif kind.startswith("ffn_"):
                mlp_bias = True
        for part, arr in parts.items():
            if kind == "attn_q":
                arr = _unpermute_rows(arr, heads)
            elif kind == "attn_k":
                arr = _unpermute_rows(arr, kv_heads)
            if target is not None and mx.issubdtype(arr.dtype, mx.floating) \
                    and arr.dtype != target:
                arr = arr.astype(target)  # float tensors and quant scales/biases
            weights[f"{hf_mod}.{part}"] = arr
    if attn_bias:
        config["attention_bias"] = True
    if mlp_bias:
        config["mlp_bias"] = True

    # mlx-lm quantization block: most common bits as the default, overrides elsewhere
    qbits = [b for b in module_bits.values() if b]
    if qbits:
        default_bits = Counter(qbits).most_common(1)[0][0]
        quant: dict[str, Any] = {"group_size": _GROUP_SIZE, "bits": default_bits,
                                 "mode": "affine"}
        for mod in sorted(module_bits):
            b = module_bits[mod]
            if b is None:
                quant[mod] = False
            elif b != default_bits:
                quant[mod] = {"group_size": _GROUP_SIZE, "bits": b, "mode": "affine"}
        config["quantization"] = quant
        config["quantization_config"] = dict(quant)

    bos_id = md.get("tokenizer.ggml.bos_token_id")
    eos_id = md.get("tokenizer.ggml.eos_token_id")
    eot_id = md.get("tokenizer.ggml.eot_token_id")
    if bos_id is not None:
        config["bos_token_id"] = int(bos_id)
    if eos_id is not None:
        config["eos_token_id"] = int(eos_id)
    config["torch_dtype"] = "float16" if dtype_name == "keep" else dtype_name
    gen: dict[str, Any] = {"do_sample": False}
    if bos_id is not None:
        gen["bos_token_id"] = int(bos_id)
    eos_ids = [int(i) for i in (eos_id, eot_id) if i is not None]
    eos_ids = list(dict.fromkeys(eos_ids))
    if eos_ids:
        gen["eos_token_id"] = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    pad_id = md.get("tokenizer.ggml.padding_token_id")
    if pad_id is not None:
        gen["pad_token_id"] = int(pad_id)

    marker = {
        "converter": "mlxrt.sources.gguf",
        "converter_version": CONVERTER_VERSION,
        "source": str(gguf_path.resolve()),
        "source_size": stat.st_size,
        "source_mtime_ns": stat.st_mtime_ns,
        "dtype": dtype_name,
        "gguf_version": header.version,
        "name": md.get("general.name"),
        "tensor_types": dict(sorted(type_counts.items())),
    }

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the result is an ordinary folder
        _write_json(tmp / "config.json", dict(sorted(config.items())))
        mx.save_safetensors(str(tmp / "model.safetensors"), weights,
                            metadata={"format": "mlx"})
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json",
                    tokenizer_config(md, config.get("max_position_embeddings")))
        _write_json(tmp / "generation_config.json", gen)
        _write_json(tmp / MARKER_FILE, marker)
        if out_dir.exists() or out_dir.is_symlink():
            trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, trash / "old")
            os.replace(tmp, out_dir)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
