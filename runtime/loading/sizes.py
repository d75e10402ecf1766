"""What a checkpoint weighs and caches, read from its files without loading anything: the
safetensors headers (the JSON header of each file, never the tensors), the weights summary
(:func:`weights_summary`: bytes, parameters, stored and activation dtypes), the KV cost per token
from ``config.json`` (:func:`static_kv`, laid out as the :mod:`mlxrt.loading.fit` docstring says),
and the budget assumed when none is given (:func:`machine_budget`).

Its own module below the fit check (:mod:`mlxrt.loading.fit`), the served dtype
(:mod:`mlxrt.loading.dtype_choice`), the weights loader and the GGUF library, which all read these
facts, so that they import it and not each other.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mlxrt.engine.memory import KVCost
from mlxrt.errors import ModelLoadError

__all__ = ["TensorInfo", "WeightsSummary", "read_safetensors_header", "weights_summary", "static_kv",
           "context_window", "read_config", "machine_budget", "DEFAULT_CONTEXT"]

#: Context ``mlxrt fit`` and ``GET /fit`` assess when none is given (mlx-bun's typical context).
DEFAULT_CONTEXT = 8192
#: Share of physical memory taken as the budget when none is given (Metal's wired limit).
MACHINE_SHARE = 0.75
#: Largest safetensors header read; real ones are at most a few MB.
_MAX_HEADER = 100 * 1024 * 1024

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
               "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
_FLOAT = {"F64", "F32", "F16", "BF16"}
_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
#: Tensor-name fragments of parts a text-only load drops (vision/audio towers, MTP heads).
_NOT_TEXT = ("visual.", "vision_tower", "vision_model", "multi_modal_projector", "embed_vision",
             "audio_tower", "embed_audio", "mtp.")
#: Sidecar weight files that are not part of the text model (mlx-bun's vision sidecar).
_SIDECARS = ("optiq_vision.safetensors",)


@attrs.frozen
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors a ``.safetensors`` file holds, from its JSON header alone.

    :raises ModelLoadError: The file is not a readable safetensors file.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ValueError("shorter than the 8-byte header length")
            (size,) = struct.unpack("<Q", head)
            if size > _MAX_HEADER:
                raise ValueError(f"header of {size} bytes is implausible")
            header = json.loads(f.read(size))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a readable safetensors file ({exc})") from exc
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        begin, end = entry.get("data_offsets", (0, 0))
        tensors[name] = TensorInfo(name, str(entry.get("dtype")), tuple(entry.get("shape", ())), end - begin)
    return tensors


@attrs.frozen
class WeightsSummary:
    """What a folder's safetensors hold. ``weight_bytes`` is what the text model loads;
    ``other_bytes`` the tensors a text-only load drops (vision/audio towers, sidecars, MTP);
    ``stored_dtype`` the text weights' dtype as :func:`mlxrt.loading.dtype_choice.stored_dtype`
    names it (``quantized 4-bit``, ``bfloat16``, …)."""

    weight_bytes: int
    other_bytes: int
    params: int
    activation_dtype: str
    files: int
    stored_dtype: str = "float32"


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, Mapping) else dict(config)


def _quant_group(config: Mapping[str, Any], tensor: str) -> int:
    quant = config.get("quantization") or config.get("quantization_config") or {}
    module = tensor.rsplit(".", 1)[0]
    override = quant.get(module) if isinstance(quant, Mapping) else None
    if isinstance(override, Mapping) and isinstance(override.get("group_size"), int):
        return override["group_size"]
    group = quant.get("group_size") if isinstance(quant, Mapping) else None
    return group if isinstance(group, int) and group > 0 else 64


def _params(tensors: Mapping[str, TensorInfo], config: Mapping[str, Any]) -> int:
    """Parameter count; packed quantized weights count their unpacked elements."""
    total = 0
    for name, t in tensors.items():
        if name.endswith((".scales", ".biases")) and name.rsplit(".", 1)[0] + ".weight" in tensors:
            continue
        count = 1
        for dim in t.shape:
            count *= dim
        scales = tensors.get(name.removesuffix(".weight") + ".scales")
        if t.dtype == "U32" and scales is not None and t.shape and scales.shape:
            # packed: shape[-1] uint32 words hold scales.shape[-1] × group_size inputs
            inputs = scales.shape[-1] * _quant_group(config, name)
            count = count // t.shape[-1] * inputs
        total += count
    return total


def _stored_dtype(tensors: Mapping[str, TensorInfo], config: Mapping[str, Any]) -> str:
    """``quantized N-bit`` when any weight is packed (bits from the packed and scales widths),
    else the float dtype holding the most parameters."""
    bits: set[int] = set()
    sizes: dict[str, int] = {}
    for name, t in tensors.items():
        scales = tensors.get(name.removesuffix(".weight") + ".scales")
        if t.dtype == "U32" and scales is not None and t.shape and scales.shape and scales.shape[-1]:
            bits.add(t.shape[-1] * 32 // (scales.shape[-1] * _quant_group(config, name)))
        elif t.dtype in _FLOAT:
            count = 1
            for dim in t.shape:
                count *= dim
            sizes[t.dtype] = sizes.get(t.dtype, 0) + count
    if bits:
        return f"quantized {'/'.join(map(str, sorted(bits)))}-bit"
    return _DTYPE_NAMES[max(sizes, key=sizes.__getitem__)] if sizes else "float32"


def _activation_dtype(tensors: Mapping[str, TensorInfo]) -> str:
    for suffix in ("embed_tokens.weight", "embed_tokens.scales"):
        for name, t in tensors.items():
            if name.endswith(suffix) and t.dtype in _FLOAT:
                return _DTYPE_NAMES[t.dtype]
    by_dtype: dict[str, int] = {}
    for t in tensors.values():
        if t.dtype in _FLOAT:
            by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
    return _DTYPE_NAMES[max(by_dtype, key=by_dtype.__getitem__)] if by_dtype else "bfloat16"


def weights_summary(folder: Path, config: Mapping[str, Any] | None = None) -> WeightsSummary:
    """Read every ``*.safetensors`` header of ``folder``.

    :raises ModelLoadError: No safetensors file, or an unreadable one.
    """
    config = config if config is not None else read_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no .safetensors weights")
    text: dict[str, TensorInfo] = {}
    other = 0
    for path in files:
        tensors = read_safetensors_header(path)
        if path.name in _SIDECARS:
            other += sum(t.nbytes for t in tensors.values())
            continue
        for name, t in tensors.items():
            if any(part in name for part in _NOT_TEXT):
                other += t.nbytes
            else:
                text[name] = t
    weights = sum(t.nbytes for t in text.values())
    c = _text_config(config)
    return WeightsSummary(weights, other, _params(text, c), _activation_dtype(text), len(files),
                          _stored_dtype(text, c))


def _int(c: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    value = c.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _layer_kinds(c: Mapping[str, Any], layers: int) -> list[str]:
    interval = _int(c, "full_attention_interval")
    if interval and _int(c, "linear_num_value_heads"):  # Qwen3.5 / Qwen3-Next, as mlx-lm decides
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    types = c.get("layer_types")
    if isinstance(types, list) and len(types) >= layers:
        return [str(t) for t in types[:layers]]
    pattern = _int(c, "sliding_window_pattern")
    if pattern and _int(c, "sliding_window"):  # Gemma 3, Cohere 2
        return ["full_attention" if i % pattern == pattern - 1 else "sliding_attention" for i in range(layers)]
    return ["full_attention"] * layers


def _linear_state_bytes(c: Mapping[str, Any], dtype_bytes: int) -> int:
    kh, kd = _int(c, "linear_num_key_heads", 0), _int(c, "linear_key_head_dim", 0)
    vh, vd = _int(c, "linear_num_value_heads", 0), _int(c, "linear_value_head_dim", 0)
    conv = (_int(c, "linear_conv_kernel_dim", 4) - 1) * (2 * kh * kd + vh * vd) * dtype_bytes
    return conv + vh * vd * kd * 4  # the recurrent state is float32 whatever the model's dtype


def static_kv(config: Mapping[str, Any], dtype_bytes: int) -> KVCost:
    """One request's cache cost from the config: bytes per token of context and fixed bytes."""
    c = _text_config(config)
    layers = _int(c, "num_hidden_layers")
    heads = _int(c, "num_attention_heads")
    if not layers or not heads:
        raise ModelLoadError("config.json lacks num_hidden_layers / num_attention_heads: cannot size the KV cache")
    kv_heads = _int(c, "num_key_value_heads") or heads
    head_dim = _int(c, "head_dim") or (_int(c, "hidden_size", 0) // heads)
    window = _int(c, "sliding_window")
    owners = layers - (_int(c, "num_kv_shared_layers", 0) or 0)
    per_token = fixed = 0
    for kind in _layer_kinds(c, layers)[:owners]:
        if kind == "linear_attention":
            fixed += _linear_state_bytes(c, dtype_bytes)
            continue
        dim, kvh = head_dim, kv_heads
        if kind == "full_attention" and _int(c, "global_head_dim"):
            dim = c["global_head_dim"]
            if c.get("attention_k_eq_v") and _int(c, "num_global_key_value_heads"):
                kvh = c["num_global_key_value_heads"]
        cost = 2 * kvh * dim * dtype_bytes
        if kind == "sliding_attention" and window:
            fixed += cost * window
        else:
            per_token += cost
    return KVCost(per_token=per_token, fixed=fixed)


def machine_budget() -> int:
    """The budget assumed when none is given: :data:`MACHINE_SHARE` of physical memory."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 16 * 10**9
    return int(ram * MACHINE_SHARE)


def context_window(config: Mapping[str, Any]) -> int | None:
    """The model's context window (``max_position_embeddings``, the text config's for a
    multimodal checkpoint), or ``None`` when the config names none."""
    return _int(_text_config(config), "max_position_embeddings")


def read_config(folder: Path) -> dict[str, Any]:
    """``folder``'s config.json as a dict.

    :raises ModelLoadError: It cannot be read, or is no JSON object.
    """
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {folder / 'config.json'}: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{folder / 'config.json'} is not a JSON object")
    return config
