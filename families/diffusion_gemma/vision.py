"""DiffusionGemma's vision input: the adapter that splices one image's soft tokens into the
prompt for the encoder.

* The tower and projector are Gemma 4's (:mod:`mlxrt.families.gemma4.vision`, the image
  processor :mod:`mlxrt.families.gemma4.image_processor`); only their checkpoint names differ:
  ``model.encoder.vision_tower.*`` and ``model.encoder.embed_vision.*``.
  Reference: transformers' ``Gemma4VisionModel`` / ``Gemma4ImageProcessorPil``.
* The merge happens on the encoder side only: the placeholder ``<|image|>`` of the prompt
  becomes ``<|image>`` + N × ``<|image|>`` + ``<image|>``, whose N rows take the projected
  features (not rescaled), and those N positions attend to each other both ways
  (``use_bidirectional_attention = "vision"``). The decoder never sees pixels.

The tower loads on the first image request; a text-only session never pays for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import mlx.core as mx

from mlxrt.errors import InvalidRequest
from mlxrt.families.gemma4 import splice as gemma4_splice
from mlxrt.families.gemma4.image_processor import ImageProcessor
from mlxrt.families.gemma4.vision import VisionTower, load_tower
from mlxrt.records import SplicedPrompt

__all__ = ["DiffusionVision", "image_blocks"]

ONE_IMAGE = "DiffusionGemma image input supports exactly one image"
NO_TOWER = "this checkpoint has no vision tower"
TOWER_PREFIX = "model.encoder.vision_tower."
EMBED_PREFIX = "model.encoder.embed_vision."


def image_blocks(ids: Sequence[int], image_token_id: int | None) -> mx.array:
    """Per position, the index of the contiguous image-token run it is in, or -1 (text)."""
    return mx.array(gemma4_splice.image_blocks(list(ids), image_token_id), dtype=mx.int32)


class DiffusionVision:
    """The ``VisionAdapter`` of a DiffusionGemma checkpoint (tower loaded on first use).

    ``splice(prompt_ids, images)`` takes the prompt's ids, with one ``image_token_id``
    placeholder where the image goes, and decoded RGB ``PIL.Image.Image``\\ s (exactly one).
    """

    def __init__(self, path: str | Path, config: Mapping[str, Any], processor: Mapping[str, Any],
                 model: Callable[[], Any]) -> None:
        self.path = Path(path)
        self._model = model  # the loaded text model (the engine's, at splice time)
        self.vision_config: Mapping[str, Any] = config.get("vision_config") or {}
        self.text_hidden = int((config.get("text_config") or config)["hidden_size"])
        self.image_token_id = int(config.get("image_token_id", 258_880))
        self.boi, self.eoi = int(config.get("boi_token_id", 255_999)), int(config.get("eoi_token_id", 258_882))
        self.max_soft_tokens = int(processor.get("max_soft_tokens", 280))
        self._tower: VisionTower | None = None

    @property
    def has_tower(self) -> bool:
        if not self.vision_config:
            return False
        return any(k.startswith(TOWER_PREFIX)
                   for f in self.path.glob("*.safetensors") for k in gemma4_splice._tensor_names(f))

    def tower(self) -> VisionTower:
        if self._tower is None:
            if not self.has_tower:
                raise InvalidRequest(NO_TOWER, param="messages")
            weights: dict[str, mx.array] = {}
            for file in sorted(self.path.glob("*.safetensors")):
                tensors = cast("dict[str, mx.array]", mx.load(str(file)))  # a .safetensors file: a dict
                weights.update({k: v for k, v in tensors.items() if k.startswith((TOWER_PREFIX, EMBED_PREFIX))})
            self._tower = load_tower(weights, self.vision_config, self.text_hidden,
                                     tower_prefix=TOWER_PREFIX, embed_prefix=EMBED_PREFIX)
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
        processor = ImageProcessor(patch_size=c.patch_size, max_soft_tokens=self.max_soft_tokens,
                                   pooling_kernel_size=c.kernel)
        image = images[0] if images[0].mode == "RGB" else images[0].convert("RGB")
        try:
            patches = processor(image)
        except ValueError:  # it would resize to 0 x 0
            raise InvalidRequest("the image is too small to encode") from None
        try:
            features = tower(patches.pixels, patches.positions)
            mx.eval(features)
        finally:
            del patches  # the pixel buffer is released on every path
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
