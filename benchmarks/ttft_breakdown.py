"""Where a short prompt's time to first token goes, in process: SmolLM2 (or ``--model DIR``)
loaded as ``mlxrt serve`` loads it (the BLAS activated, ``mlxrt.engine.qmv.install`` and
``install_fused``), then a prompt of ``--tokens`` (default 32, the serving benchmark's templated
prompt) prefilled as the batch lane does it: all tokens but the last as one chunk, then one
decode step for the last and its sample.

Prints, each the minimum of ``--runs`` (default 9): the prefill chunk, and within it the model's
quantized products alone (each layer on random rows of the chunk's size), its ``swiglu`` and its
attention (30 calls each at the chunk's shape, through the functions mlx-lm's llama module calls),
the rest by difference; then the first decode step.

``--rows 40 48 56 64``: instead, every quantized layer's product at those row counts through the
kernel (in pieces of ``MAX_ROWS``) and through dequantize + BLAS (where ``KERNEL_ROWS`` comes from).

    python benchmarks/ttft_breakdown.py
    python benchmarks/ttft_breakdown.py --rows 33 48 56 64 96 128

Timings on shared cores are noisy: compare builds in interleaved runs and report the load.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path.home() / ".cache/mlxrt/models/SmolLM2-135M-Instruct-Q4_1"))
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--rows", type=int, nargs="*", help="compare kernel pieces with dequantize + BLAS instead")
    args = ap.parse_args()

    from mlxrt.loading import blas

    print("BLAS:", blas.activate())
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import llama
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load

    from mlxrt.engine import qmv

    model, _tok = load(args.model)
    print("kernel:", qmv.status().text, "| layers:", qmv.install(model), "quantized,", qmv.install_fused(model), "fused")
    layers = [layer for _, layer in model.named_modules() if isinstance(layer, nn.QuantizedLinear)]

    def width(layer: nn.Module) -> int:
        return layer["weight"].shape[1] * 32 // layer.bits

    def best(f) -> float:
        f()
        return min(f() for _ in range(args.runs))

    def timed(outputs) -> float:
        t0 = time.perf_counter()
        mx.eval(outputs())
        return time.perf_counter() - t0

    if args.rows:
        ext = qmv.status().module
        for rows in args.rows:
            xs = {k: mx.random.normal((rows, k)) for k in {width(layer) for layer in layers}}
            mx.eval(list(xs.values()))

            def pieces(layer, x):
                return mx.concatenate([ext.quantized_matmul(x[i:i + ext.MAX_ROWS], layer["weight"], layer["scales"],
                                                            layer["biases"], layer.group_size, layer.bits)
                                       for i in range(0, x.shape[0], ext.MAX_ROWS)])

            def blas_way(layer, x):
                return x @ ext.dequantize(layer["weight"], layer["scales"], layer["biases"], layer.group_size,
                                          layer.bits).T

            def every(way, xs=xs):
                return lambda: timed(lambda: [way(layer, xs[width(layer)]) for layer in layers])

            k, b = best(every(pieces)), best(every(blas_way))
            print(f"{rows} rows, {len(layers)} products: kernel in pieces {1e3 * k:.1f} ms, dequantize + BLAS "
                  f"{1e3 * b:.1f} ms  load {os.getloadavg()[0]:.2f}")
        return

    ids = mx.array(list(range(1000, 1000 + args.tokens)))
    chunk = args.tokens - 1

    def prefill() -> tuple[float, float]:
        cache = make_prompt_cache(model)
        t0 = time.perf_counter()
        model(ids[None, :-1], cache=cache)
        mx.eval([c.state for c in cache])
        t1 = time.perf_counter()
        mx.eval(mx.argmax(model(ids[None, -1:], cache=cache)[:, -1, :], -1))
        return t1 - t0, time.perf_counter() - t1

    prefill()
    runs = [prefill() for _ in range(args.runs)]
    full, step = min(a for a, _ in runs), min(b for _, b in runs)
    xs = {k: mx.random.normal((1, chunk, k)) for k in {width(layer) for layer in layers}}
    args_ = model.args
    inter = getattr(args_, "intermediate_size", 4 * args_.hidden_size)
    heads, kv = args_.num_attention_heads, args_.num_key_value_heads
    dim = args_.hidden_size // heads
    gates = [mx.random.normal((1, chunk, inter)) for _ in range(len(model.layers))]
    qs = [mx.random.normal((1, heads, chunk, dim)) for _ in model.layers]
    ks = [mx.random.normal((1, kv, chunk, dim)) for _ in model.layers]
    mx.eval(list(xs.values()), gates, qs, ks)
    products = best(lambda: timed(lambda: [layer(xs[width(layer)]) for layer in layers]))
    swiglu = best(lambda: timed(lambda: [llama.swiglu(g, g) for g in gates]))
    attention = best(lambda: timed(lambda: [llama.scaled_dot_product_attention(q, k, k, None, dim ** -0.5, "causal")
                                            for q, k in zip(qs, ks, strict=True)]))
    n = len(model.layers)
    print(f"prefill of {chunk} rows {1e3 * full:.1f} ms: {len(layers)} products {1e3 * products:.1f}, swiglu x{n} "
          f"{1e3 * swiglu:.1f}, attention x{n} {1e3 * attention:.1f}, rest {1e3 * (full - products - swiglu - attention):.1f}; "
          f"first decode step {1e3 * step:.1f} ms  load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
