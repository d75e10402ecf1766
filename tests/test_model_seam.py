"""The host is the plugin registry; the model is an argument (issue 46, item 1).

Routes get their model from :func:`mlxrt.api.models.model_for` (which asks the model pool),
every hook about one model is given it as ``model`` (a plugin that does not name the argument
keeps working), and ``/health``, ``/v1``, ``/stats`` and ``/metrics`` describe the model the
pool names, with several models resident.
"""

from __future__ import annotations

import time

from litestar import Request, post
from support import openai_client

from mlxrt import hookimpl

MULTI = {"model_fallback": False, "strict_model": False}
HI = [{"role": "user", "content": "hi"}]


class Which:
    """A plugin route that answers with the id of the model ``model_for`` gives for the body's ``model``."""

    @hookimpl
    def mlxrt_routes(self, host):
        @post("/which", status_code=200)
        async def which(request: Request) -> dict:
            from mlxrt.api.models import model_for

            body = await request.json()
            served = await model_for(request, body.get("model"))
            return {"id": served.info.model_id, "same": served is request.app.state.models.slot_of(served).model}

        return [which]


def test_model_for_names_the_model_and_an_unknown_name_is_the_404_it_was(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("llama"), plugins=[("which", Which())],
                         options={**MULTI, "strict_model": True})
    assert client.post("/which", json={"model": None}).json() == {"id": "llama-0-gen", "same": True}
    assert client.post("/which", json={"model": 7}).json()["id"] == "llama-0-gen"  # not a string: the served one
    assert client.post("/which", json={"model": "default"}).json()["id"] == "llama-0-gen"
    missing = client.post("/which", json={"model": "nope/x"})
    assert missing.status_code == 404
    assert "The model `nope/x` does not exist or you do not have access to it." in missing.text
    assert "model_not_found" in missing.text
    assert client.get("/health").status_code == 200  # still serving


class Seen:
    """Every per-model hook, recording the id of the ``model`` it is given (and whether it is
    the pool's own object for that model)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.models: list[object] = []

    def _saw(self, hook: str, model) -> None:
        self.calls.append((hook, model.info.model_id))
        self.models.append(model)

    @hookimpl
    def mlxrt_chat_template_kwargs(self, info, request, model):
        assert info is model.info
        self._saw("chat_template_kwargs", model)

    @hookimpl
    def mlxrt_prompt_canonicalize(self, request, dialect, model):
        self._saw("prompt_canonicalize", model)

    @hookimpl
    def mlxrt_prepare_request(self, request, model):
        self._saw("prepare_request", model)

    @hookimpl
    def mlxrt_logits_processors(self, request, model):
        self._saw("logits_processors", model)
        return []

    @hookimpl
    def mlxrt_sampler(self, request, model):
        self._saw("sampler", model)

    @hookimpl
    def mlxrt_turn_finished(self, turn, model):
        assert turn.model == model.info.model_id
        self._saw("turn_finished", model)


class OldStyle:
    """A plugin written before hooks were given ``model``: it names only the old arguments."""

    def __init__(self) -> None:
        self.prepared: list[str] = []

    @hookimpl
    def mlxrt_prepare_request(self, request, info, host):
        self.prepared.append(info.model_id)


def test_each_hook_is_given_the_model_that_serves_the_request(mlxrt_tiny_checkpoint, mlxrt_serve):
    seen, old = Seen(), OldStyle()
    llama, qwen3 = mlxrt_tiny_checkpoint("llama"), mlxrt_tiny_checkpoint("qwen3")
    client = mlxrt_serve(llama, plugins=[("seen", seen), ("old", old)], options={**MULTI, "max_models": 2})
    hooks = ["chat_template_kwargs", "prompt_canonicalize", "prepare_request", "sampler", "logits_processors",
             "turn_finished"]
    pool = client.app.state.models
    for name, want in ((str(qwen3), "qwen3-0-gen"), ("default", "llama-0-gen")):
        seen.calls.clear(), seen.models.clear()
        reply = openai_client(client).chat.completions.create(model=name, messages=HI, max_tokens=3, temperature=0)
        assert reply.model == want
        deadline = time.monotonic() + 10  # turn observers run on their own thread
        while len(seen.calls) < len(hooks) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(seen.calls) == sorted((hook, want) for hook in hooks)
        served = next(s.model for s in pool.resident() if s.model_id == want)
        assert all(model is served for model in seen.models)  # the pool's one object for that model
    assert old.prepared == ["qwen3-0-gen", "llama-0-gen"]  # the old signature still runs


def test_status_routes_describe_the_served_model_with_two_in_the_pool(mlxrt_tiny_checkpoint, mlxrt_serve):
    llama, qwen3 = mlxrt_tiny_checkpoint("llama"), mlxrt_tiny_checkpoint("qwen3")
    client = mlxrt_serve(llama, options={**MULTI, "max_models": 2})
    assert openai_client(client).chat.completions.create(model=str(qwen3), messages=HI, max_tokens=2).model \
        == "qwen3-0-gen"
    assert client.get("/health").content == b'{"status": "ok"}'
    assert client.get("/v1").json()["model"] == "llama-0-gen"  # the served model, resident
    stats = client.get("/stats").json()
    assert stats["model"]["id"] == "llama-0-gen" and stats["model"]["family"]
    assert stats["engine"]["requests_served"] == 0  # the served model's engine: qwen3 answered
    assert {m["id"]: m["state"] for m in stats["models"]["models"]} == {"llama-0-gen": "ready",
                                                                         "qwen3-0-gen": "ready"}
    metrics = client.get("/metrics").text
    assert "\nmlxrt_requests_served_total 0" in metrics
    assert 'mlxrt_model_requests_served_total{model="qwen3-0-gen"} 1' in metrics
    assert 'mlxrt_model_loaded{model="llama-0-gen"} 1' in metrics


def test_with_the_served_model_evicted_the_status_routes_describe_the_one_resident(mlxrt_tiny_checkpoint,
                                                                                  mlxrt_serve):
    llama, qwen3 = mlxrt_tiny_checkpoint("llama"), mlxrt_tiny_checkpoint("qwen3")
    client = mlxrt_serve(llama, options={**MULTI, "max_models": 1})
    openai_client(client).chat.completions.create(model=str(qwen3), messages=HI, max_tokens=2)  # evicts llama
    assert client.get("/health").status_code == 200
    assert client.get("/v1").json()["model"] == "qwen3-0-gen"
    stats = client.get("/stats").json()
    assert stats["model"]["id"] == "qwen3-0-gen" and stats["engine"]["requests_served"] == 1
    assert {m["id"]: m["state"] for m in stats["models"]["models"]} == {"llama-0-gen": "unloaded",
                                                                         "qwen3-0-gen": "ready"}
    metrics = client.get("/metrics").text
    assert "\nmlxrt_requests_served_total 1" in metrics and 'mlxrt_model_loaded{model="llama-0-gen"} 0' in metrics
