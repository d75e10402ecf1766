"""Distributed decode speed: one process vs 2 ranks (tensor, pipeline) on the same checkpoint.

Starts `mlxrt serve MODEL` once single-process and then as two `--distributed` ranks over
loopback (ring backend; each rank started the way mlx.launch starts it), sends the same
greedy streaming completions to each, and prints a markdown table: time to first token and
single-stream decode tok/s ((tokens - 1) / (last token - first token)), medians of --runs.

    python benchmarks/distributed.py                     # tiny random qwen3_5 (~2 min)
    python benchmarks/distributed.py --model DIR --max-tokens 256

On one machine the ranks share its cores and talk over loopback, so this measures the
protocol's overhead, not a speed-up (docs/distributed.md).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

MLXRT = str(Path(sys.executable).with_name("mlxrt"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str, mode: str, workdir: Path) -> tuple[str, list[subprocess.Popen]]:
    port = free_port()

    def serve(http_port: int, *extra: str) -> list[str]:
        return [MLXRT, "serve", model, "--port", str(http_port), "--log-level", "WARNING", *extra]

    if mode == "single":
        procs = [subprocess.Popen(serve(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    else:
        hostfile = workdir / f"hosts-{mode}.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"], [f"127.0.0.1:{free_port()}"]]))
        extra = ["--distributed", *(["--pipeline"] if mode == "pipeline" else [])]
        procs = [subprocess.Popen(serve(free_port() if rank else port, *extra),
                                  env={**os.environ, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for rank in (0, 1)]
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"{mode}: a process exited")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return url, procs
        except httpx.HTTPError:
            time.sleep(0.3)
    raise TimeoutError(mode)


def one_stream(url: str, prompt: str, max_tokens: int) -> tuple[float, float, str]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    stamps: list[float] = []
    text = []
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if choices and choices[0].get("text"):
                stamps.append(time.perf_counter())
                text.append(choices[0]["text"])
    ttft = stamps[0] - t0
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return ttft, rate, "".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint folder (default: a tiny random qwen3_5)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="single,tensor,pipeline")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = args.model
        if model is None:
            from mlxrt.testing import write_tiny_checkpoint

            model = str(write_tiny_checkpoint(workdir / "qwen3_5", "qwen3_5"))
        rows, texts = [], {}
        for mode in args.modes.split(","):
            url, procs = start(model, mode, workdir)
            try:
                one_stream(url, "warm up", 4)
                runs = [one_stream(url, f"Run {i}: tell me a story.", args.max_tokens) for i in range(args.runs)]
            finally:
                for p in reversed(procs):
                    p.kill()
                    p.wait()
            texts[mode] = [r[2] for r in runs]
            rows.append((mode, statistics.median(r[0] for r in runs) * 1000, statistics.median(r[1] for r in runs)))
    print(f"model: {args.model or 'tiny qwen3_5'}; max_tokens {args.max_tokens}; {args.runs} runs; "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| mode | TTFT ms (median) | decode tok/s (median) |\n|---|---|---|")
    for mode, ttft, rate in rows:
        print(f"| {mode} | {ttft:.0f} | {rate:.1f} |")
    same = all(t == texts[rows[0][0]] for t in texts.values())
    print(f"\noutputs identical across modes: {same}")


if __name__ == "__main__":
    main()
