"""mlxrt and llama-server on the same GGUF: greedy ``/v1/completions`` agreement and decode speed.

Each server is started in turn on FILE (mlxrt converts it once, then serves; llama-server with
``-t 2 -c 2048``), asked the same prompts greedily for ``--tokens`` tokens, then one longer
completion (128 tokens, ``ignore_eos``) for the decode speed. The report counts, per prompt, how
many leading generated tokens are the same (tokenized with the GGUF's own tokenizer).

    python benchmarks/gguf_agreement.py FILE.gguf --llama-server /path/to/llama-server
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "Water boils at a temperature of",
           "import numpy as np\n\n# compute the mean of", "The largest planet in our solar system is",
           "In 1492, Christopher Columbus", "Photosynthesis is the process by which", "The quick brown fox"]


def _post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read())


def _wait(port: int, proc: subprocess.Popen, limit: float = 900) -> float:
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return time.time() - t0
        except OSError:
            time.sleep(1)
    raise SystemExit("server did not start")


def run(cmd: list[str], port: int, tokens: int, log: Path) -> dict:
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready = _wait(port, proc)
        _post(port, {"prompt": "Hello", "max_tokens": 2, "temperature": 0})  # warm-up
        texts = {p: _post(port, {"prompt": p, "max_tokens": tokens, "temperature": 0})["choices"][0]["text"]
                 for p in PROMPTS}
        t0 = time.time()
        r = _post(port, {"prompt": "Write a long story about a dragon.", "max_tokens": 128, "temperature": 0,
                         "ignore_eos": True})
        wall = time.time() - t0
        timings = r.get("timings") or {}
        return {"ready_s": ready, "texts": texts, "decode_tokens": r["usage"]["completion_tokens"], "wall_s": wall,
                "predicted_per_second": timings.get("predicted_per_second")}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--llama-server", required=True, metavar="PATH")
    ap.add_argument("--mlxrt", default=str(Path(sys.executable).parent / "mlxrt"))
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens per prompt (default 16)")
    ap.add_argument("--json", type=Path, help="write the raw results here")
    args = ap.parse_args()

    from mlxrt.loading.gguf_format import read_gguf
    from mlxrt.loading.gguf_tokenizer import build_tokenizer

    res = {"mlxrt": run([args.mlxrt, "serve", str(args.gguf), "--port", "18431"], 18431, args.tokens,
                        Path("/tmp/gguf_agreement_mlxrt.log")),
           "llama-server": run([args.llama_server, "-m", str(args.gguf), "--port", "18432", "-t", "2", "-c", "2048"],
                               18432, args.tokens, Path("/tmp/gguf_agreement_llama.log"))}
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, ensure_ascii=False))
    tok = build_tokenizer(read_gguf(args.gguf).metadata)
    same = []
    for p in PROMPTS:
        start = len(tok.encode(p, add_special_tokens=False).ids)
        a, b = (tok.encode(p + res[k]["texts"][p], add_special_tokens=False).ids[start:] for k in res)
        n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        same.append(n)
        print(f"{n:>3}/{len(b)} same  {p!r}\n      mlxrt: {res['mlxrt']['texts'][p]!r}\n"
              f"      llama: {res['llama-server']['texts'][p]!r}")
    print(f"leading tokens the same, per prompt: {same}; all {args.tokens}: "
          f"{sum(n >= args.tokens for n in same)}/{len(same)}; first 8: {sum(n >= 8 for n in same)}/{len(same)}")
    for name, r in res.items():
        print(f"{name:>12}: ready {r['ready_s']:.1f} s; 128-token decode {r['decode_tokens'] / r['wall_s']:.2f} tok/s "
              f"wall, {r['predicted_per_second'] or 0:.2f} tok/s by its timings")


if __name__ == "__main__":
    main()
