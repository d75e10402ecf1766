#!/usr/bin/env python3
"""Reference figures of transformers' DiffusionGemma (PyTorch CPU, float32) on the tiny checkpoint.

Writes ``diffusion_gemma_text.npz`` beside this file: for a fixed prompt (longer than the
sliding window) and a fixed canvas,

* ``step1``: decoder logits with no self-conditioning (the first denoising step);
* ``accept1``: the entropy-bound sampler's accepted positions on step 1's scheduled logits;
* ``step2``: decoder logits self-conditioned on step 1's scheduled logits;
* ``step3``: after the encoder appended step 2's argmax canvas to the cache (the next block's
  context), the decoder logits of a second canvas.

``diffusion_gemma_vision.npz`` (the checkpoint with its tower): for a seeded random RGB
image, the image processor's soft-token count, the projected image features, and the decoder
logits of a canvas after the encoder took the prompt with the image spliced in, its masks
built as ``generate()`` builds them (``_prepare_encoder_inputs``: the vision-bidirectional
overlay; a plain ``forward()`` drops it, FAMILIES.md 2.5).

Logits are stored as a fixed subset of vocabulary columns plus every row's argmax and
logsumexp (a few tens of KB). ``tests/test_diffusion_gemma.py`` compares the MLX port with
these without torch, and with transformers live when torch is installed
(``pip install 'mlxrt[reference]'``). Regenerate after changing the tiny checkpoint writer::

    python tests/golden/make_diffusion_gemma_golden.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "diffusion_gemma_text.npz"
GOLDEN_VISION = HERE / "diffusion_gemma_vision.npz"
#: Text around the image placeholder in the vision prompt (ids of the tiny Gemma 4 tokenizer).
VISION_HEAD = [2, 105, 300, 301]
VISION_TAIL = [302, 303, 106, 105, 400]
PROMPT_LEN = 13  # longer than the tiny model's sliding window (8)
COLUMNS = 256
STEPS = 16  # the tiny checkpoint's max_denoising_steps


def fixed_inputs(vocab: int, canvas_length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1234)
    return {
        "prompt": rng.integers(5, 1700, size=PROMPT_LEN).astype(np.int64),
        "canvas": rng.integers(0, vocab, size=canvas_length).astype(np.int64),
        "canvas2": rng.integers(0, vocab, size=canvas_length).astype(np.int64),
        "columns": np.sort(rng.choice(vocab, size=COLUMNS, replace=False)).astype(np.int64),
    }


def summarize(prefix: str, logits: np.ndarray, columns: np.ndarray) -> dict[str, np.ndarray]:
    """Columns, argmax and logsumexp of [C, V] logits."""
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    return {f"{prefix}_cols": logits[:, columns].astype(np.float32), f"{prefix}_argmax": logits.argmax(-1),
            f"{prefix}_lse": lse.astype(np.float32)}


def schedule_temperature(cur_step: int, t_min: float = 0.4, t_max: float = 0.8, steps: int = STEPS) -> float:
    return t_min + (t_max - t_min) * (cur_step / steps)


def reference(path: str | Path) -> dict[str, np.ndarray]:
    """The figures above, computed by transformers on the checkpoint folder ``path``."""
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.cache_utils import DynamicCache
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        EntropyBoundSampler,
        EntropyBoundSamplerConfig,
    )

    model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(path), dtype=torch.float32).eval()
    cfg = model.config
    inputs = fixed_inputs(cfg.text_config.vocab_size, cfg.canvas_length)
    cols = inputs["columns"]
    out = dict(inputs)
    with torch.no_grad():
        cache = DynamicCache(config=cfg.get_text_config(decoder=True))
        prompt = torch.tensor(inputs["prompt"])[None]
        model.model.encoder(input_ids=prompt, cache=cache)
        canvas = torch.tensor(inputs["canvas"])[None]
        step1 = model(decoder_input_ids=canvas, cache=cache).logits
        processed1 = step1 / schedule_temperature(STEPS)
        sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=0.1), cfg.canvas_length,
                                      cfg.text_config.vocab_size, STEPS)
        sampler.accept_canvas(canvas, processed1.argmax(-1), processed1, STEPS)
        out["accept1"] = sampler.accepted_token_mask[0].numpy()
        step2 = model(decoder_input_ids=canvas, cache=cache, self_conditioning_logits=processed1).logits
        argmax2 = step2.argmax(-1)
        out["block"] = argmax2[0].numpy()
        start = cache.get_seq_length()
        model.model.encoder(input_ids=argmax2, cache=cache,
                            position_ids=torch.arange(start, start + cfg.canvas_length)[None])
        step3 = model(decoder_input_ids=torch.tensor(inputs["canvas2"])[None], cache=cache).logits
    for name, logits in (("step1", step1), ("step2", step2), ("step3", step3)):
        out.update(summarize(name, logits[0].numpy(), cols))
    return out


def sample_image():
    """The seeded random RGB image of the vision figures (100×150)."""
    from PIL import Image

    rng = np.random.default_rng(99)
    return Image.fromarray(rng.integers(0, 256, size=(100, 150, 3), dtype=np.uint8), "RGB")


def reference_vision(path: str | Path) -> dict[str, np.ndarray]:
    """The vision figures, computed by transformers on the checkpoint folder ``path``."""
    import json

    import torch
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.cache_utils import DynamicCache
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(path), dtype=torch.float32).eval()
    cfg = model.config
    proc = json.loads((Path(path) / "processor_config.json").read_text())["image_processor"]
    processor = Gemma4ImageProcessorPil(**{k: v for k, v in proc.items() if k != "image_processor_type"})
    pixels = processor(images=[sample_image()], return_tensors="pt")
    n = int(pixels["num_soft_tokens_per_image"][0])
    ids = VISION_HEAD + [cfg.boi_token_id] + [cfg.image_token_id] * n + [cfg.eoi_token_id] + VISION_TAIL
    inputs = fixed_inputs(cfg.text_config.vocab_size, cfg.canvas_length)
    out = {"ids": np.array(ids), "canvas": inputs["canvas"], "columns": inputs["columns"]}
    with torch.no_grad():
        features = model.model.encoder.get_image_features(pixels["pixel_values"],
                                                          pixels["image_position_ids"]).pooler_output
        out["features"] = features.numpy()
        cache = DynamicCache(config=cfg.get_text_config(decoder=True))
        input_ids = torch.tensor([ids])
        mm = (input_ids == cfg.image_token_id).long()
        positions = torch.arange(len(ids))[None]
        masks = model.model.encoder.create_masks_for_generate(
            config=cfg, inputs_embeds=torch.empty(1, len(ids), 0), attention_mask=torch.ones_like(input_ids).bool(),
            cache=cache, position_ids=positions, mm_token_type_ids=mm)
        model.model.encoder(input_ids=input_ids, pixel_values=pixels["pixel_values"],
                            image_position_ids=pixels["image_position_ids"], mm_token_type_ids=mm,
                            attention_mask=masks, cache=cache, position_ids=positions)
        logits = model(decoder_input_ids=torch.tensor(inputs["canvas"])[None], cache=cache).logits
    out.update(summarize("image", logits[0].numpy(), inputs["columns"]))
    return out


def main() -> None:
    from mlxrt.testing import write_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp) / "dg", "diffusion_gemma_no_vision")
        figures = reference(path)
        vision = reference_vision(write_tiny_checkpoint(Path(tmp) / "dgv", "diffusion_gemma"))
    for target, data in ((GOLDEN, figures), (GOLDEN_VISION, vision)):
        np.savez_compressed(target, **data)
        print(f"wrote {target} ({target.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
