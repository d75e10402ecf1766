"""Time to first token when a request names another model: mlxrt vs mlx_lm.server's swap.

Both servers start with model A; requests then alternate B, A, B, ... (local folders, named
by path, as mlx_lm.server loads them). Each request streams a short greedy chat completion;
TTFT is from sending it to the first content chunk. Configurations:

- ``mlx_lm.server``: swaps on every request (one model at a time).
- ``mlxrt --max-models 1``: the same swap (unload the idle model, load the named one).
- ``mlxrt --max-models 2``: both stay resident after their first load (no swap).

By default A and B are tiny random checkpoints of two families (llama, qwen3) written to a
temporary folder; ``--model A --model B`` measures real ones.

    python benchmarks/multi_model.py --swaps 6
    python benchmarks/multi_model.py --model ~/models/SmolLM2 --model ~/models/Qwen3-0.6B --swaps 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import free_port, start_server

BIN = Path(sys.executable).parent




def ttft(url: str, model: str) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4,
            "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"{model}: {reply.status_code} {reply.read()[:500]!r}")
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta") or {}
            if delta.get("content"):
                return time.perf_counter() - t0
    return time.perf_counter() - t0  # nothing but an empty answer: its end is the first token


def run(name: str, cmd: list[str], a: str, b: str, swaps: int) -> list[float]:
    port = free_port()
    proc = start_server(cmd, port)
    url = f"http://127.0.0.1:{port}"
    try:
        ttft(url, a)  # warm: A is loaded and has answered once
        times = [ttft(url, (b, a)[i % 2]) for i in range(swaps)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"  {name}: " + ", ".join(f"{t * 1000:.0f}" for t in times) + " ms", file=sys.stderr)
    return times


def tiny_pair(root: Path) -> tuple[str, str]:
    from mlxrt.testing import write_tiny_checkpoint

    return (str(write_tiny_checkpoint(root / "llama", "llama")), str(write_tiny_checkpoint(root / "qwen3", "qwen3")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=[], help="A model folder (give two).")
    parser.add_argument("--swaps", type=int, default=6, help="Requests after the warm one, alternating B, A.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        a, b = args.model if len(args.model) == 2 else tiny_pair(Path(tmp))
        mlxrt = [str(BIN / "mlxrt"), "serve", a, "--no-strict-model"]
        configs = {
            "mlx_lm.server (swap)": [sys.executable, "-m", "mlx_lm", "server", "--model", a],
            "mlxrt --max-models 1 (swap)": [*mlxrt, "--max-models", "1"],
            "mlxrt --max-models 2 (resident)": [*mlxrt, "--max-models", "2"],
        }
        print(f"A = {a}\nB = {b}\nload: {open('/proc/loadavg').read().strip() if os.path.exists('/proc/loadavg') else '?'}",
              file=sys.stderr)
        results = {name: run(name, cmd, a, b, args.swaps) for name, cmd in configs.items()}
    base = statistics.median(results["mlx_lm.server (swap)"])
    print("| configuration | TTFT after switching model, median (ms) | min | max | vs mlx_lm.server |")
    print("|---|---:|---:|---:|---:|")
    for name, times in results.items():
        med = statistics.median(times)
        print(f"| {name} | {med * 1000:.1f} | {min(times) * 1000:.1f} | {max(times) * 1000:.1f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
