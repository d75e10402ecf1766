"""Deterministic test images for the vision tests and the golden reference script."""

from __future__ import annotations

import numpy as np
from PIL import Image


def gradient(width: int = 96, height: int = 64, seed: int = 1) -> Image.Image:
    """A smooth colour gradient with mild noise (96x64 -> 60 soft tokens at a 70 budget)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([x / width, y / height, 1 - x / width], axis=-1) * 200 + rng.normal(0, 20, (height, width, 3))
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")


def checker(width: int = 50, height: int = 120) -> Image.Image:
    """A tall black-and-white checkerboard (a different aspect ratio and content)."""
    y, x = np.mgrid[0:height, 0:width]
    board = (((x // 10) + (y // 10)) % 2 * 255).astype(np.uint8)
    return Image.fromarray(np.stack([board, board // 2, 255 - board], axis=-1), "RGB")


IMAGES = {"gradient": gradient, "checker": checker}
