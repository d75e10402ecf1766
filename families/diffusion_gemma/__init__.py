"""The DiffusionGemma family plugin (registered; the denoising engine is not built yet).

mlx-lm has no DiffusionGemma architecture, and the generic tier cannot run a denoising
model, so this plugin refuses such a model at load with a clear message instead of letting
it fail obscurely.
"""

from __future__ import annotations

from mlxrt import hookimpl
from mlxrt.errors import ModelLoadError

MLXRT_PLUGIN_KIND = "family"
MODEL_TYPES = frozenset({"diffusion_gemma"})


@hookimpl
def mlxrt_load_model(info):  # noqa: ANN001, ANN201
    if info.model_type in MODEL_TYPES:
        raise ModelLoadError(
            f"{info.model_id}: DiffusionGemma needs mlxrt's denoising engine, which this version "
            "does not have yet"
        )
    return None
