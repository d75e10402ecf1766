"""Long contexts in process: a cold prefill of P tokens and the decode step after it, on SmolLM2
loaded as ``mlxrt serve`` loads it (the BLAS activated, the mlxrt-qmv kernel and fused primitives
installed when present).

An agent client's first request is long (Claude Code's system prompt and tools are ~15-20k
tokens), so where a short prompt's step is all matrix products, a long one's is attention: each
decode step reads every cached key and value, and each prefill chunk computes its queries'
scores against all of them. For each P it prints the prefill time (chunks of 2048 tokens, only
the caches evaluated, as the engine prefills) and the median decode step over ``--steps``
pipelined steps (the next step built while this one runs, as the engine does).

    python benchmarks/long_context.py                       # P = 40, 1000, 4000
    python benchmarks/long_context.py --tokens 8000 --steps 20
    MLXRT_QMV=0 python benchmarks/long_context.py           # MLX's own ops, for comparison

Run it with another install's python (e.g. a checkout of an earlier commit) to compare builds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, action="append", help="context lengths (default 40, 1000, 4000)")
    ap.add_argument("--steps", type=int, default=40, help="decode steps timed after each prefill")
    ap.add_argument("--chunk", type=int, default=2048, help="prefill chunk (mlxrt serve's --prefill-step-size)")
    ap.add_argument("--model", help="an MLX model folder (default: the embedded SmolLM2)")
    args = ap.parse_args()

    from mlxrt.loading import blas

    status = blas.activate()
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load

    from mlxrt.engine import qmv

    if args.model:
        folder = args.model
    else:
        from mlxrt.loading.embedded import embedded_model_dir

        folder = str(embedded_model_dir())
    model, _ = load(folder)
    kernel = qmv.load()
    if kernel.active:
        qmv.install(model, kernel)
        qmv.install_fused(model, kernel)
    vocab = min(20000, getattr(getattr(model, "args", None), "vocab_size", 20000))
    print(f"BLAS: {status}; kernel: {kernel.text}; load average {os.getloadavg()[0]:.2f}")
    print("| context (tokens) | prefill (s) | prefill (tok/s) | decode step (ms) | decode (tok/s) |\n|---|--:|--:|--:|--:|")
    for n in args.tokens or [40, 1000, 4000]:
        cache = make_prompt_cache(model)
        tokens = [3 + (i * 7919) % (vocab - 3) for i in range(n)]
        t0 = time.perf_counter()
        for at in range(0, n, args.chunk):
            model(mx.array(tokens[at:at + args.chunk])[None], cache=cache)
            mx.eval([c.state for c in cache])
        prefill = time.perf_counter() - t0

        def step(t: mx.array, cache: list = cache) -> mx.array:
            return mx.argmax(model(t, cache=cache)[:, -1, :], axis=-1)[:, None]

        nxt = step(mx.array([[5]]))
        mx.async_eval(nxt)
        times = []
        for _ in range(args.steps):
            t1 = time.perf_counter()
            cur, nxt = nxt, step(nxt)
            mx.async_eval(nxt)
            cur.tolist()
            times.append(time.perf_counter() - t1)
        ms = 1000 * statistics.median(times[1:])
        print(f"| {n} | {prefill:.2f} | {n / prefill:.0f} | {ms:.1f} | {1000 / ms:.1f} |", flush=True)


if __name__ == "__main__":
    main()
