"""Gemma 4 vision tower speed: preprocessing and one image through the MLX tower + projector.

Random weights at the real Gemma 4 E2B/E4B tower size (hidden 768, 16 layers, 12 heads of 64,
MLP 3072, position tables 2×10240) projecting to a ``--text-hidden`` text width, float32, on the
default MLX device. For each soft-token budget it times the image processor (PIL resize,
patchify) and the tower (best of ``--repeats`` after one warm-up run).

    python benchmarks/vision.py                      # budgets 70, 140, 280
    python benchmarks/vision.py --budgets 280 1120 --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import time

from mlxrt.loading.blas import activate

# As `mlxrt serve` does: the system OpenBLAS before MLX loads (fp32 matmuls; --no-system-blas: off).
BLAS = activate(sys.argv)

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from mlxrt.families.gemma4.image_processor import ImageProcessor  # noqa: E402
from mlxrt.families.gemma4.vision import VisionConfig, VisionTower  # noqa: E402

E2B_VISION = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16, "num_attention_heads": 12,
              "num_key_value_heads": 12, "head_dim": 64, "patch_size": 16, "pooling_kernel_size": 3,
              "position_embedding_size": 10240, "standardize": False}


def random_tower(text_hidden: int) -> VisionTower:
    from mlx.utils import tree_flatten, tree_unflatten

    tower = VisionTower(VisionConfig(E2B_VISION, text_hidden))
    rng = np.random.default_rng(0)
    params = [(k, mx.array(rng.normal(0, 0.02, v.shape).astype(np.float32))) for k, v in tree_flatten(tower.parameters())]
    tower.update(tree_unflatten(params))
    mx.eval(tower.parameters())
    return tower


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budgets", type=int, nargs="+", default=[70, 140, 280])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--text-hidden", type=int, default=1536)
    p.add_argument("--no-system-blas", action="store_true", help="Keep the BLAS bundled with mlx.")
    a = p.parse_args()
    tower = random_tower(a.text_hidden)
    rng = np.random.default_rng(1)
    image = Image.fromarray(rng.integers(0, 255, (768, 1024, 3), dtype=np.uint8), "RGB")
    print(f"BLAS {BLAS}; device {mx.default_device()}, image 1024x768, tower E2B-size float32, text hidden {a.text_hidden}")
    print(f"{'budget':>7} {'patches':>8} {'soft':>5} {'preprocess ms':>14} {'tower ms':>9}")
    for budget in a.budgets:
        processor = ImageProcessor(max_soft_tokens=budget)
        t0 = time.perf_counter()
        patches = processor(image)
        prep = (time.perf_counter() - t0) * 1000
        mx.eval(tower(patches.pixels, patches.positions))  # warm-up
        best = float("inf")
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            mx.eval(tower(patches.pixels, patches.positions))
            best = min(best, (time.perf_counter() - t0) * 1000)
        print(f"{budget:>7} {patches.pixels.shape[0]:>8} {patches.soft_tokens:>5} {prep:>14.1f} {best:>9.1f}")


if __name__ == "__main__":
    main()
