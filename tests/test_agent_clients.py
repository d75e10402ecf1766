"""Claude Code and Codex CLI, the real programs from npm, run a tool loop against mlxrt.

A tiny Qwen3 checkpoint (the real Qwen3 tokenizer from ../shared) is scripted by AgentScript:
turn 1 calls the client's shell tool with a command that creates a file and prints RAN; turn 2,
which carries the tool's output, answers. Each test asserts the file exists, the tool's result
came back in the next request, turn 2 reused turn 1's prompt from the cache, no request was
refused (Claude Code asks for a max_tokens beyond the window: it gets what fits), and neither
client tried a host other than the server (a refusing proxy records what they ask of it).
Claude Code is also run against a window its prompt does not fit: it reads the answer as the
overflow it is ("Prompt is too long"), not as a generic API error.

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
from agent_clients import (
    RAN,
    AgentScript,
    AgentServer,
    NoNetwork,
    npm_bin,
    npm_install,
    write_fixtures,
)

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
    """One client run: the server's record of it, the client's exit and the hosts it tried."""

    def __init__(self, name: str, server: AgentServer, out: subprocess.CompletedProcess, made: Path, path: str,
                 carries_result, elsewhere: list[str]):
        self.name, self.posts = name, server.generations(path)
        self.out, self.made, self.carries_result, self.elsewhere = out, made, carries_result, elsewhere
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


def claude_env(server: AgentServer, home: Path, proxy: NoNetwork) -> dict[str, str]:
    """Nothing but the server's URL and a key (plus no telemetry, no updates, a fresh HOME)."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "test-key",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", **proxy.env()}


def claude_run(version: str, model: Path, tmp: Path) -> Run:
    """``claude -p`` with :func:`claude_env`, allowed to run Bash without asking."""
    claude = npm_bin(client_root("@anthropic-ai/claude-code", version), "claude")
    work, home = tmp / "work", tmp / "home"
    work.mkdir(), home.mkdir()
    made = work / "made-by-claude"
    script = AgentScript(f"touch {made} && echo MLXRT-TOOL-$((6*7))-RAN",
                         {"Bash": lambda command: {"command": command, "description": "Make the file"}})
    server, proxy = AgentServer(model, script), NoNetwork()
    try:
        out = subprocess.run([str(claude), "-p", "Make the file, then say you are done.",
                              "--allowedTools", "Bash", "--output-format", "json"],
                             cwd=work, env=claude_env(server, home, proxy), capture_output=True, text=True,
                             timeout=TIMEOUT)
        capture(f"claude-code-{version}", server)
    finally:
        server.stop()
        proxy.close()
    return Run(f"claude-code-{version}", server, out, made, "/v1/messages", anthropic_carries_result, proxy.asked)


# --- Codex CLI -----------------------------------------------------------------------------

def responses_carries_result(body: dict) -> bool:
    items = body.get("input")
    return isinstance(items, list) and any(
        item.get("type") == "function_call_output" and RAN in json.dumps(item.get("output")) for item in items)


#: docs/dialects.md, "Codex CLI": the provider, a shell that runs without asking, and no calls
#: elsewhere (without the last three settings 0.171.0 asks github.com and api.github.com for
#: its plugin marketplace, chatgpt.com for apps and ab.chatgpt.com for analytics on every run).
CODEX_CONFIG = """\
model = "default"
model_provider = "mlxrt"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false

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
    server, proxy = AgentServer(model, script), NoNetwork()
    try:
        (home / "config.toml").write_text(CODEX_CONFIG.format(url=server.url))
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "CODEX_HOME": str(home), "MLXRT_API_KEY": "test-key",
               **proxy.env()}
        out = subprocess.run([str(codex), "exec", "--skip-git-repo-check", "Make the file, then say you are done."],
                             cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        capture(f"codex-{version}", server)
    finally:
        server.stop()
        proxy.close()
    return Run(f"codex-{version}", server, out, made, "/v1/responses", responses_carries_result, proxy.asked)


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


def test_nothing_else_was_asked(run):
    """Configured as docs/dialects.md says, the client asks no host but the server."""
    assert run.elsewhere == [], run.elsewhere


WINDOW = 131072  # the model fixture's max_position_embeddings


def test_a_max_tokens_beyond_the_window_got_what_fits(run):
    """Claude Code asks for 128,000 output tokens whatever the model (Codex sends no limit):
    with its ~20,000-token prompt that is beyond the window, and the answer is a 200 whose
    header says what was granted."""
    asked = [e for e in run.posts if (e["body"].get("max_tokens") or e["body"].get("max_output_tokens") or 0)
             + 15000 > WINDOW]
    if not asked:
        pytest.skip(f"{run.name} sends no max_tokens beyond the window")
    for e in asked:
        limit = e["body"].get("max_tokens") or e["body"].get("max_output_tokens")
        assert e["status"] == 200, e.get("error")
        header = e["response_headers"]["x-mlxrt-max-tokens"]
        granted = int(header.split("granted=")[1])
        # Planned on the prompt before canonicalization drops Claude Code's billing line (a few
        # dozen tokens): a little under what the final prompt leaves, never over.
        left = WINDOW - cache_of(e)["prompt"]
        assert header.startswith(f"asked={limit}; ") and left - 100 <= granted <= left, header


@pytest.fixture(scope="module")
def small_window(tmp_path_factory):
    """The model with an 8,192-token window (SmolLM2's): Claude Code's prompt does not fit."""
    from conftest import shared_tokenizer

    from mlxrt.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("agent") / "qwen3-8k", "qwen3",
                                 tokenizer_dir=shared_tokenizer("qwen3"),
                                 config_overrides={"max_position_embeddings": 8192})


def test_claude_code_reads_an_over_long_prompt_as_overflow(small_window, tmp_path):
    """The newest Claude Code, its prompt over the window: mlxrt answers in Anthropic's words
    (``prompt is too long: N tokens > 8192 maximum``) and Claude Code says its own "Prompt is too
    long", not a generic "API Error"."""
    version = CLAUDE_CODE[0]
    claude = npm_bin(client_root("@anthropic-ai/claude-code", version), "claude")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(), home.mkdir()
    server, proxy = AgentServer(small_window, AgentScript("true", {})), NoNetwork()
    try:
        out = subprocess.run([str(claude), "-p", "say hi", "--output-format", "json"], cwd=work,
                             env=claude_env(server, home, proxy), capture_output=True, text=True, timeout=TIMEOUT)
    finally:
        server.stop()
        proxy.close()
    posts = server.generations("/v1/messages")
    refused = [e for e in posts if e.get("status") == 400]
    assert refused, [e.get("status") for e in posts]
    for e in refused:
        message = json.loads(e["error"])["error"]["message"]
        assert message.startswith("prompt is too long: ") and message.endswith(" tokens > 8192 maximum"), message
    result = json.loads(out.stdout)
    assert result["is_error"] and result["result"].startswith("Prompt is too long"), out.stdout[-2000:]
    assert "API Error" not in result["result"]
