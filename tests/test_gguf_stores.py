"""GGUF models already on disk: a tiny GGUF placed in each store other tools keep models in (the
Hugging Face cache, Ollama's model store, LM Studio's models folder) under a temporary HOME is
listed by ``mlxrt ls`` with the columns of the other models, assessed by ``mlxrt fit`` from its
header, listed with an assessment by ``GET /library`` and served by its name."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from gguf_files import write_tiny
from support import MLXRT_BIN


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-Q8_0.gguf"
    write_tiny(path, "llama", {"token_embd": "Q8_0", "output": "Q8_0", "attn_q": "Q4_K", "attn_k": "Q4_K",
                               "attn_v": "Q8_0", "attn_output": "Q4_K", "ffn_gate": "Q4_K", "ffn_up": "Q4_K",
                               "ffn_down": "Q6_K"})
    return path


@pytest.fixture
def stores(tmp_path, monkeypatch, tiny_gguf) -> dict[str, Path]:
    """HOME with the tiny GGUF in the three stores; returns each store's file."""
    home = tmp_path / "home"
    data = tiny_gguf.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    # Hugging Face cache: a GGUF repo (no config.json) as huggingface-hub lays it out
    repo = home / ".cache" / "huggingface" / "hub" / "models--acme--Tiny-GGUF"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / digest).write_bytes(data)
    snapshot = repo / "snapshots" / ("e" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "tiny-Q8_0.gguf").symlink_to(os.path.relpath(repo / "blobs" / digest, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("e" * 40)
    # Ollama: a manifest naming the GGUF blob by digest
    ollama = home / ".ollama" / "models"
    (ollama / "blobs").mkdir(parents=True)
    (ollama / "blobs" / f"sha256-{digest}").write_bytes(data)
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "tinyllama" / "q8"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.license", "digest": "sha256:" + "0" * 64, "size": 1},
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)}]}))
    pulled = ollama / "manifests" / "hf.co" / "acme" / "Tiny-GGUF" / "Q8_0"  # `ollama pull hf.co/acme/Tiny-GGUF:Q8_0`
    pulled.parent.mkdir(parents=True)
    pulled.write_text(manifest.read_text())
    # LM Studio: PUBLISHER/REPO/*.gguf; a vision projector beside it is not a model
    lms = home / ".lmstudio" / "models" / "lmstudio-community" / "Tiny-GGUF"
    lms.mkdir(parents=True)
    (lms / "Tiny-Q8_0.gguf").write_bytes(data)
    (lms / "mmproj-Tiny-F16.gguf").write_bytes(b"GGUF")
    for key in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "OLLAMA_MODELS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MLXRT_HOME", str(tmp_path / "mlxrt-home"))
    return {"gguf-hf-cache": snapshot / "tiny-Q8_0.gguf", "ollama": ollama / "blobs" / f"sha256-{digest}",
            "lmstudio": lms / "Tiny-Q8_0.gguf"}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MLXRT_BIN, *args], capture_output=True, text=True, cwd="/", env=os.environ.copy())


NAMES = {"gguf-hf-cache": "acme/Tiny-GGUF/tiny-Q8_0.gguf", "ollama": "tinyllama:q8",
         "lmstudio": "lmstudio-community/Tiny-GGUF/Tiny-Q8_0.gguf"}


def test_ls_lists_a_gguf_of_each_store(stores, tiny_gguf):
    out = run("ls", "--json")
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    assert sorted(r["repo_id"] for r in listed if r["source"] == "ollama") == ["hf.co/acme/Tiny-GGUF:Q8_0",
                                                                             "tinyllama:q8"]
    rows = {r["source"]: r for r in listed if r["repo_id"] in NAMES.values()}
    assert sorted(rows) == sorted(NAMES)
    for source, row in rows.items():
        assert row["repo_id"] == NAMES[source] and Path(row["path"]) == stores[source]
        assert (row["model_type"], row["architecture"]) == ("llama", "LlamaForCausalLM")
        assert row["quant_bits"] == 4 and row["quant_group_size"] == 32
        assert row["params"] > 100_000 and row["weight_bytes"] > 0 and row["size_bytes"] == tiny_gguf.stat().st_size
        assert row["support_tier"] == "generic" and row["servable"] and row["problem"] is None
    table = run("ls").stdout
    assert "tinyllama:q8 (ollama)" in table and "Tiny-Q8_0.gguf (lm studio)" in table
    assert "mmproj" not in out.stdout and "acme/Tiny-GGUF\n" not in table  # no row for the repo itself
    scan = run("scan").stdout
    assert "tinyllama:q8: ok" in scan


