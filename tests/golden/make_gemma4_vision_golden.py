"""Reference for the Gemma 4 vision path: transformers (PyTorch, CPU, float32) on the tiny
multimodal checkpoint of ``mlxrt.testing.write_tiny_checkpoint(..., "gemma4")``.

Writes ``gemma4_vision.npz`` next to this script, which ``tests/test_vision.py`` compares the
MLX port against without torch:

* ``features_<name>``: ``get_image_features(...).pooler_output`` of each test image
  (``Gemma4ImageProcessorPil`` preprocessing, vision tower, pooler, standardize, projector);
* ``ids``: a prompt with one image spliced (``<|image>`` + N x ``<|image|>`` + ``<image|>``);
* ``logits``: ``Gemma4ForConditionalGeneration`` logits at the last 2 positions of it;
* ``logits_bidir``: the same on the checkpoint written with ``BIDIR`` overrides
  (``use_bidirectional_attention: "vision"``, a sliding window shorter than the image), where
  image tokens attend to each other both ways on sliding layers.

Needs torch (the ``reference`` extra). Run from the repository root:
    /path/to/venv/bin/python tests/golden/make_gemma4_vision_golden.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from vision_images import IMAGES  # noqa: E402

#: Text-config overrides of the second (vision-bidirectional) checkpoint.
BIDIR = {"use_bidirectional_attention": "vision", "sliding_window": 16}


def reference(model_dir: Path, bidir_dir: Path) -> dict[str, np.ndarray]:
    import torch
    from transformers import Gemma4ForConditionalGeneration
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    from mlxrt.testing._tiny_gemma4_vision import IMAGE_PROCESSOR

    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    kwargs = {k: v for k, v in IMAGE_PROCESSOR.items() if k != "image_processor_type"}
    processor = Gemma4ImageProcessorPil(**kwargs)
    out: dict[str, np.ndarray] = {}
    first = None
    with torch.no_grad():
        for name, make in IMAGES.items():
            batch = processor(images=[make()], return_tensors="pt")
            feats = model.model.get_image_features(batch["pixel_values"], batch["image_position_ids"]).pooler_output[0]
            out[f"features_{name}"] = feats.float().numpy()
            if first is None:
                first = (batch, feats.shape[0])
        cfg = model.config
        batch, n = first
        text = [2, 105, 30, 31, 32, 107]
        ids = text + [cfg.boi_token_id] + [cfg.image_token_id] * n + [cfg.eoi_token_id] + [33, 34, 106, 107, 105]
        input_ids = torch.tensor([ids])
        mm = (input_ids == cfg.image_token_id).long()
        logits = model(input_ids=input_ids, pixel_values=batch["pixel_values"],
                       image_position_ids=batch["image_position_ids"], mm_token_type_ids=mm).logits[0]
        out["ids"] = np.array(ids, dtype=np.int32)
        out["logits"] = logits[-2:].float().numpy()
        bidir = Gemma4ForConditionalGeneration.from_pretrained(str(bidir_dir), dtype=torch.float32).eval()
        assert bidir.config.text_config.use_bidirectional_attention == "vision"
        logits = bidir(input_ids=input_ids, pixel_values=batch["pixel_values"],
                       image_position_ids=batch["image_position_ids"], mm_token_type_ids=mm).logits[0]
        out["logits_bidir"] = logits[-2:].float().numpy()
    return out


def main() -> None:
    from mlxrt.testing import write_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_tiny_checkpoint(Path(tmp) / "gemma4", "gemma4")
        bidir_dir = write_tiny_checkpoint(Path(tmp) / "gemma4-bidir", "gemma4", config_overrides=BIDIR)
        arrays = reference(model_dir, bidir_dir)
    target = HERE / "gemma4_vision.npz"
    np.savez_compressed(target, **arrays)
    print(f"wrote {target} ({target.stat().st_size} bytes): " + ", ".join(f"{k}{v.shape}" for k, v in arrays.items()))


if __name__ == "__main__":
    main()
