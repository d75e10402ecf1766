"""``mlxrt serve --distributed``: two ranks on this machine over loopback (ring backend).

Each test starts real processes: either through ``mlxrt launch`` (mlx.launch underneath) or
the way mlx.launch starts a rank (``MLX_RANK`` and ``MLX_HOSTFILE`` in the environment), so
that one rank can be killed or frozen on its own (mlx.launch would stop every rank).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import time

import httpx
import openai
import pytest
from support import MLXRT_BIN, Exploding, free_port, openai_client

mx = pytest.importorskip("mlx.core")
if not mx.distributed.is_available(backend="ring"):
    pytest.skip("this MLX build has no ring backend", allow_module_level=True)

PROMPTS = ["Say something.", "Count to five"]
MAX_TOKENS = 12


def _client(url: str, http_client: httpx.Client | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60, http_client=http_client)


def _outputs(url: str, http_client: httpx.Client | None = None) -> tuple[list[str], list[float]]:
    """Answers through the openai client (greedy chat, completions and a stream; seeded
    sampling) and the sampled answer's log-probabilities."""
    client = _client(url, http_client)
    out = []
    for prompt in PROMPTS:
        chat = client.chat.completions.create(model="default", messages=[{"role": "user", "content": prompt}],
                                              max_tokens=MAX_TOKENS, temperature=0)
        msg = chat.choices[0].message
        out.append((msg.content or "") + "|" + str(getattr(msg, "reasoning", "") or ""))
        out.append(client.completions.create(model="default", prompt=prompt, max_tokens=MAX_TOKENS,
                                             temperature=0).choices[0].text)
    # Seeded sampling with a penalty and log-probabilities: rank 0 samples, every rank follows.
    sampled = client.chat.completions.create(model="default", messages=[{"role": "user", "content": PROMPTS[1]}],
                                             max_tokens=MAX_TOKENS, temperature=1.0, seed=7, logprobs=True,
                                             top_logprobs=2, extra_body={"repetition_penalty": 1.3})
    tokens = sampled.choices[0].logprobs.content
    out.append(str([t.token for t in tokens]))
    stream = client.completions.create(model="default", prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                       stream=True)
    out.append("".join(chunk.choices[0].text for chunk in stream if chunk.choices))
    return out, [t.logprob for t in tokens]


def _assert_same(outputs: tuple[list[str], list[float]], reference: tuple[list[str], list[float]]) -> None:
    assert outputs[0] == reference[0]
    # Tensor parallelism sums partial products in another order: the same tokens, logits
    # equal to float rounding.
    assert outputs[1] == pytest.approx(reference[1], abs=1e-2)


