"""A model folder's architecture and weights, built without importing ``mlx_lm.utils``.

``mlx_lm.utils.load_model`` is the reference, and the fallback: importing its module imports
transformers and huggingface-hub (~1.4 s and ~45 MB of a server's start, docs/performance.md).
The common checkpoint — an mlx-lm architecture, safetensors weights, unquantized or quantized
by MLX itself (``"quantization"`` in config.json, affine mode; the embedded SmolLM2 is one) — is
built here directly from ``mlx_lm.models.<type>``, and :func:`dequantize_model` stands in for
mlx-lm's (``--dtype`` casts). Anything else (legacy ``quantization_config`` formats such as AWQ,
GPTQ, FP8 or ModelOpt, mx/nv-fp modes, a custom ``model_file``, activation quantization,
non-finite numbers in config.json) goes to mlx-lm unchanged.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["check_layer_count", "dequantize_model", "eos_token_ids", "load_architecture_and_weights"]

ModelClasses = tuple[type, type]


class _NeedsMlxLm(Exception):
    """This checkpoint uses something only mlx-lm's loader handles."""


def load_architecture_and_weights(path: Path, *, classes: ModelClasses | None = None,
                                  lazy: bool = False) -> tuple[Any, dict[str, Any]]:
    """The model of the folder ``path`` with its weights, and its config (``eos_token_id``
    taken from generation_config.json when that names one, as mlx-lm does).

    :param classes: ``(Model, ModelArgs)`` of an architecture mlx-lm lacks (a family's own).
    :param lazy: Leave the weights unread until evaluated.
    :raises FileNotFoundError: No ``model*.safetensors`` in the folder.
    :raises ValueError: An unknown model type, or weights that do not fit the architecture.
    """
    check_layer_count(path)
    try:
        return _load(path, classes, lazy)
    except _NeedsMlxLm:
        from mlx_lm.utils import load_model

        kwargs: dict[str, Any] = {}
        if classes is not None:
            kwargs["get_model_classes"] = lambda config: classes  # mlx-lm passes config=
        return load_model(path, lazy=lazy, **kwargs)


#: ``…layers.12.…``: the layer index in a weight's name, after the stack's name.
_LAYER = re.compile(r"^(.*?)\blayers\.(\d+)\.")


def check_layer_count(path: Path) -> None:
    """Refuse, from config.json and the safetensors headers alone (no weight is read, nothing
    is built), a config that declares more layers than the weights hold: building 10,000
    layers of modules took seconds and left ~1 GB behind before the missing weights were
    noticed. Folders whose headers cannot be read, or that name no layers, are left to the
    loader.

    :raises ValueError: the config's ``num_hidden_layers`` exceeds every layer stack in the weights.
    """
    from mlxrt.errors import ModelLoadError
    from mlxrt.loading.sizes import read_safetensors_header

    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(config, dict):
        return
    text = config.get("text_config")
    declared = (text if isinstance(text, dict) else {}).get("num_hidden_layers", config.get("num_hidden_layers"))
    if not isinstance(declared, int) or isinstance(declared, bool):
        return
    stacks: dict[str, int] = {}
    try:
        for file in sorted(path.glob("model*.safetensors")):
            for name in read_safetensors_header(file):
                if (found := _LAYER.match(name)) is not None:
                    stacks[found[1]] = max(stacks.get(found[1], 0), int(found[2]) + 1)
    except ModelLoadError:
        return
    if stacks and declared > max(stacks.values()):
        raise ValueError(f"config.json declares {declared} layers but the weights hold at most "
                         f"{max(stacks.values())}; refused before building the model")


def eos_token_ids(path: Path) -> Any:
    """The ``eos_token_id`` of the config :func:`load_architecture_and_weights` returns for ``path``
    (read without the weights, so that the tokenizer can load beside them)."""
    return _with_generation_config(path, json.loads((path / "config.json").read_text(encoding="utf-8"))
                                   ).get("eos_token_id")


def _read_config(path: Path) -> dict[str, Any]:
    text = (path / "config.json").read_text(encoding="utf-8")
    if "__float__" in text:  # mlx-lm's tag for a non-finite number
        raise _NeedsMlxLm
    return _with_generation_config(path, json.loads(text))


