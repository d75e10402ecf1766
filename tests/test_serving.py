"""The served-model seam (:mod:`mlxrt.serving`): plugins see a ``ServedModel``, never the engine."""

from __future__ import annotations

import re
from pathlib import Path

from litestar import Request, post

from mlxrt import hookimpl
from mlxrt.records import ChatInput, RequestOptions
from mlxrt.serving import ServedModel

ROOT = Path(__file__).resolve().parent.parent
ASK = [{"role": "user", "content": "Capital of France?"}]


class Probe:
    """A plugin route that asks the request's model through the seam only."""

    seen: list[ServedModel] = []

    @hookimpl
    def mlxrt_routes(self, host):
        @post("/probe", status_code=200, opt={"json_body": False})
        async def probe(request: Request) -> dict:
            from mlxrt.api.models import model_for

            served = await model_for(request, None)
            Probe.seen.append(served)
            chat = ChatInput(messages=tuple(ASK))
            import anyio

            count = await anyio.to_thread.run_sync(lambda: served.count_tokens(chat, dialect="openai"))
            answer = await served.complete(chat, RequestOptions(sampling={"temperature": 0.0}, max_tokens=8),
                                           dialect="probe")
            return {"count": count, "content": answer.content, "reason": str(answer.reason),
                    "completion_tokens": answer.finish.completion_tokens, "model": served.info.model_id,
                    "ceiling": served.context_ceiling, "vision": served.capabilities.vision}

        return [probe]


def test_plugin_counts_and_completes_through_model_for(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("probe", Probe())])
    got = client.post("/probe")
    assert got.status_code == 200, got.text
    body = got.json()
    served = Probe.seen[-1]
    assert isinstance(served, ServedModel) and not hasattr(served, "engine")
    # complete() is the chat route's generation: the same prompt, the same greedy answer
    chat = client.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 8, "temperature": 0}).json()
    assert body["content"] == chat["choices"][0]["message"]["content"]
    assert body["completion_tokens"] == chat["usage"]["completion_tokens"]
    assert body["count"] == chat["usage"]["prompt_tokens"]
    assert body["model"] == chat["model"] and body["vision"] is False
    assert body["ceiling"] == served.context_ceiling > 0
    # Anthropic's count_tokens is the seam's count (no canonicalizing plugin changes this prompt)
    count = client.post("/v1/messages/count_tokens", json={"model": "m", "messages": ASK})
    assert count.json() == {"input_tokens": body["count"]}


def test_one_served_model_per_engine_and_the_host_knows_none(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("probe", Probe())])
    assert client.post("/probe").status_code == 200 and client.post("/probe").status_code == 200
    pool = client.app.state.models
    assert Probe.seen[-1] is Probe.seen[-2] is pool.primary.model  # facts frozen: one per engine
    host = client.app.state.host  # the registry: no model, no engine, no pool
    assert not any(hasattr(host, name) for name in ("engine", "model", "models"))


def _py(*dirs: str) -> list[Path]:
    return [p for d in dirs for p in (ROOT / d).rglob("*.py") if ".egg-info" not in p.parts]


def test_no_plugin_or_family_reaches_the_engine():
    """Plugins and families see a ServedModel (``model_for``, a hook's ``model``); the engine is the runtime's."""
    reach = re.compile(r"\.engine\b(?!\.)|getattr\([^)]*[\"']engine[\"']")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in _py("plugins", "families")
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if reach.search(re.sub(r"mlxrt\.engine\.[\w.]+", "", line))]
    assert offenders == []


def test_only_the_engine_room_imports_engine():
    """Nothing outside runtime/engine imports ``Engine`` (the CLI starts one through
    ``mlxrt.engine.new_engine``); runtime/distributed still subclasses it (issue 33, item 4)."""
    pattern = re.compile(r"from mlxrt\.engine\.engine import [^\n]*\bEngine\b")
    offenders = [str(p.relative_to(ROOT)) for p in _py("runtime", "api", "plugins", "families")
                 if pattern.search(p.read_text())
                 and not p.is_relative_to(ROOT / "runtime" / "engine")
                 and not p.is_relative_to(ROOT / "runtime" / "distributed")]
    assert offenders == []
