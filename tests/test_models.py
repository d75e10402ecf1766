"""GET /v1/models and /v1/models/{id}: the served model, then the local Hugging Face cache."""

from __future__ import annotations

import json

import openai
import pytest
from support import openai_client

from mlxrt import hookimpl

SERVED = "qwen3-0-gen"


def fake_repo(hub, repo_id, *, files=("config.json", "model.safetensors"), kind="models", ref="main",
              commit="a" * 40, config=None):
    """One repo in the HF cache layout: ``models--org--name/{refs/<ref>, snapshots/<commit>/...}``."""
    repo = hub / f"{kind}--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    for name in files:
        body = json.dumps(config or {"model_type": "qwen3", "max_position_embeddings": 32768}) \
            if name == "config.json" else "x"
        (snap / name).write_text(body)
    return repo


@pytest.fixture
def hub(tmp_path, monkeypatch):
    path = tmp_path / "hub"
    path.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(path))
    return path


def ids(client) -> list[str]:
    return [m.id for m in openai_client(client).models.list().data]


def test_served_model_first_then_each_servable_cached_repo(hub, mlxrt_client):
    fake_repo(hub, "Qwen/Qwen3-Embedding-0.6B")
    fake_repo(hub, "mlx-community/SmolLM2-135M-Instruct", config={"model_type": "llama"})
    fake_repo(hub, "org/sharded", files=("config.json", "model-00001-of-00002.safetensors",
                                          "model.safetensors.index.json"))
    # one repo, two snapshots: one row, for refs/main
    fake_repo(hub, "org/two-revisions", commit="b" * 40, ref="main")
    fake_repo(hub, "org/two-revisions", commit="c" * 40, ref="v1")
    fake_repo(hub, "org/no-weights", files=("config.json", "tokenizer.json"))
    fake_repo(hub, "org/no-config", files=("model.safetensors",))
    fake_repo(hub, "org/gguf-only", files=("model.gguf",))
    fake_repo(hub, "org/no-model-type", config={"architectures": ["X"]})
    fake_repo(hub, "org/pr-only", ref="refs/pr/1")
    fake_repo(hub, "org/data", kind="datasets")
    fake_repo(hub, SERVED)  # the served id is not listed twice
    (hub / "models--org--broken").mkdir()  # no snapshots: corrupted, skipped
    (hub / ".locks").mkdir()
    assert ids(mlxrt_client) == [SERVED, "Qwen/Qwen3-Embedding-0.6B", "mlx-community/SmolLM2-135M-Instruct",
                                 "org/sharded", "org/two-revisions"]
    body = mlxrt_client.get("/v1/models").json()
    assert body["object"] == "list"
    served, cached = body["data"][0], body["data"][1]
    assert served["context_window"] == 40960 and served["reasoning"] is True and served["vision"] is False
    assert served["owned_by"] == "mlxrt"
    assert cached["object"] == "model" and cached["owned_by"] == "Qwen" and cached["context_window"] == 32768
    assert isinstance(cached["created"], int) and "reasoning" not in cached


@pytest.mark.parametrize("state", ["missing", "file"])
def test_a_missing_or_broken_cache_lists_the_served_model(tmp_path, monkeypatch, mlxrt_client, state):
    cache = tmp_path / "nowhere"
    if state == "file":
        cache.write_text("not a folder")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert ids(mlxrt_client) == [SERVED]


def test_listing_never_downloads(hub, mlxrt_client, monkeypatch):
    import huggingface_hub

    def refuse(*_a, **_k):
        raise AssertionError("listing must not download")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    fake_repo(hub, "org/model")
    assert ids(mlxrt_client) == [SERVED, "org/model"]


def test_retrieve_one_model_object(hub, mlxrt_client):
    fake_repo(hub, "Qwen/Qwen3-0.6B")
    client = openai_client(mlxrt_client)
    served = client.models.retrieve(SERVED)
    assert served.id == SERVED and served.object == "model"
    assert served.model_extra["context_window"] == 40960
    cached = client.models.retrieve("Qwen/Qwen3-0.6B")  # a repo id: the slash stays in the path
    assert cached.id == "Qwen/Qwen3-0.6B" and cached.owned_by == "Qwen"
    assert mlxrt_client.get("/models").json()["data"][0]["id"] == SERVED  # the alias


