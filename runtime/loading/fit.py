"""Static fit: will a model folder serve at a given context under a memory budget?

The same contract as :mod:`mlxrt.engine.memory`, computed without loading anything
(:mod:`mlxrt.loading.sizes` reads the files): weight bytes come from the safetensors headers (the JSON header of each file, never the tensors), the KV
cost per token from ``config.json``, laid out as mlx-lm's ``make_cache`` lays it out:

* full-attention layers pay ``2 × kv_heads × head_dim × dtype`` bytes per token of context
  (GQA: ``num_key_value_heads``; Gemma 4 full layers use ``global_head_dim`` and, with
  ``attention_k_eq_v``, ``num_global_key_value_heads``);
* sliding-window layers are capped at their window: a fixed cost per request;
* linear-attention layers (Qwen3.5/Qwen3-Next gated DeltaNet) hold a fixed conv state (in
  the activation dtype) and a float32 recurrent state;
* KV-shared layers (``num_kv_shared_layers``, the last ones) own no cache.

The KV dtype is the activation dtype: the embedding's (its quantization scales' when it is
quantized). Both are those of the dtype ``mlxrt serve`` would serve (``--dtype``, default ``auto``:
:mod:`mlxrt.loading.dtype_choice` decides from the same headers and this machine's device and
BLAS): a bfloat16 checkpoint served as float32 weighs, and caches, twice its files. The budget is then split by :func:`mlxrt.engine.memory.plan_memory` itself, so the
``max_safe_context`` reported here is the ``safe_context`` the engine computes at load —
``tests/test_fit.py`` checks the static KV cost against :func:`mlxrt.engine.memory.measure_kv`.
Architectures whose cache is laid out otherwise (e.g. MLA) get the GQA estimate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from mlxrt.engine.memory import KVCost, plan_memory
from mlxrt.errors import ModelLoadError
from mlxrt.loading.dtype_choice import (
    CAST_BYTES,
    DtypeChoice,
    Machine,
    decide,
    machine_facts,
    static_facts,
)
from mlxrt.loading.gguf_library import gguf_static
from mlxrt.loading.sizes import (
    DEFAULT_CONTEXT,
    context_window,
    machine_budget,
    read_config,
    static_kv,
    weights_summary,
)

__all__ = ["FitReport", "assess"]


@attrs.frozen
class FitReport:
    """The memory contract for one model at one context under one budget (bytes, tokens)."""

    model: str
    ctx: int
    budget_bytes: int
    budget_source: str
    weight_bytes: int
    other_weight_bytes: int
    params: int
    kv_dtype: str
    kv: KVCost
    rows: int
    prompt_cache_bytes: int
    context_window: int | None
    safe_context: int
    fits: bool
    reason: str | None
    dtype: DtypeChoice | None = None
    stored_weight_bytes: int | None = None

    @property
    def max_safe_context(self) -> int:
        """What the budget holds, capped at the model's context window."""
        window = self.context_window
        return min(self.safe_context, window) if window else self.safe_context

    @property
    def kv_bytes(self) -> int:
        """KV at ``ctx`` tokens: one request's per-token cost plus every row's fixed cost."""
        return self.kv.per_token * self.ctx + self.kv.fixed * self.rows

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.model, "ctx": self.ctx, "fits": self.fits, "reason": self.reason,
            "budget_bytes": self.budget_bytes, "budget_source": self.budget_source,
            "weight_bytes": self.weight_bytes, "other_weight_bytes": self.other_weight_bytes,
            "params": self.params, "kv_dtype": self.kv_dtype,
            "kv_bytes_per_token": self.kv.per_token, "fixed_bytes_per_request": self.kv.fixed,
            "kv_bytes": self.kv_bytes, "rows": self.rows, "prompt_cache_bytes": self.prompt_cache_bytes,
            "total_bytes": self.weight_bytes + self.kv_bytes + self.prompt_cache_bytes,
            "context_window": self.context_window, "safe_context": self.safe_context,
            "max_safe_context": self.max_safe_context,
            "dtype": self.dtype.as_dict() if self.dtype is not None else None,
            "stored_weight_bytes": self.stored_weight_bytes,
        }


def assess(folder: Path, *, ctx: int = DEFAULT_CONTEXT, budget: int | None = None, budget_source: str = "flag",
           prompt_cache_bytes: int | None = None, rows: int = 1, model: str | None = None, dtype: str = "auto",
           machine: Machine | None = None, models: int = 1, lazy: bool = False) -> FitReport:
    """Assess ``folder`` at ``ctx`` tokens under ``budget`` bytes (default: :func:`machine_budget`),
    served as ``--dtype dtype`` would serve it on ``machine`` (default:
    :func:`~mlxrt.loading.dtype_choice.machine_facts`) with ``models`` resident models
    (``--max-models``) and ``lazy`` weights (``--distributed``).

    :raises ModelLoadError: The folder's config or weights cannot be read.
    """
    if folder.suffix == ".gguf" or folder.is_file():  # a GGUF file: from its header, as converted
        config, summary = gguf_static(folder)
    else:
        config = read_config(folder)
        summary = weights_summary(folder, config)
    window = context_window(config)
    choice = decide(dtype, static_facts(config, summary, window), machine or machine_facts(), budget=budget,
                    lazy=lazy, models=models)
    if choice.cast:  # dequantized and cast: every parameter at the served width, as the KV
        weight_bytes, kv_dtype = summary.params * CAST_BYTES[choice.cast], choice.cast
    else:
        weight_bytes, kv_dtype = summary.weight_bytes, summary.activation_dtype
    dtype_bytes = {"float64": 8, "float32": 4}.get(kv_dtype, 2)
    kv = static_kv(config, dtype_bytes)
    if budget is None:
        budget, budget_source = machine_budget(), "machine"
    reason = None
    try:
        plan = plan_memory(weight_bytes, kv, budget=budget, prompt_cache_bytes=prompt_cache_bytes,
                           rows=rows)
        safe, cache_bytes = int(plan.safe_context or 0), plan.prompt_cache_bytes
    except ModelLoadError as exc:  # the engine would refuse to load: its own words say why
        safe, cache_bytes, reason = 0, prompt_cache_bytes or 0, exc.message
    if reason is None and ctx > safe:
        reason = f"{ctx} tokens of context need {kv.per_token * ctx} bytes of KV; the budget holds {safe} tokens"
    elif reason is None and window and ctx > window:
        reason = f"{ctx} tokens exceed the model's context window of {window}"
    return FitReport(model=model or folder.name, ctx=ctx, budget_bytes=budget, budget_source=budget_source,
                     weight_bytes=weight_bytes, other_weight_bytes=summary.other_bytes,
                     params=summary.params, kv_dtype=kv_dtype, kv=kv, rows=rows,
                     prompt_cache_bytes=cache_bytes, context_window=window, safe_context=safe,
                     fits=reason is None, reason=reason, dtype=choice, stored_weight_bytes=summary.weight_bytes)
