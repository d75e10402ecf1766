"""A model's quantized products per step, by layer kind: each kind's products over every layer
(the tied head too) timed at 1 and 8 rows of ``x`` (a lone decode step, a batch of 8's), medians
of repeated calls, and their sum. The model is loaded as ``mlxrt serve`` loads it (the kernel and
its layouts installed), so ``MLXRT_QMV_BANDS=0``, ``MLXRT_QMV_EXACT`` or ``MLXRT_QMV_KERNEL`` set in
the environment compare the paths (docs/performance.md, "Weights in bands of 16 rows").

    python benchmarks/layer_products.py --model gemma-3-270m-q4_k_m.gguf
    MLXRT_QMV_BANDS=0 python benchmarks/layer_products.py --model gemma-3-270m-q4_k_m.gguf --rows 1,8,31
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="an MLX model folder or a .gguf file (default: the embedded SmolLM2 Q4_1)")
    ap.add_argument("--rows", default="1,8", help="rows of x, comma-separated")
    ap.add_argument("--calls", type=int, default=15)
    args = ap.parse_args()

    from mlxrt.loading.blas import activate

    activate([])
    from mlxrt.compat import lean_mlx_lm

    lean_mlx_lm()
    import mlx.core as mx
    import mlx.nn as nn

    from mlxrt.host import make_host
    from mlxrt.loading import load_weights
    from mlxrt.loading.resolve import read_model_info, resolve_model

    if args.model:
        source = resolve_model(args.model, allow_download=False)
    else:
        from mlxrt.loading.embedded import embedded_model_dir

        source = resolve_model(str(embedded_model_dir()), allow_download=False)
    loaded, _ = load_weights(read_model_info(source), make_host())
    kinds: dict[str, list] = defaultdict(list)  # "q_proj (5-bit)" -> its layers
    for name, layer in loaded.model.named_modules():
        if "scales" not in layer or getattr(layer, "bits", None) is None:
            continue
        if isinstance(layer, nn.QuantizedEmbedding):
            if not any(n.endswith("lm_head") for n, _ in loaded.model.named_modules()):
                kinds[f"head, tied ({layer.bits}-bit)"].append(layer.as_linear)
            continue
        kinds[f"{name.rsplit('.', 1)[-1]} ({layer.bits}-bit)"].append(layer)

    def width(fn) -> int:
        layer = getattr(fn, "__self__", fn)
        return layer["weight"].shape[1] * 32 // layer.bits

    def timed(fns, x) -> float:
        mx.eval([f(x) for f in fns])
        runs = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            mx.eval([f(x) for f in fns])
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs) * 1e3

    rows = [int(r) for r in args.rows.split(",")]
    print(f"model: {source.path}\n| products (layers) | " + " | ".join(f"{r} row{'s' if r > 1 else ''} (ms)" for r in rows)
          + " |\n|---|" + "--:|" * len(rows))
    totals = [0.0] * len(rows)
    for kind, fns in sorted(kinds.items()):
        cells = []
        for i, r in enumerate(rows):
            by_width = defaultdict(list)
            for f in fns:
                by_width[width(f)].append(f)
            ms = 0.0
            for k, group in by_width.items():
                x = mx.random.normal((r, 1, k))
                mx.eval(x)
                ms += timed(group, x)
            totals[i] += ms
            cells.append(f"{ms:.2f}")
        print(f"| {kind} ({len(fns)}) | " + " | ".join(cells) + " |")
    print("| **sum** | " + " | ".join(f"**{t:.2f}**" for t in totals) + " |")


if __name__ == "__main__":
    main()
