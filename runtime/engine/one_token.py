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

With the mlxrt-qmv kernel (:func:`mlxrt.engine.qmv.install_fused` passes a :class:`FusedDecode`),
one sequence's step over mlx-lm's ``KVCache`` or ``RotatingKVCache`` (Gemma 3's sliding-window
layers) goes further: the per-head reshapes, the two rotations, the cache's two slice updates
and two slices, the attention and the output reshape (eleven primitives a layer) are the
kernel's ``decode_attention``: three primitives (the key's and the value's writes, the
attention) that compute them with the same code, so the same bits (docs/performance.md,
"Between the kernel calls"). It writes the step's key and value into the cache's buffers in
place where MLX would (nothing else holds them), as MLX's slice update does, at the row
``update_and_fetch`` would write (a ``KVCache``'s offset; a ``RotatingKVCache``'s write index
after its wrap to ``keep``), attends to the rows it would return (the first ``offset + 1``, or
a wrapped ``RotatingKVCache``'s whole buffer in its rotated order: :func:`_step_rows`), and
updates the cache's arrays, offset and write index as it does. Everything else keeps the path
above: a batch (the batch lane's caches), quantized caches, a mask, another rotation class
(Llama 3's, YaRN), other dtypes, a step on which ``update_and_fetch`` grows the buffer (a full
``KVCache``, a ``RotatingKVCache`` shorter than its window) or trims it (a ``RotatingKVCache``
longer than its window after a long prefill), prefill. ``MLXRT_FUSED_DECODE=0`` turns it off
(for comparisons).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["FusedDecode", "install"]


@attrs.frozen
class FusedDecode:
    """The kernel's decode attention (three primitives a layer) for :func:`install`: ``attend`` is
    ``mlxrt_qmv.decode_attention``, ``rope`` the rotation layer class whose computation it
    repeats (the kernel's ``nn.RoPE``: a layer of another class keeps its own path)."""

    attend: Callable[..., Any]
    rope: type

_SUBCLASSES: dict[type, type] = {}


def _step_rows(cache: Any, plain: type | None, rotating: type | None) -> tuple[int, int] | None:
    """Where mlx-lm's ``update_and_fetch`` writes one token's key and value into ``cache``'s
    buffers and how many of their rows (in buffer order) it returns, ``(row, length)``, for its
    ``KVCache`` (``plain``) and ``RotatingKVCache`` (``rotating``) classes exactly; ``None`` where it
    would first grow, trim or re-create the buffers (or for another class).

    ``KVCache`` writes row ``offset`` of a buffer longer than that and returns the first
    ``offset + 1`` rows. ``RotatingKVCache._update_in_place`` grows a buffer shorter than
    ``max_size`` once ``offset`` reaches its end (by ``step`` rows, at most to ``max_size``), trims
    one longer than ``max_size`` (a long prefill leaves one), wraps its write index ``_idx`` from
    ``max_size`` to ``keep``, writes that row, and returns the first ``offset + 1`` rows or, from
    then on, the whole buffer in its rotated order (``keys_and_values``)."""
    kind = type(cache)
    if (kind is not plain and kind is not rotating) or cache.keys is None:
        return None
    size, offset = cache.keys.shape[2], cache.offset
    if kind is plain:
        return (offset, offset + 1) if offset < size else None
    if size > cache.max_size or (offset >= size and size < cache.max_size):
        return None
    row = cache.keep if cache._idx == cache.max_size else cache._idx
    return (row, min(offset + 1, size)) if 0 <= row < size else None


def install(model: Any, fused: FusedDecode | None = None) -> int:
    """Swap ``model``'s known mlx-lm attention layers for their one-token subclasses; return how
    many (0 where none is known: another architecture, or an mlx-lm whose forward changed).
    ``fused``: their lone decode steps over a ``KVCache`` or ``RotatingKVCache`` run the kernel's
    decode attention."""
    from mlxrt import compat

    return compat.swap_known_layers(model, "Attention", _subclass, _mlxrt_fused=fused)


def _subclass(base: type) -> type:
    """The one-token subclass of the mlx-lm attention class ``base`` (built once per class)."""
    if base in _SUBCLASSES:
        return _SUBCLASSES[base]
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    # the module's global, looked up at each call: mlxrt.compat.route_attention may route it
    module = sys.modules[base.__module__]
    norms = "q_norm" in base.__call__.__code__.co_names  # qwen3, gemma3_text
    # the cache classes whose update the fused step performs itself, if they are still the ones it mirrors
    from mlxrt import compat

    plain = KVCache if compat.mlx_lm_cache_known(KVCache) else None
    rotating = RotatingKVCache if compat.mlx_lm_cache_known(RotatingKVCache) else None

    def __call__(self: Any, x: mx.array, mask: mx.array | None = None, cache: Any = None) -> mx.array:
        batch, length, _ = x.shape
        if length != 1 or cache is None:
            return base.__call__(self, x, mask=mask, cache=cache)
        queries, keys, values = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        fused: FusedDecode | None = self._mlxrt_fused
        if norms:  # per head over its last axis: where mlx-lm applies it, before or after the transpose, alike
            queries = self.q_norm(queries.reshape(batch, self.n_heads, 1, -1))
            keys = self.k_norm(keys.reshape(batch, self.n_kv_heads, 1, -1))
        rows = _step_rows(cache, plain, rotating) if fused is not None and batch == 1 and mask is None else None
        if (rows is not None and type(self.rope) is fused.rope
                and queries.dtype == keys.dtype == values.dtype == cache.keys.dtype == cache.values.dtype == mx.float32):
            # rotations, the cache's writes and views and the attention as three primitives; the
            # cache's arrays are updated in place by it, as update_and_fetch's item assignment does
            rope, (row, length) = self.rope, rows
            output = fused.attend(queries, keys, values, cache.keys, cache.values, cache.offset, self.scale, rope.dims,
                                  rope.traditional, rope.base, rope.scale, row=row, length=length)
            cache.offset += 1
            if type(cache) is RotatingKVCache:
                cache._idx = row + 1
            return self.o_proj(output)
        # (B, 1, heads·dim) read as (B, heads, 1, dim): mlx-lm's reshape-then-transpose, one view
        if not norms:
            queries = queries.reshape(batch, self.n_heads, 1, -1)
            keys = keys.reshape(batch, self.n_kv_heads, 1, -1)
        values = values.reshape(batch, self.n_kv_heads, 1, -1)
        queries = self.rope(queries, offset=cache.offset)
        keys = self.rope(keys, offset=cache.offset)
        keys, values = cache.update_and_fetch(keys, values)
        output = module.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(output.reshape(batch, 1, -1))

    cls = type(f"OneToken{base.__name__}", (base,), {"__call__": __call__, "__module__": __name__, "_mlxrt_fused": None,
                                         "__doc__": f"{base.__module__}.{base.__name__}, one token without layout ops."})
    _SUBCLASSES[base] = cls
    return cls
