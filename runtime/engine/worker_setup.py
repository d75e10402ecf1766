"""The worker's set-up after a load: everything the engine builds around the loaded model
before it serves the first request.

:func:`set_up` resolves the quantized KV scheme (:mod:`mlxrt.engine.kv_quant`), loads the
speculator (:mod:`mlxrt.engine.speculative`), plans memory (:mod:`mlxrt.engine.memory`), opens
the prompt cache (:mod:`mlxrt.cache.prompt_store`) and builds the lanes
(:mod:`mlxrt.engine.lanes`); :func:`warm_up` runs one token so the first request does not pay
for the imports. Both run on the engine's worker thread, on its MLX stream.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from mlxrt.cache.prompt_cache import PromptCache, snapshots_from
from mlxrt.cache.prompt_store import open_prompt_cache
from mlxrt.engine.kv_quant import KVScheme, QuantizingModel, resolve_kv_scheme
from mlxrt.engine.lanes import BatchLane, Done, SerialLane, batchable
from mlxrt.engine.memory import MemoryPlan, measure_kv, plan_memory, weight_bytes
from mlxrt.engine.speculative import Speculator, load_speculator

if TYPE_CHECKING:
    from mlxrt.engine.adapters import AdapterRegistry
    from mlxrt.engine.config import EngineConfig
    from mlxrt.engine.denoising_lane import DenoisingLane
    from mlxrt.engine.loader import ModelLoader
    from mlxrt.records import LoadedModel, ModelInfo
    from mlxrt.registry import PluginHost

__all__ = ["WorkerSetup", "set_up", "new_batch_lane", "warm_up"]

log = logging.getLogger("mlxrt.engine.engine")  # the engine's logger: its warnings read as before


@attrs.define
class WorkerSetup:
    """What :func:`set_up` built around one loaded model.

    :ivar eos: The tokenizer's end-of-sequence ids.
    :ivar kv: The quantized KV scheme, or None (full-precision caches).
    :ivar speculator: The draft model (``--draft-model``), or None.
    :ivar memory: The memory plan, or None (a model that is not autoregressive).
    :ivar prompt_cache: The prompt cache, or None: the engine keeps its disabled one.
    :ivar snapshots_from: Context length from which rows keep prompt snapshots (the model's
        cache cannot be rewound past it; :func:`mlxrt.cache.prompt_cache.snapshots_from`), or
        None: never.
    :ivar serial: The serial lane (the denoising lane for a denoising model), or None.
    :ivar batch: The batch lane, or None: requests run one at a time.
    :ivar new_batch: Builds a fresh batch lane of so many rows (after a failed step), or None.
    """

    eos: frozenset[int]
    kv: KVScheme | None = None
    speculator: Speculator | None = None
    memory: MemoryPlan | None = None
    prompt_cache: PromptCache | None = None
    snapshots_from: int | None = None
    serial: SerialLane | DenoisingLane | None = None
    batch: BatchLane | None = None
    new_batch: Callable[[int], BatchLane] | None = None


def set_up(loaded: LoadedModel, info: ModelInfo, host: PluginHost, config: EngineConfig,
           adapters: AdapterRegistry, *, stream: Any, done: Done, tick: Callable[[int], None],
           loader: ModelLoader) -> WorkerSetup:
    """Plan memory, size the prompt cache and choose the lane for ``loaded`` (on the worker).

    ``done`` and ``tick`` are the scheduler's callbacks the lanes report to; ``loader`` loads
    ``--draft-model``.

    :raises ModelLoadError: Settings this model cannot be served with.
    """
    model, cfg = loaded.model, config
    setup = WorkerSetup(eos=frozenset(loaded.tokenizer.eos_token_ids or ()))
    if loaded.engine == "denoising":  # its own serial lane: no prompt cache, no batch
        from mlxrt.engine.denoising_lane import DenoisingLane

        setup.serial = DenoisingLane(loaded.denoiser, done=done, tick=tick)
        return setup
    if loaded.engine != "autoregressive":
        return setup
    kv = setup.kv = resolve_kv_scheme(kv_quant=cfg.kv_quant, kv_bits=cfg.kv_bits, kv_group_size=cfg.kv_group_size,
                                      quantized_kv_start=cfg.quantized_kv_start,
                                      model_path=Path(info.path) if info.path else None)
    if kv is not None:
        kv.check(model)
    spec = None
    if cfg.draft_model:
        if kv is not None:
            from mlxrt.errors import ModelLoadError

            raise ModelLoadError(f"--draft-model cannot be combined with quantized KV caches ({kv.source})")
        spec = setup.speculator = load_speculator(cfg.draft_model, host, loaded, info,
                                                  num_draft_tokens=cfg.num_draft_tokens, loader=loader)
    can_batch = batchable(model) and kv is None and spec is None
    rows = cfg.batch if (cfg.batch > 1 and can_batch) else 1
    try:
        cost = measure_kv(model)
        if spec is not None:  # every row keeps the draft's KV beside the model's
            draft_kv = measure_kv(spec.model)
            cost = attrs.evolve(cost, per_token=cost.per_token + draft_kv.per_token,
                                fixed=cost.fixed + draft_kv.fixed)
    except Exception:  # a model outside mlx-lm's cache protocol: no KV figures
        log.debug("could not measure KV cost", exc_info=True)
        from mlxrt.engine.memory import KVCost

        cost = KVCost(0, 0)
    weights = weight_bytes(model) + (weight_bytes(spec.model) if spec else 0)
    memory = setup.memory = plan_memory(weights, cost, budget=cfg.memory_budget,
                                        prompt_cache_bytes=cfg.prompt_cache_bytes, rows=rows)
    setup.prompt_cache = open_prompt_cache(
        cfg.prompt_cache_dir, max_entries=cfg.prompt_cache_size, max_bytes=memory.prompt_cache_bytes,
        max_disk_bytes=cfg.prompt_cache_dir_bytes, model_path=info.path,
        models=[model] + ([spec.model] if spec else []),
        dtype=loaded.dtype.cast if loaded.dtype is not None else None,
        kv=kv.describe() if kv is not None else None,
        draft_path=spec.info.path if spec else None, adapters=adapters)
    setup.snapshots_from = _snapshots_from(model) if spec is None else None
    serial_model = QuantizingModel(model, kv) if kv is not None else model
    setup.serial = SerialLane(serial_model, stream=stream, prefill_step_size=cfg.prefill_step_size,
                              done=done, tick=tick, speculator=spec)
    setup.new_batch = functools.partial(new_batch_lane, loaded, cfg, adapters, stream=stream, eos=setup.eos,
                                        done=done, tick=tick)
    if rows > 1:
        setup.batch = setup.new_batch(rows)
    elif cfg.batch > 1 and spec is not None:
        log.warning("--batch %d with --draft-model: speculative decoding runs one sequence at a time, so "
                    "every request runs in the serial lane", cfg.batch)
    elif cfg.batch > 1 and kv is not None:
        log.warning("--batch %d: quantized KV caches (%s) cannot join a batch (mlx-lm's QuantizedKVCache "
                    "has no merge); requests run one at a time", cfg.batch, kv.source)
    elif cfg.batch > 1:
        log.warning("--batch %d: this model's cache layers cannot be batched (no merge); "
                    "requests run one at a time", cfg.batch)
    return setup


def new_batch_lane(loaded: LoadedModel, config: EngineConfig, adapters: AdapterRegistry, rows: int, *,
                   stream: Any, eos: frozenset[int], done: Done, tick: Callable[[int], None]) -> BatchLane:
    """A batch lane of ``rows`` rows over ``loaded``'s model."""
    return BatchLane(loaded.model, stream=stream, size=rows, prefill_batch_size=config.prompt_concurrency,
                     prefill_step_size=config.prefill_step_size, eos=sorted(eos),
                     done=done, tick=tick, adapters=adapters)


def warm_up(loaded: LoadedModel, stream: Any) -> None:
    """Import the decode path and run one token, so the first request does not pay for it."""
    if loaded.engine != "autoregressive":
        return
    try:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        from mlxrt.engine.steps import token_steps

        first = loaded.tokenizer.eos_token_id or 0
        for _ in token_steps(mx.array([first]), loaded.model, max_tokens=1, stream=stream,
                             cache=make_prompt_cache(loaded.model)):
            pass
    except Exception:  # a model that cannot warm up will fail its first request visibly
        log.warning("engine warm-up failed", exc_info=True)


def _snapshots_from(model: Any) -> int | None:
    from mlx_lm.models.cache import make_prompt_cache

    try:
        return snapshots_from(make_prompt_cache(model))
    except Exception:  # a model outside mlx-lm's cache protocol: nothing is cached for it anyway
        return None
