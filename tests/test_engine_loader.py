"""The engine's loader seam (:mod:`mlxrt.engine.loader`): the engine loads the model and its
``--draft-model`` through the loader it is handed, on its worker thread, and never imports
model loading (tests/test_layering.py holds the import direction)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mlxrt import GenerationRequest
from mlxrt.errors import ModelLoadError
from mlxrt.records import FinishEvent, TokenEvent

pytest.importorskip("mlx.core")


class RecordingLoader:
    """mlxrt's own loader, recording each call and the thread it ran on."""

    def __init__(self, fail: bool = False) -> None:
        from mlxrt.loading import Loader

        self.inner = Loader()
        self.fail = fail
        self.calls: list[tuple[str, str]] = []

    def load(self, info, host, model=None):
        self.calls.append(("load", threading.current_thread().name))
        if self.fail:
            raise ModelLoadError(f"refused {info.model_id}")
        return self.inner.load(info, host, model)

    def load_draft(self, model, host):
        self.calls.append(("load_draft", threading.current_thread().name))
        return self.inner.load_draft(model, host)


def _engine(model, loader, **config):
    from mlxrt.engine import new_engine
    from mlxrt.engine.config import EngineConfig
    from mlxrt.host import make_host
    from mlxrt.loading.resolve import read_model_info, resolve_model

    engine = new_engine(make_host(), EngineConfig(batch=1, **config), loader=loader)
    engine.load(read_model_info(resolve_model(str(model), allow_download=False)))
    return engine


def test_the_model_and_its_draft_load_through_the_loader_on_the_worker(mlxrt_tiny_checkpoint):
    model = mlxrt_tiny_checkpoint("qwen3")
    loader = RecordingLoader()
    engine = _engine(model, loader, draft_model=str(model))  # the model drafts for itself
    try:
        assert loader.calls == [("load", "mlxrt-engine"), ("load_draft", "mlxrt-engine")]

        async def tokens():
            handle = engine.generate(GenerationRequest(request_id="a", prompt_ids=(1, 2, 3), max_tokens=6))
            await handle.started()
            return [e async for e in handle]

        events = asyncio.run(tokens())
        assert isinstance(events[-1], FinishEvent) and any(isinstance(e, TokenEvent) for e in events)
        assert engine.stats()["speculative"] is not None
    finally:
        engine.stop()


def test_a_load_the_loader_refuses_is_raised_by_load_and_nothing_serves(mlxrt_tiny_checkpoint):
    loader = RecordingLoader(fail=True)
    with pytest.raises(ModelLoadError, match="refused"):
        _engine(mlxrt_tiny_checkpoint("qwen3"), loader)
    assert loader.calls == [("load", "mlxrt-engine")]
