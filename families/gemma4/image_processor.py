"""Gemma 4 image preprocessing, as transformers' ``Gemma4ImageProcessorPil`` does it.

An RGB image is resized (bicubic, aspect ratio kept) to the largest size whose sides are
multiples of ``pooling_kernel_size * patch_size`` (48) and whose patch count fits
``max_soft_tokens * pooling_kernel_size**2``; rescaled to [0, 1] (no mean/std: the tower maps
``2 * (x - 0.5)`` itself); cut into ``patch_size`` squares flattened as (row, col, channel).
Each patch gets its (x, y) grid position. Unlike transformers, the patches are not padded to
the budget: the tower attends only to real patches anyway, and padding is dropped after
pooling, so the result is the same with less work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

__all__ = ["ImageProcessor", "Patches", "SOFT_TOKEN_BUDGETS"]

SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)


@attrs.frozen
class Patches:
    """One image as the tower takes it.

    :ivar pixels: ``float32 [num_patches, patch_size**2 * 3]`` in [0, 1].
    :ivar positions: ``int32 [num_patches, 2]``: (x, y) of each patch.
    :ivar soft_tokens: Embeddings the image becomes (``num_patches / pooling_kernel_size**2``).
    """

    pixels: Any = attrs.field(eq=False, repr=False)
    positions: Any = attrs.field(eq=False, repr=False)
    soft_tokens: int


def target_size(height: int, width: int, patch_size: int, max_patches: int, kernel: int) -> tuple[int, int]:
    """The resized (height, width): transformers' ``get_aspect_ratio_preserving_size``."""
    factor = math.sqrt(max_patches * patch_size**2 / (height * width))
    side = kernel * patch_size
    h = int(math.floor(factor * height / side)) * side
    w = int(math.floor(factor * width / side)) * side
    if h == 0 and w == 0:
        raise ValueError("the image would resize to 0 x 0")
    longest = (max_patches // kernel**2) * side
    if h == 0:
        h, w = side, min(int(math.floor(width / height)) * side, longest)
    elif w == 0:
        h, w = min(int(math.floor(height / width)) * side, longest), side
    return h, w


@attrs.frozen
class ImageProcessor:
    """The checkpoint's image-processor settings (``processor_config.json``'s
    ``image_processor``, or ``preprocessor_config.json``)."""

    patch_size: int = 16
    max_soft_tokens: int = 280
    pooling_kernel_size: int = 3
    rescale_factor: float = 1 / 255

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None, vision_config: Mapping[str, Any]) -> ImageProcessor:
        cfg = cfg or {}
        budget = int(cfg.get("max_soft_tokens") or 280)
        if budget not in SOFT_TOKEN_BUDGETS:
            raise ValueError(f"max_soft_tokens must be one of {SOFT_TOKEN_BUDGETS}, not {budget}")
        return cls(patch_size=int(cfg.get("patch_size") or vision_config.get("patch_size") or 16),
                   max_soft_tokens=budget,
                   pooling_kernel_size=int(cfg.get("pooling_kernel_size")
                                           or vision_config.get("pooling_kernel_size") or 3),
                   rescale_factor=float(cfg.get("rescale_factor") or 1 / 255))

    def __call__(self, image: Any) -> Patches:
        """An RGB :class:`PIL.Image.Image` → its :class:`Patches`."""
        from PIL import Image

        p, k = self.patch_size, self.pooling_kernel_size
        width, height = image.size
        h, w = target_size(height, width, p, self.max_soft_tokens * k * k, k)
        if (h, w) != (height, width):
            image = image.resize((w, h), resample=Image.Resampling.BICUBIC)
        array = np.asarray(image, dtype=np.float32) * np.float32(self.rescale_factor)  # [h, w, 3]
        rows, cols = h // p, w // p
        pixels = array.reshape(rows, p, cols, p, 3).transpose(0, 2, 1, 3, 4).reshape(rows * cols, p * p * 3)
        xs, ys = np.meshgrid(np.arange(cols), np.arange(rows), indexing="xy")
        positions = np.stack([xs, ys], axis=-1).reshape(rows * cols, 2).astype(np.int32)
        return Patches(pixels=np.ascontiguousarray(pixels), positions=positions, soft_tokens=rows * cols // (k * k))
