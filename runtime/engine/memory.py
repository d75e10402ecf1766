"""The memory contract of a loaded model: what the weights take, what a token of context
costs, and how much context a memory budget can hold.

``--memory-budget GB`` is split, once at load, into

* the weights (the ``nbytes`` of every parameter, as loaded),
* fixed per-request state that does not grow with context (sliding-window layers at their
  full window, recurrent state of linear-attention layers), counted once per batch row,
* the prompt-cache allowance (``--prompt-cache-bytes``, by default a quarter of what is left
  after the weights),
* a safety margin (:data:`MARGIN` of the budget, for activations and allocator slack),
* and the rest: KV for running requests. ``safe_context`` is that rest in tokens, using the
  KV bytes per token measured on the model's own cache classes after one forward.

Admission uses ``safe_context`` twice: a single request's max_tokens is reduced to what it
leaves after the prompt (a prompt that exceeds it alone is refused, 400), and the sum over all
running rows never exceeds it (newcomers wait).
Without a budget nothing is refused and ``safe_context`` is ``None``.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from mlxrt.errors import ModelLoadError

__all__ = ["MemoryPlan", "plan_memory", "measure_kv", "parse_size", "DEFAULT_PROMPT_CACHE_BYTES"]

#: Share of the budget kept free for activations, temporaries and allocator slack.
MARGIN = 0.10
#: Share of the budget left after the weights that the prompt cache gets by default.
PROMPT_CACHE_SHARE = 0.25
#: Prompt-cache byte cap when no memory budget is given.
DEFAULT_PROMPT_CACHE_BYTES = 2 * 1024**3
#: A budget that cannot hold this many tokens of context cannot serve; the load is refused.
MIN_SAFE_CONTEXT = 256

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9,
          "T": 10**12, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int | float, *, default_unit: str = "") -> int:
    """Bytes from ``"8GB"``, ``"512MiB"``, ``"1.5G"`` or a plain number (in ``default_unit``).

    Decimal units (``K``, ``M``, ``G``, ``T``, with or without ``B``) are powers of 1000, as
    mlx_lm.server reads them; ``KiB``, ``MiB``, ``GiB``, ``TiB`` are powers of 1024.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = str(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = (match.group(2) if match else "").upper() or default_unit.upper()
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use a number with K, M, G, T or KiB, MiB, GiB)")
    return int(float(match.group(1)) * _UNITS[unit])


@attrs.frozen
class KVCost:
    """What one request's cache costs: ``per_token`` bytes for each token of context in
    full-attention layers, plus ``fixed`` bytes that do not grow (windows, recurrent state)."""

    per_token: int
    fixed: int


def measure_kv(model: Any) -> KVCost:
    """Run one token through a fresh cache of ``model`` and read the cost off its layers."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    mx.eval([c.state for c in cache])
    per_token = fixed = 0
    for layer in _leaves(cache):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if isinstance(keys, mx.array) and isinstance(values, mx.array) and keys.ndim == 4:
            bytes_per_token = (keys.nbytes + values.nbytes) // max(keys.shape[2], 1)
            window = getattr(layer, "max_size", None)
            if isinstance(window, int) and window > 0:
                fixed += bytes_per_token * window
            else:
                per_token += bytes_per_token
        else:
            try:
                fixed += int(layer.nbytes)
            except (NotImplementedError, AttributeError, TypeError):
                pass
    return KVCost(per_token=per_token, fixed=fixed)


def _leaves(cache: list[Any]) -> list[Any]:
    out: list[Any] = []
    for layer in cache:
        inner = getattr(layer, "caches", None)
        out.extend(_leaves(list(inner)) if isinstance(inner, (list, tuple)) else [layer])
    return out


def weight_bytes(model: Any) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


@attrs.frozen
class MemoryPlan:
    """How a model's memory is spent. Sizes in bytes; ``safe_context`` in tokens (``None``:
    no budget, nothing is refused for memory)."""

    budget: int | None
    weights: int
    kv: KVCost
    prompt_cache_bytes: int
    safe_context: int | None

    def describe(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget,
            "weight_bytes": self.weights,
            "kv_bytes_per_token": self.kv.per_token,
            "fixed_bytes_per_request": self.kv.fixed,
            "prompt_cache_bytes": self.prompt_cache_bytes,
            "safe_context": self.safe_context,
        }


def plan_memory(weights: int, kv: KVCost, *, budget: int | None, prompt_cache_bytes: int | None,
                rows: int = 1) -> MemoryPlan:
    """Split ``budget`` (bytes) between weights, the prompt cache and running KV.

    :param rows: Batch rows that may run at once (each pays ``kv.fixed``).
    :raises ModelLoadError: The budget cannot hold the weights and :data:`MIN_SAFE_CONTEXT`
        tokens of context; the message gives the numbers.
    """
    if budget is None:
        cap = DEFAULT_PROMPT_CACHE_BYTES if prompt_cache_bytes is None else prompt_cache_bytes
        return MemoryPlan(None, weights, kv, cap, None)
    usable = int(budget * (1 - MARGIN)) - weights - kv.fixed * max(rows, 1)
    cap = prompt_cache_bytes if prompt_cache_bytes is not None else max(int(usable * PROMPT_CACHE_SHARE), 0)
    room = usable - cap
    safe = room // kv.per_token if kv.per_token > 0 else (1 << 31 if room > 0 else 0)
    if safe < MIN_SAFE_CONTEXT:
        gb = 1e9
        raise ModelLoadError(
            f"the memory budget of {budget / gb:.2f} GB cannot serve this model: weights take "
            f"{weights / gb:.2f} GB, the prompt cache {cap / gb:.2f} GB and the margin "
            f"{budget * MARGIN / gb:.2f} GB, leaving room for {max(safe, 0)} tokens of context "
            f"({kv.per_token} bytes each; at least {MIN_SAFE_CONTEXT} needed) — raise "
            "--memory-budget or lower --prompt-cache-bytes",
            code="over_budget",
        )
    return MemoryPlan(budget, weights, kv, cap, int(safe))
