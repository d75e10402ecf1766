"""Several models served by one process (issue 23): a request's ``model`` picks the engine.

Three tiny checkpoints of different families (llama served, qwen3 and gemma4_text by path),
through the official openai and anthropic clients: switching, LRU eviction, idle unload, one
load for concurrent first requests, unknown models (404 per dialect), aliases, the memory
budget, strict mode, and outputs equal to single-model servers'.
"""

from __future__ import annotations

import threading
import time

import anthropic
import openai
import pytest
from support import MLXRT_BIN, anthropic_client, openai_client

from mlxrt import hookimpl

MULTI = {"model_fallback": False, "strict_model": False}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """Folders named for their family: the model id a server answers with."""
    from mlxrt.testing import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("families")
    return {name: write_tiny_checkpoint(root / name, name) for name in ("llama", "qwen3", "gemma4_text")}


def chat(client, model, **kw):
    return openai_client(client).chat.completions.create(model=model, messages=HI, max_tokens=6, temperature=0,
                                                         **kw)


def states(client) -> dict[str, str]:
    return {m["id"]: m["state"] for m in client.get("/stats").json()["models"]["models"]}


def loads(client) -> dict[str, int]:
    return {m["id"]: m["loads"] for m in client.get("/stats").json()["models"]["models"]}


def test_each_request_is_answered_by_the_model_it_names_bit_for_bit(three, mlxrt_serve):
    """Switching between three families, by path, id and default; each answer equals the one
    a server of that model alone gives (greedy, same prompt)."""
    alone = {}
    for name, path in three.items():
        single = mlxrt_serve(path)
        alone[name] = (chat(single, "default").choices[0].message.content,
                       openai_client(single).completions.create(model="default", prompt="a b", max_tokens=5,
                                                                temperature=0).choices[0].text)
    multi = mlxrt_serve(three["llama"], options={**MULTI, "max_models": 3})
    for _round in range(2):  # back and forth: resident engines keep answering the same
        for name, path in three.items():
            reply = chat(multi, str(path))
            assert reply.model == name
            assert reply.choices[0].message.content == alone[name][0]
            text = openai_client(multi).completions.create(model=name, prompt="a b", max_tokens=5, temperature=0)
            assert (text.model, text.choices[0].text) == (name, alone[name][1])
    assert chat(multi, "default").model == "llama" and chat(multi, "").model == "llama"
    message = anthropic_client(multi).messages.create(model="qwen3", messages=HI, max_tokens=6)
    assert message.model == "qwen3" and message.content[0].text == alone["qwen3"][0]
    assert states(multi) == {"llama": "ready", "qwen3": "ready", "gemma4_text": "ready"}
    assert loads(multi) == {"llama": 1, "qwen3": 1, "gemma4_text": 1}
    rows = {m["id"]: m for m in multi.get("/v1/models").json()["data"]}
    assert rows["llama"]["loaded"] and rows["qwen3"]["loaded"] and rows["gemma4_text"]["loaded"]
    metrics = multi.get("/metrics").text  # 2 rounds of chat + text, 1 message
    assert 'mlxrt_model_loaded{model="gemma4_text"} 1' in metrics
    assert 'mlxrt_model_requests_served_total{model="qwen3"} 5' in metrics


def test_structured_outputs_follow_each_models_own_tokenizer(three, mlxrt_serve):
    """Grammars are compiled per model (llama's and qwen3's generated vocabularies differ)."""
    client = mlxrt_serve(three["llama"], options={**MULTI, "max_models": 2})
    choice = {"type": "choice", "choices": ["yes", "no"]}
    for model in ("qwen3", "llama", "qwen3", "llama"):
        path = str(three[model])
        reply = chat(client, path, response_format=choice)
        assert reply.model == model and reply.choices[0].message.content in ("yes", "no")


def test_the_least_recently_used_idle_model_is_evicted(three, mlxrt_serve):
    client = mlxrt_serve(three["llama"], options={**MULTI, "max_models": 2})
    chat(client, str(three["qwen3"]))
    chat(client, "llama")  # llama is now more recent than qwen3
    chat(client, str(three["gemma4_text"]))
    assert states(client) == {"llama": "ready", "qwen3": "unloaded", "gemma4_text": "ready"}
    assert chat(client, "qwen3").model == "qwen3"  # known by id once seen; loaded again
    assert states(client) == {"llama": "unloaded", "qwen3": "ready", "gemma4_text": "ready"}
    assert loads(client) == {"llama": 1, "qwen3": 2, "gemma4_text": 1}
    listed = client.get("/v1/models").json()["data"]
    assert listed[0]["id"] == "llama"  # the served model stays first while swapped out
    rows = {m["id"]: m["loaded"] for m in listed}
    assert rows["llama"] is False and rows["qwen3"] is True
    # the default is swapped back in, as mlx_lm.server swaps
    assert chat(client, "default").model == "llama"