def test_ollama_models_root_is_overridden_by_the_environment(stores, tmp_path, monkeypatch):
    moved = tmp_path / "elsewhere"
    os.replace(stores["ollama"].parent.parent, moved)
    monkeypatch.setenv("OLLAMA_MODELS", str(moved))
    rows = [r for r in json.loads(run("ls", "--json").stdout) if r["source"] == "ollama"]
    assert sorted(r["repo_id"] for r in rows) == ["hf.co/acme/Tiny-GGUF:Q8_0", "tinyllama:q8"]
    assert all(Path(r["path"]).parent == moved / "blobs" for r in rows)


def test_fit_reads_the_header_and_matches_the_converted_folder(stores):
    from mlxrt.loading.fit import assess
    from mlxrt.loading.resolve import resolve_model

    out = run("fit", "tinyllama", "--json", "--memory-budget", "1", "--ctx", "256")
    assert out.returncode == 0, out.stderr
    static = json.loads(out.stdout)
    assert static["model"] == "tinyllama:q8" and static["fits"]
    assert not (Path(os.environ["MLXRT_HOME"]) / "models").exists()  # fit converted nothing
    folder = resolve_model("tinyllama").path  # serve's path: converted once
    converted = assess(folder, ctx=256, budget=10**9)
    assert static["weight_bytes"] == converted.weight_bytes
    assert static["kv_bytes_per_token"] == converted.describe()["kv_bytes_per_token"]
    too_small = json.loads(run("fit", "lmstudio-community", "--json", "--memory-budget", "0.0001").stdout)
    assert not too_small["fits"] and too_small["model"] == "lmstudio-community/Tiny-GGUF/Tiny-Q8_0.gguf"


def test_serve_by_store_name_and_library_lists_them(stores, mlxrt_serve):
    from openai import OpenAI

    client = mlxrt_serve("tinyllama:q8")
    body = client.get("/library").json()
    rows = {r["repo_id"]: r for r in body["models"]}
    for name in NAMES.values():
        assessment = rows[name]["assessment"]  # from the header: 8192 tokens exceed the tiny window
        assert assessment["weight_bytes"] > 0 and assessment["max_safe_context"] == 256, name
    assert rows["tinyllama:q8"]["serving"]
    sdk = OpenAI(base_url=str(client.base_url) + "/v1", api_key="x", http_client=client)
    done = sdk.completions.create(model="tinyllama:q8", prompt="the 12", max_tokens=4, temperature=0)
    assert done.usage.completion_tokens >= 1


def test_rm_refuses_a_gguf_of_another_store(stores):
    out = run("rm", "tinyllama", "--yes")
    assert out.returncode != 0 and "ollama" in out.stderr and stores["ollama"].is_file()


def test_family_plugins_answer_for_a_gguf_as_for_a_folder(tmp_path):
    from mlxrt.host import make_host
    from mlxrt.loading.gguf_library import GGUFEntry
    from mlxrt.loading.library import describe_gguf

    host = make_host()
    for arch, family, tier in (("qwen3", "qwen", "family"), ("gemma2", None, "generic")):
        path = tmp_path / f"{arch}.gguf"
        write_tiny(path, arch, "Q8_0")
        row = describe_gguf(GGUFEntry(path.name, path, "lmstudio"), host)
        assert (row.family, row.support_tier, row.problem) == (family, tier, None), arch
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (5).to_bytes(8, "little") + (1).to_bytes(8, "little"))
    row = describe_gguf(GGUFEntry("bad.gguf", bad, "lmstudio"), host)
    assert row.support_tier == "unsupported" and not row.servable
    assert row.problem.startswith(f"{bad}: truncated or corrupt GGUF header") and row.problem.count(str(bad)) == 1