def _with_generation_config(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    try:
        generation = json.loads((path / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        generation = {}
    if isinstance(generation, dict) and generation.get("eos_token_id"):
        config["eos_token_id"] = generation["eos_token_id"]
    return config


def _classes_for(config: dict[str, Any]) -> ModelClasses:
    from mlxrt.compat import mlx_lm_remappings

    tables = mlx_lm_remappings()
    if tables is None:  # mlx-lm's tables could not be read: its own loader knows them
        raise _NeedsMlxLm
    by_type, by_architecture = tables
    model_type = config["model_type"]
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    if any((model_type, a) in by_architecture for a in architectures):
        raise _NeedsMlxLm
    module_name = by_type.get(model_type, model_type)
    try:
        module = importlib.import_module(f"mlx_lm.models.{module_name}")
    except ImportError as exc:
        raise ValueError(f"Model type {model_type} not supported.") from exc
    return module.Model, module.ModelArgs


def _load(path: Path, classes: ModelClasses | None, lazy: bool) -> tuple[Any, dict[str, Any]]:
    import mlx.core as mx

    config = _read_config(path)
    text_config = config.get("text_config")
    # mlx-lm reads "quantization_config" only without "quantization" (a legacy format); MLX's own
    # checkpoints (mlx_lm.convert, mlxrt's GGUF conversion) carry both, the same, for Hugging Face.
    legacy = "quantization_config" in config and "quantization" not in config
    if (config.get("model_file") is not None or config.get("quantize_activations") or legacy
            or (isinstance(text_config, dict) and "quantization_config" in text_config)
            or (path / "hf_quant_config.json").exists()):
        raise _NeedsMlxLm
    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"No safetensors found in {path}")
    model_class, args_class = classes if classes is not None else _classes_for(config)
    weights: dict[str, Any] = {}
    for f in files:
        weights.update(mx.load(str(f)))
    model = model_class(args_class.from_dict(config))
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    quantization = config.get("quantization")
    if quantization is not None:
        _quantize(model, quantization, weights)
    model.eval()
    model.load_weights(list(weights.items()), strict=True)
    if not lazy:
        mx.eval(model.parameters())
    return model, config


def _quantize(model: Any, quantization: dict[str, Any], weights: dict[str, Any]) -> None:
    """Turn the layers stored quantized into quantized layers (affine mode only: the others
    keep their scales as uint8, and mlx-lm knows their rules)."""
    import mlx.core as mx
    import mlx.nn as nn

    if quantization.get("mode", "affine") != "affine":
        raise _NeedsMlxLm

    def stored_as(layer_path: str, module: Any) -> dict[str, Any] | bool:
        if layer_path in quantization:  # a per-layer setting (mixed-precision checkpoints)
            return quantization[layer_path]
        if not hasattr(module, "to_quantized") or f"{layer_path}.scales" not in weights:
            return False
        scales = weights[f"{layer_path}.scales"]
        if scales.dtype == mx.uint8 or f"{layer_path}.global_scale" in weights:
            raise _NeedsMlxLm
        in_dims = module.weight.shape[-1]
        return {"group_size": in_dims // scales.shape[-1],
                "bits": weights[f"{layer_path}.weight"].shape[-1] * 32 // in_dims, "mode": "affine"}

    predicate: Callable[[str, Any], Any] = stored_as
    nn.quantize(model, group_size=quantization["group_size"], bits=quantization["bits"],
                mode="affine", class_predicate=predicate)


def dequantize_model(model: Any) -> Any:
    """Replace ``model``'s quantized linear, embedding and switch (mixture-of-experts) layers by
    their dequantized plain layers, in place, as ``mlx_lm.utils.dequantize_model`` does (tested
    equal), without importing that module. Other quantized layers are left as they are."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_unflatten
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

    plain: list[tuple[str, Any]] = []
    for name, module in model.named_modules():
        bias = "bias" in module
        if isinstance(module, nn.QuantizedLinear):
            cls, kwargs = nn.Linear, {"bias": bias}
        elif isinstance(module, nn.QuantizedEmbedding):
            cls, kwargs = nn.Embedding, {}
        elif isinstance(module, QuantizedSwitchLinear):
            cls, kwargs = SwitchLinear, {"bias": bias}
        else:
            continue
        weight = mx.dequantize(module.weight, module.scales, module.biases, module.group_size, module.bits,
                               module.mode)
        layer = cls(*weight.shape[::-1], **kwargs)
        if bias:
            layer.bias = module.bias
        layer.weight = weight
        plain.append((name, layer))
    if plain:
        model.update_modules(tree_unflatten(plain))
    return model
