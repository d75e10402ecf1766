"""Speculative decoding and the prompt cache across restarts, measured side by side with mlx_lm.server.

Serves the embedded SmolLM2-135M-Instruct (Q4_1 GGUF, converted) and prints:

- **decode** tokens/s of a greedy completion, plain and with a draft model, for mlxrt and for
  mlx_lm.server (which takes the same ``--draft-model``/``--num-draft-tokens``). No smaller
  model with SmolLM2's tokenizer is available offline, so the drafts are made from SmolLM2
  itself: ``self`` (the model as its own draft: every draft is accepted, so this is the
  verification overhead at 100 % acceptance) and ``layers-K`` (its first K layers with its
  norm and head: a layer-skip draft, cheaper, accepted less often). Decode tokens/s is
  (completion tokens - 1) / (last text chunk - first text chunk) of a streamed greedy
  completion (tokens from the usage chunk; median of ``--repeats``), on prompts made unique so
  no prompt cache helps. mlxrt's acceptance (share of tokens that came from the draft) is read
  from ``/stats``.
- **TTFT** of a long prompt (``max_tokens=1``): cold, then after a restart with
  ``--prompt-cache-dir`` (restored from disk), then warm in memory; mlx_lm.server cold and
  warm (it has no cache on disk). Also the worker-side cost of persisting (host copy) and
  the writer thread's time, from ``/stats``.

    python benchmarks/speed_levers.py                       # everything (~6 min on 2 busy cores)
    python benchmarks/speed_levers.py --only ttft --prompt-words 600
    python benchmarks/speed_levers.py --only decode --dtype float32 --max-tokens 96
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from blas import BIN, free_port, start

STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


def layer_draft(model_dir: Path, layers: int, out: Path) -> Path:
    """SmolLM2's first ``layers`` layers, its final norm and head: a layer-skip draft model."""
    import mlx.core as mx

    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, out / name)
    config = json.loads((model_dir / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(config))
    weights = mx.load(str(model_dir / "model.safetensors"))
    keep = {k: v for k, v in weights.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    mx.save_safetensors(str(out / "model.safetensors"), keep, metadata={"format": "mlx"})
    return out


def complete(url: str, prompt: str, max_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    reply = httpx.post(f"{url}/v1/completions", timeout=900,
                       json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).json()
    if "usage" not in reply:
        raise RuntimeError(f"no usage in {reply}")
    return time.perf_counter() - t0, reply["usage"]["completion_tokens"]


def decode_rate(url: str, max_tokens: int, repeats: int) -> float:
    """Median over ``repeats`` of (completion tokens - 1) / (last text chunk - first text chunk)
    of a streamed greedy completion (token count from the usage chunk)."""
    rates = []
    for _ in range(repeats):
        body = {"prompt": f"[{uuid.uuid4().hex}] {STORY}", "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        times: list[float] = []
        tokens = 0
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=900) as reply:
            for line in reply.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if (chunk.get("choices") or [{}])[0].get("text"):
                    times.append(time.perf_counter())
        if tokens > 1 and len(times) > 1:
            rates.append((tokens - 1) / (times[-1] - times[0]))
    rates.sort()
    return rates[len(rates) // 2] if rates else float("nan")


def serve(cmd: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    return start(cmd, port), f"http://127.0.0.1:{port}"


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def run_decode(model_dir: Path, drafts: dict[str, Path], args: argparse.Namespace) -> None:
    mlxrt = [str(BIN / "mlxrt"), "serve", str(model_dir), "--prompt-cache-size", "0"]
    if args.dtype:
        mlxrt += ["--dtype", args.dtype]
    mlx_lm = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model_dir)]
    spec = ["--num-draft-tokens", str(args.num_draft_tokens)]
    rows = [("mlxrt", "none", mlxrt)] + [("mlxrt", d, [*mlxrt, "--draft-model", str(p), *spec])
                                         for d, p in drafts.items()]
    if not args.dtype:  # mlx_lm.server cannot cast: compared only on the checkpoint's own dtype
        rows += [("mlx_lm.server", "none", mlx_lm)] + [("mlx_lm.server", d, [*mlx_lm, "--draft-model", str(p), *spec])
                                                       for d, p in drafts.items()]
    print(f"\n## decode, greedy, {args.max_tokens} tokens, {args.num_draft_tokens} draft tokens per step, "
          f"weights {args.dtype or 'Q4_1'}")
    print(f"{'server':<14} {'draft':<10} {'decode tok/s':>13} {'acceptance':>11}")
    for server, draft, cmd in rows:
        if args.server and server not in args.server:
            continue
        proc, url = serve(cmd)
        try:
            complete(url, "warm up", 4)
            rate = decode_rate(url, args.max_tokens, args.repeats)
            accept = ""
            if server == "mlxrt" and draft != "none":
                stats = httpx.get(f"{url}/stats").json()["engine"]["speculative"]
                accept = f"{stats['acceptance']:.0%}"
        finally:
            stop(proc)
        print(f"{server:<14} {draft:<10} {rate:>13.1f} {accept:>11}", flush=True)


def long_prompt(words: int) -> str:
    return f"[{uuid.uuid4().hex}] " + " ".join(f"item {i}: the river bends east of the hill." for i in range(words // 8))


def ttft(url: str, prompt: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    reply = httpx.post(f"{url}/v1/completions", timeout=900,
                       json={"prompt": prompt, "max_tokens": 1, "temperature": 0}).json()
    details = reply["usage"].get("prompt_tokens_details") or {}
    return time.perf_counter() - t0, details.get("cached_tokens") or 0


def ttft_twice(cmd: list[str], prompt: str) -> tuple[tuple[float, int], tuple[float, int]]:
    """Start ``cmd``, send ``prompt`` twice (TTFT and cached tokens of each), stop it."""
    proc, url = serve(cmd)
    try:
        complete(url, "warm up", 2)
        return ttft(url, prompt), ttft(url, prompt)
    finally:
        stop(proc)


def run_ttft(model_dir: Path, args: argparse.Namespace) -> None:
    prompt = long_prompt(args.prompt_words)
    folder = Path(tempfile.mkdtemp(prefix="mlxrt-prompt-store-"))
    mlxrt = [str(BIN / "mlxrt"), "serve", str(model_dir), "--prompt-cache-dir", str(folder)]
    if args.dtype:
        mlxrt += ["--dtype", args.dtype]
    print(f"\n## TTFT, {args.prompt_words}-word prompt, max_tokens=1, weights {args.dtype or 'Q4_1'}")
    print(f"{'server':<14} {'case':<26} {'TTFT s':>8} {'cached tokens':>14} {'x cold':>7}")
    proc, url = serve(mlxrt)
    try:
        complete(url, "warm up", 2)
        cold, _ = ttft(url, prompt)
        time.sleep(1)
        disk = httpx.get(f"{url}/stats").json()["engine"]["prompt_cache"]["disk"]
    finally:
        stop(proc)
    print(f"{'mlxrt':<14} {'cold':<26} {cold:>8.3f} {0:>14} {1:>7.2f}", flush=True)
    (restored, hit), (warm, hit2) = ttft_twice(mlxrt, prompt)
    print(f"{'mlxrt':<14} {'after restart (from disk)':<26} {restored:>8.3f} {hit:>14} {restored / cold:>7.2f}")
    print(f"{'mlxrt':<14} {'warm (in memory)':<26} {warm:>8.3f} {hit2:>14} {warm / cold:>7.2f}")
    print(f"#   entries written: {disk['written']}, worker host copy {disk['copy_seconds'] * 1000:.1f} ms, "
          f"writer thread {disk['write_seconds'] * 1000:.1f} ms, {disk['bytes'] / 1e6:.1f} MB on disk")
    shutil.rmtree(folder, ignore_errors=True)
    if args.dtype:
        return
    lm_server = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model_dir)]
    (lm_cold, _), (lm_warm, lm_hit) = ttft_twice(lm_server, long_prompt(args.prompt_words))
    print(f"{'mlx_lm.server':<14} {'cold':<26} {lm_cold:>8.3f} {0:>14} {1:>7.2f}")
    print(f"{'mlx_lm.server':<14} {'warm (in memory)':<26} {lm_warm:>8.3f} {lm_hit:>14} {lm_warm / lm_cold:>7.2f}")
    print(f"{'mlx_lm.server':<14} {'after restart':<26} {'(no cache on disk: cold again)':>31}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["decode", "ttft"], action="append")
    parser.add_argument("--server", choices=["mlxrt", "mlx_lm.server"], action="append",
                        help="decode rows of this server only (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-draft-tokens", type=int, default=3)
    parser.add_argument("--draft-layers", type=int, default=8, help="layers of the layer-skip draft")
    parser.add_argument("--drafts", default="self,layers", help="which drafts: self, layers (comma-separated)")
    parser.add_argument("--prompt-words", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtype", choices=["float32"], default=None,
                        help="mlxrt casts the weights (the fast path with the system OpenBLAS); mlx_lm.server rows skipped")
    args = parser.parse_args()
    from mlxrt.loading.embedded import embedded_model_dir

    model_dir = Path(embedded_model_dir())
    version = subprocess.run([str(BIN / "mlxrt"), "--version"], capture_output=True, text=True).stdout.strip()
    print(f"# {version}; model {model_dir}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="mlxrt-drafts-") as tmp:
        drafts: dict[str, Path] = {}
        for name in args.drafts.split(","):
            if name == "self":
                drafts["self"] = model_dir
            elif name == "layers":
                drafts[f"layers-{args.draft_layers}"] = layer_draft(model_dir, args.draft_layers,
                                                                    Path(tmp) / "layers")
        if not args.only or "decode" in args.only:
            run_decode(model_dir, drafts, args)
        if not args.only or "ttft" in args.only:
            run_ttft(model_dir, args)


if __name__ == "__main__":
    main()