def test_a_model_nobody_uses_is_unloaded_after_idle_unload(three, mlxrt_serve):
    client = mlxrt_serve(three["llama"], options={**MULTI, "max_models": 2, "idle_unload": 0.3})
    chat(client, str(three["qwen3"]))
    assert states(client)["qwen3"] == "ready"
    deadline = time.monotonic() + 10
    while states(client) != {"llama": "unloaded", "qwen3": "unloaded"} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert states(client) == {"llama": "unloaded", "qwen3": "unloaded"}
    assert client.get("/health").status_code == 200
    assert chat(client, "qwen3").model == "qwen3"  # and comes back on demand


def test_idle_unload_counts_from_start_for_a_model_nobody_asked_for(three, mlxrt_serve):
    client = mlxrt_serve(three["llama"], options={**MULTI, "idle_unload": 0.3})
    deadline = time.monotonic() + 10
    while states(client) != {"llama": "unloaded"} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert states(client) == {"llama": "unloaded"}
    assert chat(client, "default").model == "llama"


class SlowLoad:
    """Loads take 0.5 s (then mlx-lm loads as usual), so first requests overlap the load."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    @hookimpl
    def mlxrt_load_model(self, info, host):
        self.loaded.append(info.model_id)
        time.sleep(0.5)


def test_concurrent_first_requests_for_a_cold_model_wait_for_one_load(three, mlxrt_serve):
    slow = SlowLoad()
    client = mlxrt_serve(three["llama"], plugins=[("slow-load", slow)], options={**MULTI, "max_models": 2})
    results: list[str] = []

    def ask() -> None:
        results.append(chat(client, str(three["qwen3"])).model)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    row = next(m for m in client.get("/stats").json()["models"]["models"] if m["id"] == "qwen3")
    assert row["state"] == "loading" and row["loading_for_seconds"] >= 0  # progress is visible
    for t in threads:
        t.join(30)
    assert results == ["qwen3"] * 4
    assert slow.loaded == ["llama", "qwen3"] and loads(client)["qwen3"] == 1


def test_on_a_strict_server_an_unknown_model_is_404_in_each_dialect_and_the_server_keeps_serving(three, mlxrt_serve):
    client = mlxrt_serve(three["llama"], options={**MULTI, "strict_model": True})
    with pytest.raises(openai.NotFoundError) as caught:
        chat(client, "nonexistent/x")
    assert caught.value.body == {"message": "The model `nonexistent/x` does not exist or you do not have access "
                                            "to it.", "type": "invalid_request_error", "param": None,
                                 "code": "model_not_found"}
    with pytest.raises(openai.NotFoundError):
        openai_client(client).completions.create(model="gpt-3.5-turbo-instruct", prompt="a", max_tokens=2)
    with pytest.raises(anthropic.NotFoundError) as caught:
        anthropic_client(client).messages.create(model="claude-x", messages=HI, max_tokens=4)
    assert caught.value.body == {"type": "error", "error": {
        "type": "not_found_error", "message": "The model `claude-x` does not exist or you do not have access to it."}}
    response = client.post("/v1/responses", json={"model": "nope", "input": "hi"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert chat(client, "llama").model == "llama"
    assert set(states(client)) == {"llama"}  # nothing was loaded or remembered for them


def test_strict_mode_never_loads_a_model_not_named_at_start(three, mlxrt_serve):
    client = mlxrt_serve(three["llama"], options={**MULTI, "strict_model": True, "max_models": 2,
                                                "preload": [str(three["gemma4_text"])]})
    assert states(client) == {"llama": "ready", "gemma4_text": "ready"}  # preloaded at start
    with pytest.raises(openai.NotFoundError):
        chat(client, str(three["qwen3"]))  # a real local model, but not named at start
    assert "qwen3" not in states(client)
    assert chat(client, "gemma4_text").model == "gemma4_text"
    assert chat(client, str(three["gemma4_text"])).model == "gemma4_text"  # as the operator spelled it


def test_a_server_bound_beyond_loopback_is_strict_by_default(three, mlxrt_serve):
    exposed = mlxrt_serve(three["llama"], options={"host": "0.0.0.0", "model_fallback": False})
    assert exposed.get("/stats").json()["models"]["strict"] is True
    with pytest.raises(openai.NotFoundError):
        chat(exposed, str(three["qwen3"]))
    local = mlxrt_serve(three["llama"], options={"host": "127.0.0.1", "model_fallback": False})
    assert local.get("/stats").json()["models"]["strict"] is False
    # a request must not make the server run any folder's tokenizer code
    trusting = mlxrt_serve(three["llama"], options={"host": "127.0.0.1", "model_fallback": False,
                                                  "trust_remote_code": True})
    assert trusting.get("/stats").json()["models"]["strict"] is True


def test_a_model_that_fails_to_load_is_503_and_the_server_keeps_serving(three, mlxrt_serve, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')  # no weights, no tokenizer
    client = mlxrt_serve(three["llama"], options={**MULTI, "max_models": 2})
    with pytest.raises(openai.InternalServerError) as caught:
        chat(client, str(broken))
    assert caught.value.status_code == 503 and caught.value.body["code"] == "model_load_failed"
    assert caught.value.body["message"].startswith("cannot load model 'broken': ")
    assert caught.value.body["message"].endswith("; resident: llama (640.26 KB weights)")
    row = next(m for m in client.get("/stats").json()["models"]["models"] if m["id"] == "broken")
    assert row["state"] == "unloaded" and row["last_error"] == caught.value.body["message"]
    assert chat(client, "llama").model == "llama"


def test_aliases_map_client_names_to_local_models(three, mlxrt_serve):
    client = mlxrt_serve(three["llama"], options={**MULTI, "strict_model": True, "max_models": 2,
                                                "model_alias": [f"claude-haiku-4-5={three['qwen3']}"]})
    message = anthropic_client(client).messages.create(model="claude-haiku-4-5", messages=HI, max_tokens=4)
    assert message.model == "qwen3"
    rows = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert rows["claude-haiku-4-5"]["alias_of"] == "qwen3" and rows["claude-haiku-4-5"]["loaded"] is True
    assert client.post("/v1/messages/count_tokens", json={"model": "claude-haiku-4-5", "messages": HI}).status_code \
        == 200


def test_a_model_that_cannot_fit_the_memory_budget_is_refused_with_the_numbers(three, mlxrt_serve):
    # 2.5 MB shared by 2 models: llama (0.64 MB) fits its 1.25 MB share, gemma4_text (1.55 MB) cannot.
    client = mlxrt_serve(three["llama"], options={**MULTI, "max_models": 2, "memory_budget": 0.0025})
    with pytest.raises(openai.InternalServerError) as caught:
        chat(client, str(three["gemma4_text"]))
    error = caught.value.body
    assert caught.value.status_code == 503 and error["code"] == "model_over_budget"
    assert error["message"] == (
        "model 'gemma4_text' cannot fit: its weights need 1.55 MB but each of the --max-models 2 resident models "
        "gets 1.25 MB of the 2.50 MB --memory-budget (less a 10% margin); resident: llama (640.26 KB weights)")
    assert states(client) == {"llama": "ready", "gemma4_text": "unloaded"}  # nothing evicted for it
    assert chat(client, "llama").model == "llama"
    assert client.get("/stats").json()["engine"]["admission"]["budget_bytes"] == 1_250_000


def test_a_malformed_alias_is_a_usage_error(three):
    import subprocess

    out = subprocess.run([MLXRT_BIN, "serve", str(three["llama"]), "--model-alias", "no-equals-sign"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "'no-equals-sign' is not NAME=MODEL" in out.stderr
    # --distributed with several models: tests/test_distributed.py::test_unsupported_combinations_…


def test_model_fallback_on_a_strict_server_answers_unknown_names_with_the_served_model(three, mlxrt_serve):
    client = mlxrt_serve(three["llama"], options={"model_fallback": True, "strict_model": True})
    assert chat(client, "gpt-4o").model == "llama"
    assert chat(client, str(three["qwen3"])).model == "llama"  # strict: nothing is loaded on demand
    assert set(states(client)) == {"llama"}
    assert client.get("/stats").json()["models"]["fallback"] is True


class Slow:
    """Claims ``slow``: such a request samples token 5 every 50 ms (never EOS) until max_tokens;
    and ``slow_prepare``: its preparation takes a second."""

    @hookimpl
    def mlxrt_request_fields(self, dialect):
        return {"slow": bool, "slow_prepare": bool}

    @hookimpl
    def mlxrt_prepare_request(self, request, host):
        if request.extra.get("slow_prepare"):
            time.sleep(1.0)  # the model is chosen, nothing is queued on its engine yet

    @hookimpl
    def mlxrt_sampler(self, request, info):
        if not request.extra.get("slow"):
            return None
        import mlx.core as mx

        def sample(logprobs):
            time.sleep(0.05)
            return mx.array([5])

        return sample


def test_a_stream_holds_its_model_until_it_ends(three):
    """Over a real socket: with --max-models 1, a request for another model waits while a
    stream of the resident one is still being sent, then swaps it."""
    import uvicorn
    from support import free_port

    from mlxrt.cli import build_server
    from mlxrt.host import make_host

    host = make_host(extra=[("slow", Slow())])
    app = build_server(host, str(three["llama"]), {"host": "127.0.0.1", "port": 0, **MULTI})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        stream = client.chat.completions.create(model="llama", messages=HI, max_tokens=30, stream=True,
                                                extra_body={"slow": True})
        next(iter(stream))  # the stream is open: llama is held
        other: list[str] = []
        waiting = threading.Thread(target=lambda: other.append(
            client.chat.completions.create(model=str(three["qwen3"]), messages=HI, max_tokens=2).model))
        waiting.start()
        time.sleep(0.5)
        models = {m["id"]: m for m in httpx_get(port, "/stats")["models"]["models"]}
        assert models["llama"]["state"] == "ready" and models["llama"]["in_use"] == 1
        assert models["qwen3"]["state"] == "loading" and not other
        assert len(list(stream)) >= 20  # the stream finished whole, on the engine it started on
        waiting.join(30)
        assert other == ["qwen3"]
        assert {m["id"]: m["state"] for m in httpx_get(port, "/stats")["models"]["models"]} == {
            "llama": "unloaded", "qwen3": "ready"}
    finally:
        server.should_exit = True
        thread.join(15)
        app.state.models.stop()


def httpx_get(port: int, path: str) -> dict:
    import httpx

    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10).json()


def test_a_request_holds_its_model_before_it_reaches_the_engine(three, mlxrt_serve):
    """Between choosing the model and queueing on its engine (templating, grammar compiling) the
    engine looks idle; the request's lease keeps another request from evicting it then."""
    client = mlxrt_serve(three["llama"], plugins=[("slow", Slow())], options=MULTI)
    first: list[str] = []
    held = threading.Thread(target=lambda: first.append(
        chat(client, "llama", extra_body={"slow_prepare": True}).model))
    held.start()
    time.sleep(0.3)
    assert chat(client, str(three["qwen3"])).model == "qwen3"  # waits for llama's request
    held.join(30)
    assert first == ["llama"]
    assert loads(client) == {"llama": 1, "qwen3": 1}


