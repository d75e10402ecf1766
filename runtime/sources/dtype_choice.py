"""``--dtype``: which dtype the weights are served in, and why.

``auto`` (the default) serves a quantized, bfloat16 or float16 checkpoint as float32 when all
of these hold, and keeps the stored dtype otherwise:

* MLX runs on the CPU (on Metal/CUDA the stored dtype is what the GPU kernels are fast at);
* a fast BLAS is active (:mod:`mlxrt.engine.blas`: the system OpenBLAS or MKL). Only float32 matmuls
  go through BLAS; on the bundled reference BLAS float32 is no faster than the stored dtype;
* the float32 weights plus the float32 KV cache of one request at the default context
  (:data:`mlxrt.sources.fit.DEFAULT_CONTEXT` tokens, capped at the model's context window) fit in the
  usable memory budget: ``--memory-budget`` (or :func:`mlxrt.sources.fit.machine_budget`, a share of
  physical memory), divided among ``--max-models``, less :data:`mlxrt.engine.memory.MARGIN`;
* every quantized layer is of a kind mlx-lm can dequantize, and the weights are not loaded
  lazily for ``--distributed`` (casting would read every shard on every rank).

An explicit ``--dtype float32|bfloat16|float16`` casts as asked; ``--dtype stored`` never casts.
"""

from __future__ import annotations

from typing import Any

import attrs

from mlxrt.records import ModelInfo

__all__ = ["DtypeChoice", "choose_dtype", "stored_dtype", "float32_bytes", "DTYPES"]

#: What ``--dtype`` accepts.
DTYPES = ("auto", "float32", "bfloat16", "float16", "stored")


@attrs.frozen
class DtypeChoice:
    """The weights' dtype: ``stored`` (what the checkpoint holds, e.g. ``bfloat16`` or
    ``quantized 4-bit``), ``cast`` (the dtype they were cast to, ``None`` when kept as stored),
    ``requested`` (``--dtype``) and ``reason`` (why, in words)."""

    requested: str
    stored: str
    cast: str | None
    reason: str

    @property
    def served(self) -> str:
        return self.cast or self.stored

    def __str__(self) -> str:
        return f"{self.served} ({self.reason})"

    def as_dict(self) -> dict[str, Any]:
        return {"served": self.served, "stored": self.stored, "cast": self.cast,
                "requested": self.requested, "reason": self.reason, "text": str(self)}


def _quantized_bits(model: Any) -> list[int]:
    return sorted({int(m.bits) for _name, m in model.named_modules() if "scales" in m and hasattr(m, "bits")})


def stored_dtype(model: Any) -> str:
    """``quantized N-bit`` when any layer is quantized, else the float dtype holding the most
    parameters (``float32``, ``bfloat16``, ``float16``)."""
    from mlx.utils import tree_flatten

    bits = _quantized_bits(model)
    if bits:
        return f"quantized {'/'.join(map(str, bits))}-bit"
    sizes: dict[str, int] = {}
    for _name, p in tree_flatten(model.parameters()):
        name = str(p.dtype).removeprefix("mlx.core.")
        if name in ("float32", "bfloat16", "float16", "float64"):
            sizes[name] = sizes.get(name, 0) + p.size
    return max(sizes, key=sizes.__getitem__) if sizes else "float32"


def float32_bytes(model: Any) -> int:
    """Bytes of the weights once dequantized and cast to float32 (packed quantized weights
    count their unpacked elements; scales and biases of quantization go away)."""
    from mlx.utils import tree_flatten

    total = 0
    for _prefix, module in model.named_modules():
        quantized = "scales" in module and hasattr(module, "bits")
        for name, p in tree_flatten(module.parameters()):
            if "." in name:  # a child module's: counted with the child
                continue
            if quantized and name in ("scales", "biases"):
                continue
            total += p.size * 32 // int(module.bits) if quantized and name == "weight" else p.size
    return 4 * total


def _undequantizable(model: Any) -> list[str]:
    import mlx.nn as nn
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    kinds = (nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear)
    return [name for name, m in model.named_modules() if "scales" in m and not isinstance(m, kinds)]


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 10**9 else f"{n / 1e6:.1f} MB"


def choose_dtype(requested: str, model: Any, info: ModelInfo, *, budget: int | None, blas_fast: bool,
                 blas_name: str, on_cpu: bool, lazy: bool = False, models: int = 1) -> DtypeChoice:
    """What ``--dtype requested`` means for this loaded ``model`` (see the module docstring);
    ``budget`` is ``--memory-budget`` in bytes (``None``: a share of physical memory), shared by
    ``models`` resident models (``--max-models``) as the model pool shares it."""
    stored = stored_dtype(model)
    if requested in ("float32", "bfloat16", "float16"):
        return DtypeChoice(requested, stored, requested, f"--dtype {requested}")
    if requested == "stored":
        return DtypeChoice(requested, stored, None, "--dtype stored")
    keep = "auto keeps the stored dtype"
    if stored == "float32":
        return DtypeChoice(requested, stored, None, "auto: stored as float32")
    if not on_cpu:
        return DtypeChoice(requested, stored, None, f"{keep} on a GPU")
    if not blas_fast:
        return DtypeChoice(requested, stored, None, f"{keep}: no fast BLAS ({blas_name}), float32 would be no faster")
    if lazy:
        return DtypeChoice(requested, stored, None, f"{keep}: --distributed loads the weights lazily")
    if left := _undequantizable(model):
        return DtypeChoice(requested, stored, None, f"{keep}: mlx-lm cannot dequantize {left[0]}")
    from mlxrt.engine.memory import MARGIN
    from mlxrt.errors import ModelLoadError
    from mlxrt.sources.fit import DEFAULT_CONTEXT, machine_budget, static_kv

    window = info.context_window
    ctx = min(DEFAULT_CONTEXT, window) if window and window > 0 else DEFAULT_CONTEXT
    try:
        kv = static_kv(info.config, 4)
        kv_bytes = kv.per_token * ctx + kv.fixed
    except ModelLoadError:  # no attention shape in the config: the weights alone decide
        kv_bytes = 0
    weights = float32_bytes(model)
    source = "--memory-budget" if budget is not None else "a share of RAM"
    if models > 1:
        source += f" / --max-models {models}"
    usable = int((budget if budget is not None else machine_budget()) // max(models, 1) * (1 - MARGIN))
    need = f"float32 weights {_gb(weights)} + KV for {ctx} tokens {_gb(kv_bytes)}"
    if weights + kv_bytes > usable:
        return DtypeChoice(requested, stored, None, f"{keep}: {need} exceed {_gb(usable)} ({source})")
    return DtypeChoice(requested, stored, "float32",
                       f"auto: CPU with {blas_name}; {need} fit in {_gb(usable)} ({source})")
