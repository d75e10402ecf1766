"""The engine seam: cancellation on disconnect, errors that do not kill it, the event stream."""

from __future__ import annotations

import time

import httpx
import pytest

from mlxrt import GenerationRequest, SamplingParams, hookimpl


def test_disconnect_cancels_the_generation(mlxrt_tiny_checkpoint, server_process):
    # A real server: the in-process test client reads streamed bodies to the end.
    server = server_process([str(mlxrt_tiny_checkpoint("qwen3"))])
    # Greedy, so the run is the same every time (this prompt never samples EOS in 30000 tokens).
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 30000, "stream": True,
            "temperature": 0}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            # Wait for generated text, so the request is surely running on the engine (the role
            # chunk is sent before generation starts).
            for line in resp.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    break
        deadline = time.monotonic() + 30
        stats = http.get("/stats").json()
        while stats["engine"]["requests_cancelled"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
            stats = http.get("/stats").json()
        assert stats["engine"]["requests_cancelled"] == 1
        ok = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                      "max_tokens": 3})
        assert ok.status_code == 200


def test_a_failing_sampler_fails_one_request_and_the_engine_keeps_serving(mlxrt_tiny_checkpoint, mlxrt_serve):
    class Flaky:
        @hookimpl
        def mlxrt_sampler(self, request, info):
            if request.sampling.temperature == 0.5:
                raise RuntimeError("boom")
            return None

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("flaky", Flaky())])
    msg = [{"role": "user", "content": "x"}]
    bad = client.post("/v1/chat/completions", json={"messages": msg, "temperature": 0.5, "max_tokens": 3})
    assert bad.status_code == 500
    assert "flaky" in bad.json()["error"]["message"] and bad.json()["error"]["type"] == "plugin_error"
    # The sampler chain is built at admission, before the stream starts: the status says so.
    stream = client.post("/v1/chat/completions", json={"messages": msg, "temperature": 0.5, "stream": True})
    assert stream.status_code == 500 and "flaky" in stream.json()["error"]["message"]
    assert client.post("/v1/chat/completions", json={"messages": msg, "max_tokens": 3}).status_code == 200


@pytest.mark.anyio
async def test_generate_yields_tokens_then_one_finish(mlxrt_client):
    engine = mlxrt_client.app.state.models.primary.engine
    request = GenerationRequest(request_id="t1", prompt_ids=(1, 2, 3), max_tokens=5,
                                sampling=SamplingParams(temperature=0.0))
    events = [e async for e in engine.generate(request)]
    assert [type(e).__name__ for e in events][-1] == "FinishEvent"
    assert sum(type(e).__name__ == "TokenEvent" for e in events) <= 5
    assert events[-1].completion_tokens <= 5 and events[-1].prompt_tokens == 3


@pytest.mark.anyio
async def test_call_runs_on_the_worker_and_raises_back(mlxrt_client):
    import threading

    engine = mlxrt_client.app.state.models.primary.engine
    name = await engine.call(lambda loaded: threading.current_thread().name)
    assert name == "mlxrt-engine"

    def boom(loaded):
        raise ValueError("bad forward")

    with pytest.raises(ValueError, match="bad forward"):
        await engine.call(boom)


def test_an_invalid_request_from_a_hook_is_a_400(mlxrt_tiny_checkpoint, mlxrt_serve):
    from mlxrt.errors import InvalidRequest

    class Picky:
        @hookimpl
        def mlxrt_sampler(self, request, info, host):
            if request.sampling.temperature == 0.5:
                raise InvalidRequest("temperature 0.5 is not allowed by picky", param="temperature")
            return None

    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("picky", Picky())])
    msg = [{"role": "user", "content": "x"}]
    bad = client.post("/v1/chat/completions", json={"messages": msg, "temperature": 0.5, "max_tokens": 3})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "temperature 0.5 is not allowed by picky"
    assert client.post("/v1/chat/completions", json={"messages": msg, "max_tokens": 3}).status_code == 200


def test_a_process_that_forgets_to_stop_its_engine_still_exits_cleanly(mlxrt_tiny_checkpoint):
    # A worker thread alive at interpreter exit makes MLX abort the process (status 134);
    # the engine stops itself at exit when its owner did not.
    import subprocess
    import sys

    script = (
        "import asyncio\n"
        "from mlxrt.cli import build_server\nfrom mlxrt.host import make_host\n"
        "from mlxrt import GenerationRequest\n"
        f"app = build_server(make_host(), {str(mlxrt_tiny_checkpoint('qwen3'))!r}, {{}})\n"
        "async def go():\n"
        "    g = app.state.models.primary.model.generate(GenerationRequest(request_id='x', prompt_ids=(1, 2, 3), max_tokens=50))\n"
        "    async for _ in g:\n"
        "        break\n"
        "    await g.aclose()\n"
        "asyncio.run(go())\nprint('done')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "done" in out.stdout
