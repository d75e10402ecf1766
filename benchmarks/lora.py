"""LoRA benchmark: requests with different adapters sharing one decode batch, vs the serial lane,
vs one adapter for everyone, vs mlx_lm.server (which can serve one adapter, loaded at start).

Four random LoRA adapters in mlx-lm's format (`mlxrt.testing.write_random_adapter`: nothing
trained; rank 8 on q/v/down projections of every layer) are written for the checkpoint. The
same load is sent to each configuration: `--clients` concurrent clients sending non-streaming
chat completions back to back (temperature 0, fixed max_tokens), and the aggregate output tok/s
(usage.completion_tokens / wall clock) is printed as one markdown table:

  mixed, batch     mlxrt serve --batch N, request i uses adapter i mod 4 (rows of different
                   adapters share the batch: per-row LoRA)
  mixed, serial    mlxrt serve --batch 1, same requests (what a server without per-row LoRA
                   can do at best: one request at a time)
  one adapter      mlxrt serve --batch N, every request uses adapter a
  base             mlxrt serve --batch N, adapter "none"
  mlx_lm.server    python -m mlx_lm server --adapter-path a (every request gets adapter a)

    python benchmarks/lora.py                    # SmolLM2-135M (embedded), ~5 minutes
    python benchmarks/lora.py --tiny --quick     # random tiny llama, smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import _stop, first_completion, free_port, server_command

ADAPTERS = ("a", "b", "c", "d")


def _bodies(n: int, adapter_of, max_tokens: int) -> list[dict]:
    topics = ["the sea", "a lighthouse", "mountains", "a city at night", "the forest", "a train",
              "winter", "the desert"]
    out = []
    for i in range(n):
        body = {"messages": [{"role": "user", "content": f"Request {i}: write about {topics[i % len(topics)]}."}],
                "max_tokens": max_tokens, "temperature": 0.0}
        adapter = adapter_of(i)
        if adapter is not None:
            body["adapter"] = adapter
        out.append(body)
    return out


async def _load(url: str, bodies: list[dict], clients: int) -> tuple[float, int]:
    queue = list(reversed(bodies))
    tokens = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        while queue:
            resp = await client.post(f"{url}/v1/chat/completions", json=queue.pop())
            if resp.status_code != 200:
                raise RuntimeError(f"{resp.status_code}: {resp.text[:300]}")
            tokens += resp.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=clients + 2)) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        return time.perf_counter() - t0, tokens


def _serve(name: str, model: str, extra: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(server_command(name, model, port, extra), stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    first_completion(url, proc, time.perf_counter())
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a random tiny llama instead of SmolLM2")
    parser.add_argument("--model", help="another model folder (mlx-lm format)")
    parser.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, help="folder for the adapters, logs and results.json")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="mlxrt-lora-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    from mlxrt.testing import write_random_adapter, write_tiny_checkpoint

    if args.model:
        model = str(Path(args.model).resolve())
    elif args.tiny:
        model = str(write_tiny_checkpoint(out / "tiny-llama", "llama"))
    else:
        from mlxrt.loading.embedded import embedded_model_dir

        model = str(embedded_model_dir())
    dirs = {name: write_random_adapter(out / "adapters" / name, Path(model), seed=i, rank=8, scale=1.0, std=0.05)
            for i, name in enumerate(ADAPTERS)}
    n = args.clients * (1 if args.quick else 4)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    say(f"model {model}; {n} requests, {args.clients} clients, max_tokens {args.max_tokens}")

    scenarios = [  # (label, server, server args, adapter per request)
        ("mixed adapters, batch", "mlxrt", ["--batch", str(args.batch)], lambda i: ADAPTERS[i % 4]),
        ("one adapter, batch", "mlxrt", ["--batch", str(args.batch)], lambda i: "a"),
        ("base (adapter none), batch", "mlxrt", ["--batch", str(args.batch)], lambda i: "none"),
        ("mixed adapters, serial lane", "mlxrt", ["--batch", "1"], lambda i: ADAPTERS[i % 4]),
        ("one adapter (--adapter-path)", "mlx_lm.server", ["--adapter-path", str(dirs["a"])], lambda i: None),
    ]
    results: list[dict] = []
    running: tuple[str, tuple[str, ...], subprocess.Popen, str] | None = None
    try:
        for label, server, extra, adapter_of in scenarios:
            if running is None or running[:2] != (server, tuple(extra)):
                if running is not None:
                    _stop(running[2])
                proc, url = _serve(server, model, extra, out / f"{server}-{len(results)}.log")
                if server == "mlxrt":
                    for name, path in dirs.items():
                        r = httpx.post(f"{url}/v1/adapters", json={"id": name, "path": str(path)}, timeout=120)
                        r.raise_for_status()
                running = (server, tuple(extra), proc, url)
            url = running[3]
            asyncio.run(_load(url, _bodies(args.clients, adapter_of, 4), args.clients))  # warm-up
            wall, tokens = asyncio.run(_load(url, _bodies(n, adapter_of, args.max_tokens), args.clients))
            row = {"scenario": label, "server": server, "args": " ".join(extra), "tokens": tokens,
                   "wall_s": round(wall, 2), "tok_s": round(tokens / wall, 1)}
            say(json.dumps(row))
            results.append(row)
    finally:
        if running is not None:
            _stop(running[2])
    mixed = results[0]["tok_s"]
    table = ["| scenario | server | args | output tok/s | mixed batch / this |", "|---|---|---|---:|---:|"]
    table += [f'| {r["scenario"]} | {r["server"]} | {r["args"].replace(str(out), "…") or "-"} | {r["tok_s"]:.1f} '
              f'| {mixed / r["tok_s"]:.2f}x |' for r in results]
    (out / "results.json").write_text(json.dumps({"model": model, "requests": n, "clients": args.clients,
                                                  "max_tokens": args.max_tokens, "results": results}, indent=2))
    print("\n".join(table))
    print(f"\nload average: {' '.join(Path('/proc/loadavg').read_text().split()[:3]) if Path('/proc/loadavg').exists() else 'n/a'}")
    print(f"\nresults: {out / 'results.json'}")


if __name__ == "__main__":
    main()