def _wait_healthy(url: str, procs: list[subprocess.Popen], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a rank exited {proc.returncode}:\n{proc.stdout.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError("the distributed server did not become healthy")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Ranks:
    """Two ``mlxrt serve --distributed`` ranks started as mlx.launch would start them."""

    def __init__(self, tmp_path, model, extra=(), flag=True):
        self.ports = [free_port(), free_port()]  # HTTP: rank 0 binds its own; rank 1 must bind none
        hostfile = tmp_path / "hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"], [f"127.0.0.1:{free_port()}"]]))
        self.url = f"http://127.0.0.1:{self.ports[0]}"
        self.procs = [
            subprocess.Popen([MLXRT_BIN, "serve", str(model), *(["--distributed"] if flag else []),
                              "--port", str(self.ports[rank]), *extra],
                             env={**os.environ, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
            for rank in (0, 1)
        ]
        try:
            _wait_healthy(self.url, self.procs)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # qwen3_5: mlx-lm has both shard() and pipeline() for it; 4 layers, heads divisible by 2.
    from mlxrt.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("dist") / "qwen3_5", "qwen3_5")


@pytest.fixture(scope="module")
def reference(model):
    """The single-process server's outputs on the same checkpoint (the same app `mlxrt serve`
    builds, in this process: no second interpreter to start)."""
    from litestar.testing import TestClient

    from mlxrt.cli import build_server
    from mlxrt.host import make_host

    host = make_host()
    app = build_server(host, str(model), {"host": "127.0.0.1", "port": 0})
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            return _outputs(str(client.base_url), client)
    finally:
        app.state.models.stop()


@pytest.fixture
def ranks(tmp_path, model):
    started: list[Ranks] = []

    def start(*extra: str, flag: bool = True) -> Ranks:
        started.append(Ranks(tmp_path, model, extra, flag))
        return started[-1]

    yield start
    for r in started:
        r.stop()


def test_tensor_parallel_through_mlxrt_launch_matches_single_process(model, reference):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([MLXRT_BIN, "launch", "--hosts", "127.0.0.1,127.0.0.1", "--starting-port",
                             str(free_port()), "--", "serve", str(model), "--port", str(port)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd="/", start_new_session=True)
    try:
        _wait_healthy(url, [proc])
        _assert_same(_outputs(url), reference)
        stats = httpx.get(f"{url}/stats").json()
        assert stats["engine"]["distributed"] == {"ranks": 2, "mode": "tensor", "failure": None}
        # Stopping rank 0 alone stops every rank cleanly, so mlx.launch ends with status 0.
        os.kill(_rank_pid(proc.pid, 0), signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert "rank 1 of 2 holds its tensor-parallel shard" in out, out
    assert "rank 1: shutdown from rank 0" in out, out
    assert proc.returncode == 0, out


def _rank_pid(session: int, rank: int) -> int:
    """The pid of the process of ``rank`` among those mlx.launch started in ``session``."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("finds the ranks' processes through /proc")
    for entry in os.listdir("/proc"):
        try:
            if not entry.isdigit() or os.getsid(int(entry)) != session:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if f"MLX_RANK={rank}".encode() in env and b"mlxrt.cli" in cmdline:
            return int(entry)
    raise AssertionError(f"no process of rank {rank}")


def test_pipeline_matches_single_process_and_a_killed_rank_turns_health_503(ranks, reference):
    r = ranks("--pipeline", flag=False)  # as mlx_lm.server: a rank of a launched group needs no --distributed
    _assert_same(_outputs(r.url), reference)
    assert not _listening(r.ports[1]), "rank 1 must not serve HTTP"
    stats = httpx.get(f"{r.url}/stats").json()
    assert stats["engine"]["distributed"]["mode"] == "pipeline"

    r.procs[1].kill()
    killed = time.monotonic()
    while httpx.get(f"{r.url}/health", timeout=5).status_code != 503:
        assert time.monotonic() - killed < 10, "rank 0 did not notice the lost rank within 10 s"
        time.sleep(0.2)
    health = httpx.get(f"{r.url}/health", timeout=5)
    assert health.json()["status"] == "unavailable" and "lost" in health.json()["error"]
    with pytest.raises(openai.APIStatusError) as err:
        _client(r.url).chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4)
    assert err.value.status_code == 503
    assert err.value.body["code"] == "rank_lost"
    import anthropic

    with pytest.raises(anthropic.APIStatusError) as err:
        anthropic.Anthropic(base_url=r.url, api_key="unused", max_retries=0).messages.create(
            model="default", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 503 and err.value.body["error"]["type"] == "api_error"
    assert r.procs[0].poll() is None, "rank 0 keeps answering (503) after losing a rank"


def test_a_frozen_rank_fails_the_running_request_with_503_within_the_timeout(ranks):
    r = ranks("--distributed-timeout", "2")
    client = _client(r.url)
    stream = client.completions.create(model="default", prompt="go", max_tokens=100000, temperature=0, stream=True)
    chunks = iter(stream)
    next(chunks)  # the generation is running on both ranks
    os.kill(r.procs[1].pid, signal.SIGSTOP)  # alive but silent: no error from the socket, only silence
    frozen = time.monotonic()
    try:
        # A request submitted meanwhile waits behind the stuck one: it must fail too, not hang.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            queued = pool.submit(client.completions.create, model="default", prompt="next", max_tokens=4)
            with pytest.raises(openai.APIError):
                for _ in chunks:
                    assert time.monotonic() - frozen < 15, "the stream did not fail within the timeout"
            assert time.monotonic() - frozen < 10
            with pytest.raises(openai.APIStatusError) as err:
                queued.result(timeout=10)
        assert err.value.status_code == 503
        assert httpx.get(f"{r.url}/health", timeout=5).status_code == 503
    finally:
        os.kill(r.procs[1].pid, signal.SIGCONT)


@pytest.mark.parametrize("args, message", [
    (["--distributed", "--batch", "4"], "--batch > 1"),
    (["--distributed", "--kv-quant", "8"], "quantized KV"),
    (["--distributed", "--max-models", "2"], "several models"),
    (["--pipeline"], "needs --distributed"),
    (["--distributed"], "Start every rank with mlx.launch"),
])
def test_unsupported_combinations_are_refused_at_start_up(model, args, message):
    done = subprocess.run([MLXRT_BIN, "serve", str(model), *args, "--port", str(free_port())],
                          capture_output=True, text=True, timeout=60, cwd="/",
                          env={k: v for k, v in os.environ.items() if not k.startswith("MLX_")})
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_launch_builds_the_mlx_launch_command():
    from mlxrt.distributed.launch import launch_command

    argv = launch_command(["--", "serve", "M", "--port", "9"], hosts="10.0.0.1,10.0.0.2", hostfile=None,
                          backend="ring", starting_port=5000, python="/venv/bin/python")
    assert argv[argv.index("--hosts") + 1] == "10.0.0.1,10.0.0.2"
    assert argv[argv.index("--starting-port") + 1] == "5000"
    assert argv[argv.index("--") + 1:] == ["/venv/bin/python", "-m", "mlxrt.cli", "serve", "--distributed", "M",
                                           "--port", "9"]
    import click

    with pytest.raises(click.UsageError):
        launch_command(["M"], hosts=None, hostfile=None, backend="ring", starting_port=1, python="p")



@pytest.fixture
def one_rank(model, mlxrt_serve, monkeypatch):
    """Rank 0's engine in this process, on a group of one (every collective is the identity):
    the protocol's rank-0 side without a second process."""
    import mlxrt.distributed.serving

    monkeypatch.setattr(mlxrt.distributed.serving, "_join", lambda settings: mx.distributed.init())
    return mlxrt_serve(model, plugins=[Exploding()], options={"distributed": True})


def test_a_failing_sampler_chain_fails_its_request_and_keeps_the_ranks_in_step(one_rank, reference):
    client = openai_client(one_rank)
    with pytest.raises(openai.InternalServerError, match="processor exploded") as err:
        client.completions.create(model="default", prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                  extra_body={"explode": 3})
    assert err.value.status_code == 500  # the request's own failure, not a lost group (503)
    assert one_rank.get("/health").status_code == 200
    text = client.completions.create(model="default", prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                     temperature=0).choices[0].text
    assert text == reference[0][1]


def test_raw_forwards_are_refused_with_400(one_rank):
    resp = one_rank.post("/v1/adapters", json={"id": "a", "path": "/nowhere"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "distributed_unsupported"
    assert one_rank.get("/stats").json()["engine"]["distributed"] == {"ranks": 1, "mode": "tensor", "failure": None}