def test_unknown_model_is_a_404_model_not_found(hub, mlxrt_client):
    client = openai_client(mlxrt_client)
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("org/absent")
    assert err.value.status_code == 404
    assert err.value.body["code"] == "model_not_found" and err.value.body["type"] == "not_found_error"
    assert "'org/absent' not found" in err.value.body["message"]
    assert ids(mlxrt_client)[0] == SERVED  # still serving


class DeclaresStructuredOutputs:
    """A third party that says it enforces output constraints (``mlxrt_capabilities``)."""

    @hookimpl
    def mlxrt_capabilities(self):
        return ["structured_outputs"]


def test_a_capabilities_hook_answer_is_what_models_and_status_show(hub, mlxrt_tiny_checkpoint, mlxrt_serve):
    # The built-in grammar plugin declares structured_outputs: disable it, so the flag is the hook's.
    without = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), disable=("structured",))
    declared = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), disable=("structured",),
                         plugins=[("declares", DeclaresStructuredOutputs())])
    for client, on in ((without, False), (declared, True)):
        served = openai_client(client).models.list().data[0].model_extra
        assert served["structured_outputs"] is on
        assert served["vision"] is False and served["embeddings"] is False  # read from the model
        status = client.get("/pages/status").json()["model"]["capabilities"]
        assert status["structured_outputs"] is on and status["embeddings"] is False


def test_clients_read_the_context_and_output_limits_where_they_look(hub, mlxrt_tiny_checkpoint, mlxrt_serve):
    """The served row carries Anthropic's Models API fields (what Claude Code's model-capabilities
    cache reads through the anthropic SDK: ``max_input_tokens``, ``max_tokens``) beside OpenAI's;
    the limits are the context a request may fill (window capped by the memory budget) and
    ``--max-tokens`` within it (docs/dialects.md)."""
    from support import anthropic_client

    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"))
    model = anthropic_client(client).models.list().data[0]
    assert model.id == SERVED and model.type == "model" and model.display_name == SERVED
    assert model.created_at.year >= 2025
    row = client.get("/v1/models").json()["data"][0]
    assert row["max_input_tokens"] == row["context_window"] == 40960 and row["max_tokens"] == 40960
    assert anthropic_client(client).models.retrieve(SERVED).id == SERVED
    capped = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"max_tokens": 1000, "memory_budget": 0.004})
    row = capped.get("/v1/models").json()["data"][0]
    ceiling = capped.get("/stats").json()["engine"]["admission"]["context_ceiling"]
    assert row["max_input_tokens"] == ceiling < 40960 and row["max_tokens"] == 1000
    assert openai_client(capped).models.retrieve(SERVED).model_extra["max_tokens"] == 1000


def test_a_codex_model_catalog_of_the_served_model(mlxrt_tiny_checkpoint, mlxrt_serve):
    """Codex reads model metadata only from its built-in catalog or a ``model_catalog_json`` file
    (it never asks the server); /codex/model-catalog is that file for the served model, one entry
    per name that reaches it (the fields Codex 0.171 refuses a catalog without are present)."""
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"memory_budget": 0.004, "strict_model": True,
                                                      "model_alias": [f"gpt-5-codex={mlxrt_tiny_checkpoint('qwen3')}"]})
    body = client.get("/codex/model-catalog").json()
    ceiling = client.get("/stats").json()["engine"]["admission"]["context_ceiling"]
    assert [m["slug"] for m in body["models"]] == ["default", SERVED, "gpt-5-codex"]
    for entry in body["models"]:
        assert entry["context_window"] == entry["max_context_window"] == ceiling < 40960
        assert entry["display_name"] == SERVED and entry["base_instructions"].startswith("You are a coding agent")
        assert {"supported_reasoning_levels", "shell_type", "visibility", "supported_in_api", "priority",
                "support_verbosity", "truncation_policy", "experimental_supported_tools"} <= set(entry)
        assert entry["truncation_policy"] == {"mode": "tokens", "limit": ceiling // 8}
