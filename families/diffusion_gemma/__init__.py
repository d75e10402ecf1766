"""The DiffusionGemma family plugin: a block-diffusion model behind the engine's denoising lane.

``mlxrt_load_model`` loads the MLX port (:mod:`.model`) and hands the engine a
:class:`~mlxrt.records.Denoiser` (:mod:`.generation`) with ``engine="denoising"``: requests run
on the serial lane, text streams one settled block at a time, and there is no prompt cache.
``mlxrt_vision`` gives the adapter of its own vision tower (:mod:`.vision`), loaded on the first
image. Model code is imported inside the hooks so ``mlxrt plugins`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlxrt import EngineKind, LoadedModel, ModelInfo, VisionAdapter, hookimpl
from mlxrt.errors import ModelLoadError
from mlxrt.host import PluginHost

if TYPE_CHECKING:
    from mlxrt.serving import ServedModel

MLXRT_PLUGIN_KIND = "family"
MODEL_TYPES = frozenset({"diffusion_gemma"})


def _eos_ids(info: ModelInfo) -> list[int]:
    eos = info.generation_config.get("eos_token_id")
    if eos is None:
        eos = (info.config.get("text_config") or {}).get("eos_token_id", 1)
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


@hookimpl
def mlxrt_load_model(info: ModelInfo, host: PluginHost) -> LoadedModel | None:
    if info.model_type not in MODEL_TYPES:
        return None
    from mlxrt.families.diffusion_gemma.generation import DenoiseSchedule, DiffusionGenerator
    from mlxrt.families.diffusion_gemma.model import load_text_model
    from mlxrt.records import LoadedModel
    from mlxrt.text.tokenizer import load_tokenizer

    try:
        model = load_text_model(info.path, info.config)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        raise ModelLoadError(f"{info.model_id}: cannot load the DiffusionGemma checkpoint: {exc}") from exc
    eos = _eos_ids(info)
    tokenizer = load_tokenizer(info.path, eos_token_ids=eos)
    schedule = DenoiseSchedule.from_generation_config(info.generation_config)
    chunk = int(host.options.get("prefill_step_size") or 2048)  # --prefill-step-size
    return LoadedModel(model=model, tokenizer=tokenizer, engine=EngineKind.DENOISING,
                       denoiser=DiffusionGenerator(model, schedule, eos, prefill_chunk=chunk))


@hookimpl
def mlxrt_vision(info: ModelInfo, model: ServedModel) -> VisionAdapter | None:
    if info.model_type not in MODEL_TYPES:
        return None
    import json

    from mlxrt.families.diffusion_gemma.vision import DiffusionVision

    processor: dict[str, Any] = {}
    path = info.path / "processor_config.json"
    if path.is_file():
        processor = json.loads(path.read_text(encoding="utf-8")).get("image_processor") or {}
    # Answered for every DiffusionGemma checkpoint: one without a tower refuses images with a
    # clear 400 ("this checkpoint has no vision tower") instead of "the model has no vision input".
    return DiffusionVision(info.path, info.config, processor, model=lambda: model.loaded.model)
