"""System OpenBLAS vs the BLAS bundled with the Linux mlx[cpu] wheel, and vs mlx_lm.server.

Serves the embedded SmolLM2-135M-Instruct (Q4_1 GGUF, converted) in each configuration, one
after another, and prints prefill and decode tokens/s (best of ``--repeats``):

- prefill: a ~``--prompt-words``-word completion prompt (unique, so no prompt cache hits)
  with ``max_tokens=1``; prompt tokens / wall time.
- decode: a streamed greedy completion of ``--max-tokens``; (text chunks - 1) / (last chunk
  time - first chunk time).

    python benchmarks/blas.py                         # all five configurations (~5 min on 2 cores)
    python benchmarks/blas.py --only mlxrt-fp32-openblas --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import free_port, start_server

BIN = Path(sys.executable).parent



def configs(model_dir: str) -> dict[str, list[str]]:
    mlxrt = [str(BIN / "mlxrt"), "serve", "--prompt-cache-size", "0"]
    return {
        "mlxrt-q4-openblas": mlxrt,
        "mlxrt-q4-bundled": [*mlxrt, "--no-system-blas"],
        "mlxrt-fp32-openblas": [*mlxrt, "--dtype", "float32"],
        "mlxrt-fp32-bundled": [*mlxrt, "--dtype", "float32", "--no-system-blas"],
        "mlx_lm.server-q4": [sys.executable, "-m", "mlx_lm", "server", "--model", model_dir],
    }



def prefill(url: str, words: int) -> float:
    text = f"[{uuid.uuid4().hex}] " + " ".join(f"the quick brown fox number {i} jumps" for i in range(words // 6))
    t0 = time.perf_counter()
    reply = httpx.post(f"{url}/v1/completions", timeout=600,
                       json={"prompt": text, "max_tokens": 1, "temperature": 0}).json()
    if "usage" not in reply:
        raise RuntimeError(f"no usage in {reply}")
    return reply["usage"]["prompt_tokens"] / (time.perf_counter() - t0)


def decode(url: str, max_tokens: int) -> float:
    body = {"prompt": f"[{uuid.uuid4().hex}] Once upon a time, in a small village,",
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    times: list[float] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("text"):
                times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-words", type=int, default=150)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", action="append", help="run only this configuration (repeatable)")
    args = parser.parse_args()
    from mlxrt.loading.embedded import embedded_model_dir

    model_dir = str(embedded_model_dir())
    version = subprocess.run([str(BIN / "mlxrt"), "--version"], capture_output=True, text=True).stdout.strip()
    print(f"# {version}; model {model_dir}; {os.cpu_count()} CPUs")
    print(f"{'configuration':<22} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for name, cmd in configs(model_dir).items():
        if args.only and name not in args.only:
            continue
        port = free_port()
        proc = start_server(cmd, port, limit=180)
        try:
            url = f"http://127.0.0.1:{port}"
            decode(url, 4)  # warm-up
            pre = max(prefill(url, args.prompt_words) for _ in range(args.repeats))
            dec = max(decode(url, args.max_tokens) for _ in range(args.repeats))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        print(f"{name:<22} {pre:>14.1f} {dec:>13.1f}", flush=True)


if __name__ == "__main__":
    main()
