"""The engine room: the worker thread that owns MLX and everything it runs per request.

The engine facade (:mod:`mlxrt.engine.engine`), the worker's set-up after a load
(:mod:`mlxrt.engine.worker_setup`), the scheduler that queues and admits requests
(:mod:`mlxrt.engine.scheduler`), the seam for peers that share the model
(:mod:`mlxrt.engine.peers`), the serial and batch lanes, the denoising lane,
speculative decoding, quantized KV caches, the memory contract and admission, the sampler chain,
LoRA adapters and embeddings. The pool of engines one process serves is :mod:`mlxrt.model_pool`
(the server's model router). Model loading (:mod:`mlxrt.loading`) sits above the engine: it may
use the engine's kernel and memory sizes; the engine never imports it, it is handed a loader
(:mod:`mlxrt.engine.loader`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlxrt.engine.config import EngineConfig
    from mlxrt.engine.engine import Engine
    from mlxrt.engine.loader import ModelLoader


def new_engine(host: Any, config: EngineConfig | None = None, *, loader: ModelLoader) -> Engine:
    """A fresh engine (no model loaded yet: :meth:`~mlxrt.engine.engine.Engine.load`) on ``host``
    (the plugin host or the pool's view of it for one model), loading with ``loader``
    (:class:`mlxrt.loading.Loader`). The one way in from outside the engine room: plugins and the
    HTTP edge see the model it serves as a :class:`mlxrt.serving.ServedModel`, never the engine."""
    from mlxrt.engine.engine import Engine

    return Engine(host, config, loader=loader)
