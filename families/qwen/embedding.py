"""Qwen3-Embedding's checkpoint layout for mlx-lm's ``qwen3`` model.

The official repos save the weights as ``Qwen3Model`` does, without the ``model.`` prefix
(``layers.0.self_attn.q_proj.weight``), which plain mlx-lm rejects ("parameters not in
model"); mlx-community conversions carry the prefix. This model's ``sanitize`` adds the
prefix where it is missing, so both layouts load. Imported only when such a model loads.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models import qwen3

__all__ = ["Qwen3EmbeddingModel", "ModelArgs"]

ModelArgs = qwen3.ModelArgs


class Qwen3EmbeddingModel(qwen3.Model):
    """mlx-lm's Qwen3 with a sanitize that accepts the prefix-less Qwen3Model layout."""

    def sanitize(self, weights: dict[str, Any]) -> dict[str, Any]:
        weights = {k if k.startswith(("model.", "lm_head.")) else f"model.{k}": v for k, v in weights.items()}
        sanitized: dict[str, Any] = super().sanitize(weights)
        return sanitized
