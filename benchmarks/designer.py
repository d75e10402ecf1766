"""The curve designer's endpoint on the embedded SmolLM2-135M-Instruct: wall time of one
``POST /v1/curves/sample`` (one prefill shared by 2·n completions) against the same 2·n
completions as separate ``/v1/chat/completions`` requests, sent one after another.

    python benchmarks/designer.py                 # n 4, max_tokens 8, one run
    python benchmarks/designer.py --n 8 --max-tokens 16 --repeats 3

Measured 2026-12-03 on the shared 2-core dev machine under load (load average ~8), n 4, max_tokens 8:
62.0 s for the designer call vs 124.8 s for the 8 chat requests (64 tokens each way); the designer
prefills the prompt once where the chat requests prefill it 8 times. Absolute figures there are
dominated by the machine's load; rerun on a quiet machine for real ones.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

CURVE = {"points": [{"x_pct": 0.01, "y_pct": 0.0001}, {"x_pct": 1, "y_pct": 0.5}, {"x_pct": 100, "y_pct": 100}]}
PROMPT = "Write one sentence about the sea."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1, help="best of this many runs")
    args = parser.parse_args()
    os.environ.setdefault("MLXRT_HOME", os.path.join(tempfile.gettempdir(), "mlxrt-bench-home"))

    from litestar.testing import TestClient

    from mlxrt.cli import build_server
    from mlxrt.host import make_host

    host = make_host()
    app = build_server(host, None, {"host": "127.0.0.1", "port": 0, "prompt_cache_size": 0})
    body = {"prompt": PROMPT, "curve": CURVE, "n": args.n, "max_tokens": args.max_tokens,
            "recipe": {"temperature": 0.8, "top_p": 0.95}}
    try:
        with TestClient(app, timeout=600) as client:
            client.post("/v1/curves/sample", json={**body, "n": 1}).raise_for_status()  # warm up
            designer, chats = [], []
            for _ in range(args.repeats):
                t = time.perf_counter()
                out = client.post("/v1/curves/sample", json=body)
                out.raise_for_status()
                designer.append(time.perf_counter() - t)
                tokens = sum(s["tokens"] for side in ("curve", "recipe") for s in out.json()[side]["samples"])
                t, chat_tokens = time.perf_counter(), 0
                for i in range(2 * args.n):
                    extra = {"curve": CURVE} if i < args.n else {"temperature": 0.8, "top_p": 0.95}
                    resp = client.post("/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": PROMPT}], "max_tokens": args.max_tokens,
                        "seed": i, **extra})
                    resp.raise_for_status()
                    chat_tokens += resp.json()["usage"]["completion_tokens"]
                chats.append(time.perf_counter() - t)
    finally:
        app.state.models.stop()
    print(f"model {app.state.models.primary.model_id}; n={args.n} per side, max_tokens={args.max_tokens}, "
          f"best of {args.repeats}")
    print(f"POST /v1/curves/sample          {min(designer):7.2f} s  ({tokens} tokens generated in the last run)")
    print(f"{2 * args.n} x POST /v1/chat/completions {min(chats):7.2f} s  ({chat_tokens} tokens in the last run; "
          "sequential, prompt cache off)")


if __name__ == "__main__":
    main()
