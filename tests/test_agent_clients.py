"""Claude Code and Codex CLI, the real programs from npm, run a tool loop against mlxrt.

A tiny Qwen3 checkpoint (the real Qwen3 tokenizer from ../shared) is scripted by AgentScript:
turn 1 calls the client's shell tool with a command that creates a file and prints RAN; turn 2,
which carries the tool's output, answers. Each test asserts the file exists, the tool's result
came back in the next request, and turn 2 reused turn 1's prompt from the cache.

They skip without node and npm, or when npm cannot install the pinned version. With
``MLXRT_CAPTURE_CLIENTS=1`` they also rewrite tests/fixtures/clients/<client>-<version>/ from
the requests they saw (replayed without Node by tests/test_client_fixtures.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from agent_clients import RAN, AgentScript, AgentServer, npm_bin, npm_install, write_fixtures

FIXTURES = Path(__file__).parent / "fixtures" / "clients"
#: Pinned releases: the newest when this was written, and the one issue 30 was reported on.
CLAUDE_CODE = ("2.1.332", "2.1.197")
CODEX = ("0.171.0",)
TIMEOUT = 600
#: Past the suite's 300 s per test (pyproject.toml): a first run installs each client with npm
#: (up to 600 s) and a client's run may take TIMEOUT.
pytestmark = pytest.mark.timeout(2 * TIMEOUT + 300)


def client_root(package: str, version: str) -> Path:
    root = npm_install(package, version)
    if root is None:
        pytest.skip(f"needs node and npm, and {package}@{version} from the npm registry")
    return root


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from conftest import shared_tokenizer

    from mlxrt.testing import write_tiny_checkpoint

    # The real tokenizer keeps Claude Code's ~20k-token prompt ~20k tokens (a generated one
    # spells it out letter by letter); a long context so the whole prompt fits.
    return write_tiny_checkpoint(tmp_path_factory.mktemp("agent") / "qwen3", "qwen3",
                                 tokenizer_dir=shared_tokenizer("qwen3"),
                                 config_overrides={"max_position_embeddings": 131072})


def cache_of(exchange: dict) -> dict:
    """``x-mlxrt-cache: hit; cached=812; prompt=900`` → {"state": "hit", "cached": 812, "prompt": 900}."""
    header = exchange["response_headers"]["x-mlxrt-cache"]
    state, *fields = [part.strip() for part in header.split(";")]
    values = dict(f.split("=", 1) for f in fields)
    return {"state": state, "cached": int(values.get("cached", 0)), "prompt": int(values.get("prompt", 0))}


class Run:
    """One client run: the server's record of it and the client's exit."""

    def __init__(self, name: str, server: AgentServer, out: subprocess.CompletedProcess, made: Path, path: str,
                 carries_result):
        self.name, self.posts = name, server.generations(path)
        self.out, self.made, self.carries_result = out, made, carries_result
        self.log = (f"exited {out.returncode}\nstdout: {out.stdout[-2000:]}\nstderr: {out.stderr[-2000:]}\n"
                    f"statuses: {[e.get('status') for e in self.posts]}")

    def turns(self) -> tuple[dict, dict]:
        """The request that got the tool call and the one that carried its result back."""
        with_result = [i for i, e in enumerate(self.posts) if self.carries_result(e["body"])]
        assert with_result, f"no request carried the tool's output\n{self.log}"
        first = next(e for e in reversed(self.posts[:with_result[0]])
                     if e.get("status") == 200 and e["body"].get("tools"))
        return first, self.posts[with_result[0]]

    def errors(self) -> list[str]:
        return [f"{e.get('status')} {e.get('error', '')[:300]} for {json.dumps(e['body'])[:200]}…" for e in self.posts if e.get("status", 500) >= 400]


def capture(name: str, server: AgentServer) -> None:
    if os.environ.get("MLXRT_CAPTURE_CLIENTS"):
        write_fixtures(FIXTURES / name, server.recorder.exchanges)

# --- Claude Code ---------------------------------------------------------------------------

def anthropic_carries_result(body: dict) -> bool:
    for message in body.get("messages", []):
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_result" and RAN in json.dumps(block.get("content")):
                return True
    return False


def claude_run(version: str, model: Path, tmp: Path) -> Run:
    """``claude -p`` configured with nothing but the server's URL and a key (plus no telemetry,
    no updates, a fresh HOME), allowed to run Bash without asking."""
    claude = npm_bin(client_root("@anthropic-ai/claude-code", version), "claude")
    work, home = tmp / "work", tmp / "home"
    work.mkdir(), home.mkdir()
    made = work / "made-by-claude"
    script = AgentScript(f"touch {made} && echo MLXRT-TOOL-$((6*7))-RAN",
                         {"Bash": lambda command: {"command": command, "description": "Make the file"}})
    server = AgentServer(model, script)
    try:
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude"),
               "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "test-key",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
               "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1"}
        out = subprocess.run([str(claude), "-p", "Make the file, then say you are done.",
                              "--allowedTools", "Bash", "--output-format", "json"],
                             cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        capture(f"claude-code-{version}", server)
    finally:
        server.stop()
    return Run(f"claude-code-{version}", server, out, made, "/v1/messages", anthropic_carries_result)


# --- Codex CLI -----------------------------------------------------------------------------

def responses_carries_result(body: dict) -> bool:
    items = body.get("input")
    return isinstance(items, list) and any(
        item.get("type") == "function_call_output" and RAN in json.dumps(item.get("output")) for item in items)


#: docs/dialects.md, "Codex CLI": the provider, and a shell that runs without asking.
CODEX_CONFIG = """\
model = "default"
model_provider = "mlxrt"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.mlxrt]
name = "mlxrt"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "MLXRT_API_KEY"
"""


def codex_run(version: str, model: Path, tmp: Path) -> Run:
    codex = npm_bin(client_root("@openai/codex", version), "codex")
    work, home = tmp / "work", tmp / "codex-home"
    work.mkdir(), home.mkdir()
    made = work / "made-by-codex"
    # Codex names its shell tool differently across releases; the script calls whichever it offers.
    script = AgentScript(f"touch {made} && echo MLXRT-TOOL-$((6*7))-RAN", {
        "exec_command": lambda c: {"cmd": c},
        "shell_command": lambda c: {"command": c},
        "shell": lambda c: {"command": ["bash", "-lc", c]},
    })
    server = AgentServer(model, script)
    try:
        (home / "config.toml").write_text(CODEX_CONFIG.format(url=server.url))
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "CODEX_HOME": str(home), "MLXRT_API_KEY": "test-key"}
        out = subprocess.run([str(codex), "exec", "--skip-git-repo-check", "Make the file, then say you are done."],
                             cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        capture(f"codex-{version}", server)
    finally:
        server.stop()
    return Run(f"codex-{version}", server, out, made, "/v1/responses", responses_carries_result)


RUNS = [*((claude_run, v) for v in CLAUDE_CODE), *((codex_run, v) for v in CODEX)]


@pytest.fixture(scope="module", params=RUNS, ids=lambda r: f"{r[0].__name__.removesuffix('_run')}-{r[1]}")
def run(request, model, tmp_path_factory) -> Run:
    """Each pinned client once per session; the tests below read the same run."""
    start, version = request.param
    return start(version, model, tmp_path_factory.mktemp(f"{start.__name__}-{version}"))


# --- What every client run must show -------------------------------------------------------

def test_the_tool_ran(run):
    assert run.made.exists(), run.log


def test_its_result_came_back_and_the_client_finished(run):
    run.turns()
    assert run.out.returncode == 0 and "All done." in run.out.stdout, run.log


def test_turn_two_hit_the_prompt_cache(run):
    first, second = run.turns()
    turn1, turn2 = cache_of(first), cache_of(second)
    assert turn2["state"] in ("hit", "partial") and turn2["cached"] >= turn1["prompt"] * 9 // 10, (turn1, turn2)


def test_no_request_was_refused(run):
    assert not run.errors(), "\n".join(run.errors())
