"""The engine's peers seam (:mod:`mlxrt.engine.peers`): an engine that shares its model with
other processes calls them at fixed points of its worker's life. ``serve --distributed``'s
rank 0 composes its engine with this seam (``mlxrt.distributed.group.RankGroup``)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from mlxrt import GenerationRequest
from mlxrt.errors import EngineError
from mlxrt.records import FinishEvent, TokenEvent

pytest.importorskip("mlx.core")

PROMPT = (1, 2, 3, 4, 5)


class RecordingPeers:
    """Peers that record what the engine asks of them and can declare themselves lost."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lost: EngineError | None = None
        self.runs = 0
        #: Set: each run waits for ``gate`` after setting ``entered`` (a worker held mid-request).
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def place(self, loaded):
        self.calls.append(f"place {loaded.engine}")

    def serial_lane(self, lane):
        self.calls.append("serial_lane")
        run = lane.run

        def counted(row, **kwargs):
            self.runs += 1
            if self.gate is not None:
                self.entered.set()
                self.gate.wait(30)
            return run(row, **kwargs)

        lane.run = counted
        return lane

    def refusal(self):
        return self.lost

    def idle(self):
        if self.calls[-1] != "idle":
            self.calls.append("idle")

    def close(self):
        self.calls.append("close")


def _engine(model, peers=None):
    from mlxrt.engine.config import EngineConfig
    from mlxrt.engine.engine import Engine
    from mlxrt.host import make_host
    from mlxrt.loading import Loader
    from mlxrt.loading.resolve import read_model_info, resolve_model

    engine = Engine(make_host(), EngineConfig(batch=1), loader=Loader(), peers=peers)
    engine.load(read_model_info(resolve_model(str(model), allow_download=False)))
    return engine


async def _tokens(engine, request_id: str) -> list[int]:
    handle = engine.generate(GenerationRequest(request_id=request_id, prompt_ids=PROMPT, max_tokens=8))
    await handle.started()
    events = [e async for e in handle]
    assert isinstance(events[-1], FinishEvent)
    return [e.token for e in events if isinstance(e, TokenEvent)]


def test_peers_place_the_model_run_its_requests_and_hear_the_stop(mlxrt_tiny_checkpoint):
    model = mlxrt_tiny_checkpoint("qwen3")
    alone = _engine(model)
    peers = RecordingPeers()
    shared = _engine(model, peers)
    try:
        assert peers.calls == ["place autoregressive", "serial_lane"]  # before the first request
        reference = asyncio.run(_tokens(alone, "a"))
        assert asyncio.run(_tokens(shared, "b")) == reference  # the same tokens through the peers' lane
        assert peers.runs == 1
        deadline = time.monotonic() + 10  # idle comes after the run, once a loop turn (at least every 0.5 s)
        while "idle" not in peers.calls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "idle" in peers.calls
    finally:
        alone.stop()
        shared.stop()
    assert peers.calls[-1] == "close"
    assert shared.stats()["requests_served"] == 1


def test_a_refusal_fails_every_waiting_request_and_the_engine_goes_on(mlxrt_tiny_checkpoint):
    peers = RecordingPeers()
    engine = _engine(mlxrt_tiny_checkpoint("qwen3"), peers)
    try:
        peers.lost = EngineError("the peers are gone")
        with pytest.raises(EngineError, match="the peers are gone"):
            asyncio.run(_tokens(engine, "x"))
        assert peers.runs == 0
        peers.lost = None
        assert len(asyncio.run(_tokens(engine, "y"))) > 0
        assert peers.runs == 1
    finally:
        engine.stop()


def test_fail_all_reaches_the_running_request_and_submissions_the_worker_has_not_taken(mlxrt_tiny_checkpoint):
    # What a lost distributed group does from its watchdog thread while the worker is stuck.
    peers = RecordingPeers()
    peers.gate = threading.Event()
    engine = _engine(mlxrt_tiny_checkpoint("qwen3"), peers)

    async def go():
        running = engine.generate(GenerationRequest(request_id="r", prompt_ids=PROMPT, max_tokens=8))
        await running.started()
        assert await asyncio.to_thread(peers.entered.wait, 30)  # the worker is inside the lane
        queued = engine.generate(GenerationRequest(request_id="q", prompt_ids=PROMPT, max_tokens=8))
        await asyncio.to_thread(engine.fail_all, EngineError("failed from outside"))
        peers.gate.set()
        with pytest.raises(EngineError, match="failed from outside"):
            [e async for e in running]
        with pytest.raises(EngineError, match="failed from outside"):
            await queued.started()

    try:
        asyncio.run(go())
        assert engine.stats()["queue_depth"] == 0
    finally:
        peers.gate.set()
        engine.stop()