def test_local_hugging_face_models_by_repo_id_or_a_unique_part_of_one(three, mlxrt_serve, tmp_path, monkeypatch):
    from test_library import install

    hub = tmp_path / "hub"
    install(hub, "acme/tiny-qwen3", three["qwen3"], "a" * 40)
    install(hub, "acme/tiny-qwen3-instruct", three["qwen3"], "b" * 40)
    install(hub, "other/smol-gemma", three["gemma4_text"], "c" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    client = mlxrt_serve(three["llama"], options={**MULTI, "max_models": 3})
    assert chat(client, "smol-gemma").model == "other/smol-gemma"
    assert chat(client, "acme/tiny-qwen3").model == "acme/tiny-qwen3"  # an exact id wins over longer ones
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, "tiny-qwen3")
    assert caught.value.body["code"] == "ambiguous_model" and "acme/tiny-qwen3-instruct" in caught.value.body["message"]
    rows = {m["id"]: m["loaded"] for m in client.get("/v1/models").json()["data"]}
    assert rows["other/smol-gemma"] is True and rows["acme/tiny-qwen3-instruct"] is False


def _os_threads() -> int:
    """Threads of this process as the OS counts them (MLX's native ones included)."""
    import os

    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_swapping_models_gives_back_the_threads_of_each_load(three, mlxrt_serve):
    """--max-models 1 and two aliases: every request loads a model and unloads the other; the
    process keeps the threads it had after the first swap (each load leaked one before)."""
    client = mlxrt_serve(three["llama"], options={**MULTI, "max_models": 1,
                                                "model_alias": [f"a={three['llama']}", f"b={three['qwen3']}"]})
    chat(client, "b")
    chat(client, "a")  # warm: the anyio threads of a load and the pooled engine worker exist
    before = _os_threads()
    for name in "ba" * 4:
        chat(client, name)
    assert loads(client) == {"llama": 6, "qwen3": 5}
    assert _os_threads() - before <= 1, (before, _os_threads())
