"""mlx-lm's attention layers with a decode step's layout ops left out.

mlx-lm's attention forwards (llama, qwen2, qwen3, gemma3_text) turn each projection's ``(B, L,
heads·dim)`` rows into ``(B, heads, L, dim)`` by a reshape to ``(B, L, heads, dim)`` and a
transpose, and the attention's output back by a transpose and a reshape: four ``Transpose`` and
four ``Reshape`` primitives a layer, 240 of a SmolLM2 decode step's ~850 with the kernel's fused
primitives (docs/performance.md, "Between the kernel calls"). With one token (``L == 1``) the
transpose moves an axis of length one, so the reshape alone gives the same array, element for
element; each primitive the graph does not hold is one MLX does not set up on the engine thread
nor dispatch on its stream thread. A step's results are the same bits (the same values reach
the same primitives in the same order).

:func:`install` swaps each such layer for an instance of a subclass whose forward takes that path
for one token with a cache and is mlx-lm's own otherwise (prefill, the batch lane's prefill
chunks, no cache), through MLX's public ``Module.update_modules``. The subclass computes what
mlx-lm's forward does: :func:`mlxrt.compat.mlx_lm_forward_known` accepts only the classes
whose forward is the one this was written against (its source's digest), so an mlx-lm that
changes one leaves that layer as it is, and tests/test_compat.py fails by name.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["install"]

_SUBCLASSES: dict[type, type] = {}


def install(model: Any) -> int:
    """Swap ``model``'s known mlx-lm attention layers for their one-token subclasses; return how
    many (0 where none is known: another architecture, or an mlx-lm whose forward changed)."""
    from mlxrt import compat

    modules = dict(model.named_modules())
    swapped = 0
    for path, layer in modules.items():
        parent_path, _, key = path.rpartition(".")
        parent = modules.get(parent_path) if parent_path else model
        # a layer held in a list (no attribute name) is left alone: none of the known models does
        known = type(layer).__name__ == "Attention" and compat.mlx_lm_forward_known(type(layer))
        if not known or parent is None or key.isdigit():
            continue
        parent.update_modules({key: _one_token(layer, _subclass(type(layer)))})
        swapped += 1
    return swapped


def _one_token(layer: Any, cls: type) -> Any:
    """A ``cls`` holding ``layer``'s children and attributes (its constructor needs the model's
    arguments, which the layer does not keep): the same parameters, the same settings."""
    new = cls.__new__(cls)
    dict.update(new, layer)  # an MLX module is a dict of its children and parameters
    new.__dict__.update(layer.__dict__)  # and keeps its settings (heads, scale) as attributes
    return new


def _subclass(base: type) -> type:
    """The one-token subclass of the mlx-lm attention class ``base`` (built once per class)."""
    if base in _SUBCLASSES:
        return _SUBCLASSES[base]
    import mlx.core as mx

    # the module's global, looked up at each call: mlxrt.compat.route_attention may route it
    module = sys.modules[base.__module__]
    norms = "q_norm" in base.__call__.__code__.co_names  # qwen3, gemma3_text

    def __call__(self: Any, x: mx.array, mask: mx.array | None = None, cache: Any = None) -> mx.array:
        batch, length, _ = x.shape
        if length != 1 or cache is None:
            return base.__call__(self, x, mask=mask, cache=cache)
        # (B, 1, heads·dim) read as (B, heads, 1, dim): mlx-lm's reshape-then-transpose, one view
        queries = self.q_proj(x).reshape(batch, self.n_heads, 1, -1)
        keys = self.k_proj(x).reshape(batch, self.n_kv_heads, 1, -1)
        values = self.v_proj(x).reshape(batch, self.n_kv_heads, 1, -1)
        if norms:  # per head over its last axis: where mlx-lm applies it, before or after the transpose, alike
            queries, keys = self.q_norm(queries), self.k_norm(keys)
        queries = self.rope(queries, offset=cache.offset)
        keys = self.rope(keys, offset=cache.offset)
        keys, values = cache.update_and_fetch(keys, values)
        output = module.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(output.reshape(batch, 1, -1))

    cls = type(f"OneToken{base.__name__}", (base,), {"__call__": __call__, "__module__": __name__,
                                         "__doc__": f"{base.__module__}.{base.__name__}, one token without layout ops."})
    _SUBCLASSES[base] = cls
    return cls
