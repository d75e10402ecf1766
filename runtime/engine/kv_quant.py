"""Quantized KV caches: which layers' keys and values are stored at 4 or 8 bits, and from when.

A :class:`KVScheme` is resolved once per server (:func:`resolve_kv_scheme`):

* ``--kv-quant 4|8``: every full-attention layer at that many bits (group ``--kv-group-size``,
  64 by default), from the first token;
* ``--kv-bits N`` (mlx_lm.server's flag): the same, from ``--quantized-kv-start`` tokens
  (5000 by default, mlx_lm.server's default);
* otherwise a model folder's ``kv_config.json`` (per-layer bits), unless ``--kv-quant off``.

``kv_config.json`` is either a list ``[{"layer_idx": i, "bits": b, "group_size": g}, ...]``
(``{"layers": [...]}`` too) or per attention kind,
``{"full_attention": {"bits": 8, "group_size": 64}, "sliding_window": {"bits": 4}}`` (a bare
number is the bits). Layers not named stay full precision.

The cache is converted exactly where mlx-lm's ``generate_step`` does it for ``kv_bits``:
right after each model call, a layer whose cache holds at least ``start`` tokens becomes a
``QuantizedKVCache`` (``KVCache.to_quantized``). Sliding-window layers (``RotatingKVCache``)
cannot be quantized by mlx-lm and stay full precision; so do other cache kinds (SSM state).
``QuantizedKVCache`` has no ``merge``, so quantized-KV servers run every request in the serial
lane (``--batch`` is ignored with a warning).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from mlxrt.errors import ModelLoadError

__all__ = ["KVScheme", "QuantizingModel", "resolve_kv_scheme", "KV_CONFIG"]

log = logging.getLogger("mlxrt.engine.kv_quant")

KV_CONFIG = "kv_config.json"
_BITS = (2, 3, 4, 5, 6, 8)


@attrs.frozen
class KVScheme:
    """Which cache layers are quantized, at what bits and group size, from which offset.

    :ivar bits: Bits of every full-attention layer (uniform schemes), else ``None``.
    :ivar layers: Per-layer ``(bits, group_size)`` (kv_config.json), by layer index.
    :ivar kinds: Per attention kind (``full_attention`` / ``sliding_window``) ``(bits, group_size)``.
    :ivar source: Where the scheme came from (for logs and ``/stats``).
    """

    bits: int | None = None
    group_size: int = 64
    start: int = 0
    layers: Mapping[int, tuple[int, int]] = attrs.field(factory=dict)
    kinds: Mapping[str, tuple[int, int]] = attrs.field(factory=dict)
    source: str = ""

    def spec(self, index: int, layer: Any) -> tuple[int, int] | None:
        """``(bits, group_size)`` for cache layer ``index``, or None to keep it as is."""
        from mlx_lm.models.cache import KVCache, RotatingKVCache

        kind = "sliding_window" if isinstance(layer, RotatingKVCache) else "full_attention"
        if index in self.layers:
            found: tuple[int, int] | None = self.layers[index]
        elif kind in self.kinds:
            found = self.kinds[kind]
        elif self.bits is not None and kind == "full_attention":
            found = (self.bits, self.group_size)
        else:
            found = None
        # Only plain KV caches convert (mlx-lm has no quantized rotating or SSM cache).
        return found if found is not None and type(layer) is KVCache else None

    def apply(self, cache: list[Any]) -> None:
        """Convert, in place, the layers due for quantization (what ``maybe_quantize_kv_cache``
        does for one uniform ``kv_bits``)."""
        for i, layer in enumerate(cache):
            spec = self.spec(i, layer)
            if spec is not None and layer.offset >= self.start:
                cache[i] = layer.to_quantized(group_size=spec[1], bits=spec[0])

    def check(self, model: Any) -> None:
        """Refuse, at load, a scheme this model's cache cannot take: MLX quantizes the last axis
        (the head dim) in groups, so every quantized layer's head dim must be a multiple of its
        group size. Runs one token through a fresh cache to read the real shapes."""
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(model)
        model(mx.array([[0]]), cache=cache)
        for i, layer in enumerate(cache):
            spec = self.spec(i, layer)
            keys = getattr(layer, "keys", None)
            if spec is None or not isinstance(keys, mx.array):
                continue
            head_dim = int(keys.shape[-1])
            values = getattr(layer, "values", None)
            dims = {head_dim, int(values.shape[-1]) if isinstance(values, mx.array) else head_dim}
            bad = sorted(d for d in dims if d % spec[1])
            if bad:
                fits = [g for g in (32, 64, 128) if all(d % g == 0 for d in dims)]
                hint = (f"use --kv-group-size {' or '.join(map(str, fits))}" if fits
                        else "this model's KV cache cannot be quantized (--kv-quant off)")
                raise ModelLoadError(
                    f"KV quantization ({self.source}): layer {i} has head dim {bad[0]}, which group "
                    f"size {spec[1]} does not divide; {hint}")

    def describe(self, cache: list[Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "bits": self.bits, "group_size": self.group_size,
                               "quantized_kv_start": self.start}
        if self.layers:
            out["layers"] = {str(i): {"bits": b, "group_size": g} for i, (b, g) in sorted(self.layers.items())}
        if self.kinds:
            out["kinds"] = {k: {"bits": b, "group_size": g} for k, (b, g) in self.kinds.items()}
        if cache is not None:
            out["quantized_layers"] = sum(self.spec(i, c) is not None for i, c in enumerate(cache))
            out["total_layers"] = len(cache)
        return out


class QuantizingModel:
    """The model, quantizing the cache it was given after each call (serial lane)."""

    def __init__(self, model: Any, scheme: KVScheme) -> None:
        self._model = model
        self._scheme = scheme

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, *args: Any, cache: Any = None, input_embeddings: Any = None, **kwargs: Any) -> Any:
        # ``input_embeddings`` named: mlx-lm feeds image prompts only to models whose signature has it.
        if input_embeddings is not None:
            kwargs["input_embeddings"] = input_embeddings
        out = self._model(*args, cache=cache, **kwargs)
        if cache is not None:
            self._scheme.apply(cache)
        return out


def _spec(value: Any, where: str, default_group: int) -> tuple[int, int] | None:
    if isinstance(value, bool):
        value = None
    if isinstance(value, int):
        bits, group = value, default_group
    elif isinstance(value, Mapping):
        bits, group = value.get("bits"), value.get("group_size", default_group)
    else:
        raise ModelLoadError(f"{where}: expected bits (a number) or {{\"bits\", \"group_size\"}}")
    if bits is None or bits in (16, 32):
        return None
    if bits not in _BITS or not isinstance(group, int) or group not in (32, 64, 128):
        raise ModelLoadError(f"{where}: bits must be one of {_BITS} and group_size 32, 64 or 128 "
                             f"(got bits {bits!r}, group_size {group!r})")
    return int(bits), int(group)


def read_kv_config(folder: Path, default_group: int = 64) -> KVScheme | None:
    """A model folder's ``kv_config.json`` as a scheme (None when the folder has none)."""
    path = folder / KV_CONFIG
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, Mapping) and "layers" in data:
        data = data["layers"]
    layers: dict[int, tuple[int, int]] = {}
    kinds: dict[str, tuple[int, int]] = {}
    if isinstance(data, list):
        for n, entry in enumerate(data):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("layer_idx"), int):
                raise ModelLoadError(f"{path}: entry {n} needs an integer layer_idx")
            spec = _spec(entry, f"{path}: entry {n}", default_group)
            if spec is not None:
                layers[entry["layer_idx"]] = spec
    elif isinstance(data, Mapping):
        for kind, value in data.items():
            if kind not in ("full_attention", "sliding_window"):
                raise ModelLoadError(f"{path}: unknown key {kind!r} (full_attention, sliding_window or layers)")
            spec = _spec(value, f"{path}: {kind}", default_group)
            if spec is not None:
                kinds[kind] = spec
    else:
        raise ModelLoadError(f"{path}: expected a list of layers or an object")
    if not layers and not kinds:
        return None
    return KVScheme(layers=layers, kinds=kinds, start=0, source=KV_CONFIG)


def resolve_kv_scheme(*, kv_quant: str | None, kv_bits: int | None, kv_group_size: int | None,
                      quantized_kv_start: int | None, model_path: Path | None) -> KVScheme | None:
    """The server's KV scheme from its flags and the model folder (None: full precision)."""
    group = kv_group_size or 64
    if kv_quant not in (None, "off", "config", "4", "8"):
        raise ModelLoadError(f"--kv-quant expects off, config, 4 or 8 (got {kv_quant!r})")
    if kv_quant == "off":
        return None
    if kv_quant in ("4", "8"):
        start = quantized_kv_start if quantized_kv_start is not None and kv_bits is not None else 0
        return KVScheme(bits=int(kv_quant), group_size=group, start=start, source=f"--kv-quant {kv_quant}")
    if kv_bits is not None:
        if kv_bits not in _BITS:
            raise ModelLoadError(f"--kv-bits must be one of {_BITS} (got {kv_bits})")
        start = 5000 if quantized_kv_start is None else quantized_kv_start
        return KVScheme(bits=kv_bits, group_size=group, start=start, source=f"--kv-bits {kv_bits}")
    if model_path is not None and Path(model_path).is_dir():
        return read_kv_config(Path(model_path), group)
    return None
