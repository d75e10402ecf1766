"""DiffusionGemma's vision input: its Gemma-4 vision tower in MLX, the image processor, and the
adapter that splices one image's soft tokens into the prompt for the encoder.

* The tower (``model.encoder.vision_tower.*``): a bidirectional ViT over 16×16 patches with
  learned x/y position tables, axial 2-D RoPE, q/k/v norms and sandwich norms, then 3×3
  average pooling by patch position, ``sqrt(hidden)`` scaling and standardization; the
  projector (``model.encoder.embed_vision``) maps the pooled features to the text width.
  Reference: transformers' ``Gemma4VisionModel`` / ``Gemma4ImageProcessorPil``.
* The merge happens on the encoder side only: the placeholder ``<|image|>`` of the prompt
  becomes ``<|image>`` + N × ``<|image|>`` + ``<image|>``, whose N rows take the projected
  features (not rescaled), and those N positions attend to each other both ways
  (``use_bidirectional_attention = "vision"``). The decoder never sees pixels.

The tower loads on the first image request; a text-only session never pays for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxrt.errors import InvalidRequest
from mlxrt.families.diffusion_gemma.model import RMSNorm, apply_rope, gelu, rms_norm
from mlxrt.records import SplicedPrompt

__all__ = ["DiffusionVision", "VisionTower", "image_blocks", "preprocess"]

ONE_IMAGE = "DiffusionGemma image input supports exactly one image"
NO_TOWER = "this checkpoint has no vision tower"


def image_blocks(ids: Sequence[int], image_token_id: int | None) -> mx.array:
    """Per position, the index of the contiguous image-token run it is in, or -1 (text)."""
    out, block, prev = [], -1, False
    for t in ids:
        cur = t == image_token_id
        if cur and not prev:
            block += 1
        out.append(block if cur else -1)
        prev = cur
    return mx.array(out, dtype=mx.int32)


def target_size(height: int, width: int, patch: int, max_patches: int, pool: int) -> tuple[int, int]:
    """The aspect-preserving size within ``max_patches`` patches, sides multiples of ``pool*patch``."""
    factor = math.sqrt(max_patches * patch * patch / (height * width))
    side = pool * patch
    th, tw = int(math.floor(factor * height / side)) * side, int(math.floor(factor * width / side)) * side
    longest = (max_patches // pool**2) * side
    if th == 0 and tw == 0:
        raise InvalidRequest("the image is too small to encode")
    if th == 0:
        th, tw = side, min(int(math.floor(width / height)) * side, longest)
    elif tw == 0:
        tw, th = side, min(int(math.floor(height / width)) * side, longest)
    return th, tw


def preprocess(image: Any, *, patch: int = 16, max_soft_tokens: int = 280, pool: int = 3) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """An RGB ``PIL.Image`` → (patches [N, 3·patch²] in [0, 1], (x, y) patch positions [N, 2])."""
    from PIL import Image

    th, tw = target_size(image.height, image.width, patch, max_soft_tokens * pool**2, pool)
    if (image.height, image.width) != (th, tw):
        image = image.resize((tw, th), Image.Resampling.BICUBIC)
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / 255.0  # [3, H, W]
    ph, pw = th // patch, tw // patch
    patches = pixels.reshape(3, ph, patch, pw, patch).transpose(1, 3, 2, 4, 0).reshape(ph * pw, -1)
    gx, gy = np.meshgrid(np.arange(pw), np.arange(ph), indexing="xy")
    return patches, np.stack([gx, gy], axis=-1).reshape(-1, 2)


class ClippableLinear(nn.Module):
    def __init__(self, in_f: int, out_f: int, clipped: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(in_f, out_f, bias=False)
        if clipped:
            for name in ("input_min", "input_max", "output_min", "output_max"):
                setattr(self, name, mx.array(math.inf if name.endswith("max") else -math.inf))
        self.clipped = clipped

    def __call__(self, x: mx.array) -> mx.array:
        if self.clipped:
            x = mx.clip(x, self.input_min, self.input_max)
        y = self.linear(x)
        return mx.clip(y, self.output_min, self.output_max) if self.clipped else y


class _Attention(nn.Module):
    def __init__(self, c: Mapping[str, Any]) -> None:
        super().__init__()
        h, d, clip = c["hidden_size"], c["head_dim"], bool(c.get("use_clipped_linears"))
        self.head_dim, self.eps = d, c.get("rms_norm_eps", 1e-6)
        self.q_proj = ClippableLinear(h, c["num_attention_heads"] * d, clip)
        self.k_proj = ClippableLinear(h, c["num_key_value_heads"] * d, clip)
        self.v_proj = ClippableLinear(h, c["num_key_value_heads"] * d, clip)
        self.o_proj = ClippableLinear(c["num_attention_heads"] * d, h, clip)
        self.q_norm = RMSNorm(d, self.eps)
        self.k_norm = RMSNorm(d, self.eps)

    def __call__(self, x: mx.array, rope: tuple[mx.array, mx.array]) -> mx.array:
        b, n, _ = x.shape
        shape = (b, n, -1, self.head_dim)
        q = _axial_rope(self.q_norm(self.q_proj(x).reshape(shape)), *rope)
        k = _axial_rope(self.k_norm(self.k_proj(x).reshape(shape)), *rope)
        v = rms_norm(self.v_proj(x).reshape(shape), None, self.eps)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


def _axial_rope(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """Rotate the first half of the head by the x position, the second half by the y position."""
    half = x.shape[-1] // 2
    return mx.concatenate([apply_rope(x[..., :half], cos[:, :half], sin[:, :half]),
                           apply_rope(x[..., half:], cos[:, half:], sin[:, half:])], axis=-1)


class _MLP(nn.Module):
    def __init__(self, c: Mapping[str, Any]) -> None:
        super().__init__()
        h, i, clip = c["hidden_size"], c["intermediate_size"], bool(c.get("use_clipped_linears"))
        self.gate_proj = ClippableLinear(h, i, clip)
        self.up_proj = ClippableLinear(h, i, clip)
        self.down_proj = ClippableLinear(i, h, clip)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(gelu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, c: Mapping[str, Any]) -> None:
        super().__init__()
        eps = c.get("rms_norm_eps", 1e-6)
        self.self_attn = _Attention(c)
        self.mlp = _MLP(c)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, RMSNorm(c["hidden_size"], eps))

    def __call__(self, x: mx.array, rope: tuple[mx.array, mx.array]) -> mx.array:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class _PatchEmbedder(nn.Module):
    def __init__(self, c: Mapping[str, Any]) -> None:
        super().__init__()
        self.input_proj = nn.Linear(3 * c["patch_size"] ** 2, c["hidden_size"], bias=False)
        self.position_embedding_table = mx.zeros((2, c["position_embedding_size"], c["hidden_size"]))


class _Encoder(nn.Module):
    def __init__(self, c: Mapping[str, Any]) -> None:
        super().__init__()
        self.layers = [_Layer(c) for _ in range(c["num_hidden_layers"])]


class _Projector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int) -> None:
        super().__init__()
        self.embedding_projection = nn.Linear(vision_hidden, text_hidden, bias=False)


class VisionTower(nn.Module):
    """The tower and projector; ``__call__(patches, positions)`` → [soft tokens, text hidden]."""

    def __init__(self, c: Mapping[str, Any], text_hidden: int) -> None:
        super().__init__()
        self.config = dict(c)
        self.patch_embedder = _PatchEmbedder(c)
        self.encoder = _Encoder(c)
        if c.get("standardize"):
            self.std_bias = mx.zeros((c["hidden_size"],))
            self.std_scale = mx.ones((c["hidden_size"],))
        self.embed_vision = _Projector(c["hidden_size"], text_hidden)
        theta = float((c.get("rope_parameters") or {}).get("rope_theta", 100.0))
        spatial = c["head_dim"] // 2
        self._inv = 1.0 / (theta ** (mx.arange(0, spatial, 2, dtype=mx.float32) / spatial))

    def __call__(self, patches: mx.array, positions: mx.array) -> mx.array:
        c = self.config
        dtype = self.patch_embedder.input_proj.weight.dtype
        table = self.patch_embedder.position_embedding_table
        x = self.patch_embedder.input_proj((2 * (patches - 0.5)).astype(dtype))
        x = (x + table[0][positions[:, 0]] + table[1][positions[:, 1]])[None]
        fx = positions[:, 0:1].astype(mx.float32) * self._inv
        fy = positions[:, 1:2].astype(mx.float32) * self._inv
        freqs = mx.concatenate([fx, fx, fy, fy], axis=-1)
        rope = (mx.cos(freqs).astype(x.dtype), mx.sin(freqs).astype(x.dtype))
        for layer in self.encoder.layers:
            x = layer(x, rope)
        pooled = _pool(x[0].astype(mx.float32), positions, c["pooling_kernel_size"]) * math.sqrt(c["hidden_size"])
        if "std_bias" in self:
            pooled = (pooled - self.std_bias.astype(mx.float32)) * self.std_scale.astype(mx.float32)
        pooled = rms_norm(pooled.astype(dtype), None, c.get("rms_norm_eps", 1e-6))
        return self.embed_vision.embedding_projection(pooled)


def _pool(x: mx.array, positions: mx.array, k: int) -> mx.array:
    """Average ``k``×``k`` neighbourhoods of patches (by position) into one soft token each."""
    width = int(positions[:, 0].max().item()) + 1
    cells = (positions[:, 0] // k) + (width // k) * (positions[:, 1] // k)
    n = x.shape[0] // (k * k)
    onehot = (cells[None, :] == mx.arange(n)[:, None]).astype(mx.float32) / (k * k)  # [n, patches]
    return onehot @ x


class DiffusionVision:
    """The ``VisionAdapter`` of a DiffusionGemma checkpoint (tower loaded on first use).

    ``splice(prompt_ids, images)`` takes the prompt's ids, with one ``image_token_id``
    placeholder where the image goes, and decoded RGB ``PIL.Image.Image``\\ s (exactly one).
    """

    def __init__(self, path: str | Path, config: Mapping[str, Any], processor: Mapping[str, Any],
                 model: Callable[[], Any]) -> None:
        self.path = Path(path)
        self._model = model  # the loaded text model (the engine's, at splice time)
        self.vision_config = config.get("vision_config")
        self.text_hidden = int((config.get("text_config") or config)["hidden_size"])
        self.image_token_id = int(config.get("image_token_id", 258_880))
        self.boi, self.eoi = int(config.get("boi_token_id", 255_999)), int(config.get("eoi_token_id", 258_882))
        self.max_soft_tokens = int(processor.get("max_soft_tokens", 280))
        self._tower: VisionTower | None = None

    @property
    def has_tower(self) -> bool:
        if not self.vision_config:
            return False
        return any(k.startswith("model.encoder.vision_tower.")
                   for f in self.path.glob("*.safetensors") for k in _tensor_names(f))

    def tower(self) -> VisionTower:
        if self._tower is None:
            if not self.has_tower:
                raise InvalidRequest(NO_TOWER, param="messages")
            weights: dict[str, mx.array] = {}
            for file in sorted(self.path.glob("*.safetensors")):
                for name, value in mx.load(str(file)).items():
                    for prefix in ("model.encoder.vision_tower.", "model.encoder."):
                        if name.startswith(prefix) and (prefix.endswith("tower.") or "embed_vision" in name):
                            weights[name.removeprefix(prefix)] = value
                            break
            tower = VisionTower(self.vision_config, self.text_hidden)
            tower.load_weights(list(weights.items()), strict=True)
            mx.eval(tower.parameters())
            self._tower = tower
        return self._tower

    def splice(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> SplicedPrompt:
        """Encode the one image and expand its placeholder in ``prompt_ids``.

        :raises InvalidRequest: Not exactly one image; no tower; not exactly one placeholder.
        """
        if len(images) != 1:
            raise InvalidRequest(ONE_IMAGE, param="messages")
        tower = self.tower()
        ids = list(prompt_ids)
        spots = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(spots) != 1:
            raise InvalidRequest(f"the prompt must hold exactly one image placeholder, not {len(spots)}",
                                 param="messages")
        c = tower.config
        patches, positions = preprocess(images[0], patch=c["patch_size"], max_soft_tokens=self.max_soft_tokens,
                                        pool=c["pooling_kernel_size"])
        try:
            features = tower(mx.array(patches), mx.array(positions.astype(np.int32)))
            mx.eval(features)
        finally:
            del patches, positions  # the pixel buffer is released on every path
        at = spots[0]
        n = features.shape[0]
        head, tail = ids[:at], ids[at + 1:]
        core = [self.image_token_id] * n
        core = core if head[-1:] == [self.boi] else [self.boi, *core]
        core = core if tail[:1] == [self.eoi] else [*core, self.eoi]
        ids = head + core + tail
        text = self._model()
        is_image = mx.array(ids) == self.image_token_id
        row = mx.maximum(mx.cumsum(is_image.astype(mx.int32)) - 1, 0)
        # Image rows take the features as they are (not rescaled, unlike Gemma4Model's merge).
        embeddings = mx.where(is_image[:, None], features[row].astype(text.embed_weight.dtype),
                              text.embed(mx.array(ids, dtype=mx.int32)))
        mx.eval(embeddings)
        return SplicedPrompt(ids=tuple(ids), embeddings=embeddings, images=1)


def _tensor_names(path: Path) -> list[str]:
    """Tensor names of a safetensors file, from its header (no data read)."""
    import json
    import struct

    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return [k for k in json.loads(f.read(size)) if k != "__metadata__"]
