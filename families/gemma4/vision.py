"""The Gemma 4 vision tower and its projector into the text model, in plain MLX.

A port of transformers' ``Gemma4VisionModel`` + ``Gemma4MultimodalEmbedder``
(``modeling_gemma4.py``). Not SigLIP: a ViT over pre-cut 16×16 patches with

* a patch embedder: ``input_proj(2 * (pixels - 0.5))`` plus learned x and y position tables;
* encoder layers with sandwich RMSNorms (plain ``weight``, not ``1 + weight``), q/k norms and a
  scale-free v norm, **2-D axial RoPE** (θ 100; the head splits into an x half and a y half,
  each rotated by its coordinate), attention scale 1.0, bidirectional over the image's patches,
  and a GeGLU MLP; every linear is ``Gemma4ClippableLinear`` (``*.linear.weight``, plus clamp
  bounds when ``use_clipped_linears``);
* a pooler: average over each ``k×k`` block of patch positions, times ``sqrt(hidden)`` in
  float32, then ``(x - std_bias) * std_scale`` when ``standardize``;
* the embedder: a scale-free RMSNorm and ``embedding_projection`` to the text hidden size.

Weights load by their checkpoint names under ``model.vision_tower.`` and ``model.embed_vision.``
(:func:`load_tower`). One image runs at a time: its patches are not padded (see
:mod:`mlxrt.families.gemma4.image_processor`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

__all__ = ["VisionTower", "VisionConfig", "load_tower", "TOWER_PREFIX", "EMBED_PREFIX"]

TOWER_PREFIX = "model.vision_tower."
EMBED_PREFIX = "model.embed_vision."


class VisionConfig:
    """The fields of a ``gemma4_vision`` config the tower reads."""

    def __init__(self, cfg: Mapping[str, Any], text_hidden: int) -> None:
        self.hidden = int(cfg.get("hidden_size", 768))
        self.intermediate = int(cfg.get("intermediate_size", 3072))
        self.layers = int(cfg.get("num_hidden_layers", 16))
        self.heads = int(cfg.get("num_attention_heads", 12))
        self.kv_heads = int(cfg.get("num_key_value_heads", self.heads))
        self.head_dim = int(cfg.get("head_dim") or self.hidden // self.heads)
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.patch_size = int(cfg.get("patch_size", 16))
        self.kernel = int(cfg.get("pooling_kernel_size", 3))
        self.position_size = int(cfg.get("position_embedding_size", 10 * 1024))
        self.clipped = bool(cfg.get("use_clipped_linears", False))
        self.standardize = bool(cfg.get("standardize", False))
        rope = cfg.get("rope_parameters") or {}
        self.rope_theta = float(rope.get("rope_theta", 100.0))
        self.output_dims = int(cfg.get("output_proj_dims") or self.hidden)
        self.text_hidden = int(text_hidden)
        act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"vision hidden_activation {act!r} is not supported")
        self.exact_gelu = act == "gelu"


def rms_norm(x: mx.array, weight: mx.array | None, eps: float) -> mx.array:
    """Gemma's RMSNorm (plain ``weight``, computed in float32, cast back); ``weight=None`` is the
    scale-free one."""
    return mx.fast.rms_norm(x.astype(mx.float32), None if weight is None else weight.astype(mx.float32),
                            eps).astype(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dims: int, eps: float) -> None:
        super().__init__()
        self.weight = mx.ones((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return rms_norm(x, self.weight, self.eps)


class ClippableLinear(nn.Module):
    def __init__(self, in_dims: int, out_dims: int, clipped: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dims, out_dims, bias=False)
        self.clipped = clipped
        if clipped:
            self.input_min = mx.array(-math.inf)
            self.input_max = mx.array(math.inf)
            self.output_min = mx.array(-math.inf)
            self.output_max = mx.array(math.inf)

    def __call__(self, x: mx.array) -> mx.array:
        if self.clipped:
            x = mx.clip(x, self.input_min, self.input_max)
        x = self.linear(x)
        if self.clipped:
            x = mx.clip(x, self.output_min, self.output_max)
        return x


def _rotate_half(x: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    return mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def axial_rope(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """``x [1, N, heads, head_dim]``: the first half rotated by x positions, the second by y."""
    half = x.shape[-1] // 2
    parts = []
    for k in range(2):
        xk = x[..., k * half:(k + 1) * half]
        ck, sk = cos[k][:, None, :], sin[k][:, None, :]
        parts.append(xk * ck + _rotate_half(xk) * sk)
    return mx.concatenate(parts, axis=-1)


class Attention(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.eps = c.heads, c.kv_heads, c.head_dim, c.eps
        self.q_proj = ClippableLinear(c.hidden, c.heads * c.head_dim, c.clipped)
        self.k_proj = ClippableLinear(c.hidden, c.kv_heads * c.head_dim, c.clipped)
        self.v_proj = ClippableLinear(c.hidden, c.kv_heads * c.head_dim, c.clipped)
        self.o_proj = ClippableLinear(c.heads * c.head_dim, c.hidden, c.clipped)
        self.q_norm = RMSNorm(c.head_dim, c.eps)
        self.k_norm = RMSNorm(c.head_dim, c.eps)

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        b, n, _ = x.shape
        q = axial_rope(self.q_norm(self.q_proj(x).reshape(b, n, self.heads, self.head_dim)), cos, sin)
        k = axial_rope(self.k_norm(self.k_proj(x).reshape(b, n, self.kv_heads, self.head_dim)), cos, sin)
        v = rms_norm(self.v_proj(x).reshape(b, n, self.kv_heads, self.head_dim), None, self.eps)
        out = mx.fast.scaled_dot_product_attention(
            q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), scale=1.0)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.gate_proj = ClippableLinear(c.hidden, c.intermediate, c.clipped)
        self.up_proj = ClippableLinear(c.hidden, c.intermediate, c.clipped)
        self.down_proj = ClippableLinear(c.intermediate, c.hidden, c.clipped)
        self.act = nn.gelu if c.exact_gelu else nn.gelu_approx

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class EncoderLayer(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden, c.eps)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.eps)
        self.pre_feedforward_layernorm = RMSNorm(c.hidden, c.eps)
        self.post_feedforward_layernorm = RMSNorm(c.hidden, c.eps)

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Encoder(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.layers = [EncoderLayer(c) for _ in range(c.layers)]


class PatchEmbedder(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.input_proj = nn.Linear(3 * c.patch_size**2, c.hidden, bias=False)
        self.position_embedding_table = mx.zeros((2, c.position_size, c.hidden))

    def __call__(self, pixels: mx.array, positions: mx.array) -> mx.array:
        h = self.input_proj((2 * (pixels - 0.5)).astype(self.input_proj.weight.dtype))
        table = self.position_embedding_table
        return h + table[0][positions[:, 0]] + table[1][positions[:, 1]]


class Embedder(nn.Module):
    """``Gemma4MultimodalEmbedder``: scale-free RMSNorm, then a projection to the text width."""

    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.embedding_projection = nn.Linear(c.output_dims, c.text_hidden, bias=False)
        self.eps = c.eps

    def __call__(self, x: mx.array) -> mx.array:
        return self.embedding_projection(rms_norm(x, None, self.eps))


class VisionTower(nn.Module):
    """Patches of one image → its soft-token embeddings in the text model's width."""

    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.config = c
        self.patch_embedder = PatchEmbedder(c)
        self.encoder = Encoder(c)
        if c.standardize:
            self.std_bias = mx.zeros((c.hidden,))
            self.std_scale = mx.ones((c.hidden,))
        self.embed_vision = Embedder(c)
        spatial = c.head_dim // 2
        self._inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, spatial, 2, dtype=np.float32) / spatial))

    def _rope(self, positions: np.ndarray, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        freqs = positions[..., None].astype(np.float32) * self._inv_freq  # [N, 2, head_dim/4]
        cos_np, sin_np = np.cos(freqs), np.sin(freqs)
        # (x, y) halves, each [N, head_dim/2] (the frequencies repeated, as rotate_half expects)
        cos = mx.array(np.stack([np.concatenate([cos_np[:, k], cos_np[:, k]], -1) for k in range(2)]))
        sin = mx.array(np.stack([np.concatenate([sin_np[:, k], sin_np[:, k]], -1) for k in range(2)]))
        return cos.astype(dtype), sin.astype(dtype)

    def _pool(self, positions: np.ndarray) -> mx.array:
        """``[soft_tokens, patches]`` averaging weights over each k×k block of positions."""
        k = self.config.kernel
        n = positions.shape[0]
        out = n // (k * k)
        cols = int(positions[:, 0].max()) + 1
        index = positions[:, 0] // k + (cols // k) * (positions[:, 1] // k)
        weights = np.zeros((out, n), dtype=np.float32)
        weights[index, np.arange(n)] = 1.0 / (k * k)
        return mx.array(weights)

    def __call__(self, pixels: np.ndarray, positions: np.ndarray) -> mx.array:
        """``pixels [N, 3·p²]`` in [0, 1], ``positions [N, 2]`` (x, y) → ``[N / k², text_hidden]``."""
        c = self.config
        dtype = self.patch_embedder.input_proj.weight.dtype
        h = self.patch_embedder(mx.array(pixels), mx.array(positions))[None]
        cos, sin = self._rope(positions, h.dtype)
        for layer in self.encoder.layers:
            h = layer(h, cos, sin)
        pooled = (self._pool(positions) @ h[0].astype(mx.float32)) * math.sqrt(c.hidden)
        if c.standardize:
            pooled = (pooled - self.std_bias.astype(mx.float32)) * self.std_scale.astype(mx.float32)
        return self.embed_vision(pooled.astype(dtype))


def load_tower(weights: Mapping[str, mx.array], vision_config: Mapping[str, Any], text_hidden: int, *,
               tower_prefix: str = TOWER_PREFIX, embed_prefix: str = EMBED_PREFIX) -> VisionTower:
    """Build the tower and load its checkpoint tensors (``model.vision_tower.*`` and
    ``model.embed_vision.*``, or the given prefixes: DiffusionGemma's sit under
    ``model.encoder.``); a missing or misshapen tensor raises ``ValueError``."""
    tower = VisionTower(VisionConfig(vision_config, text_hidden))
    named = []
    for name, value in weights.items():
        if name.startswith(tower_prefix):
            named.append((name[len(tower_prefix):], value))
        elif name.startswith(embed_prefix):
            key = name[len(embed_prefix):]
            if key.startswith("embedding_pre_projection_norm"):
                continue  # scale-free: no tensor in practice
            named.append(("embed_vision." + key, value))
    tower.load_weights(named, strict=True)
    mx.eval(tower.parameters())
    return tower
