"""Each quantized product's error on a real model: the mlxrt-qmv kernel's output against float32,
beside the least any rounding of ``x`` to 8 bits per block of 32 must lose (``w . x_rounded``).

The model (an MLX folder, a ``.gguf`` file converted as ``mlxrt serve`` converts it, or the
embedded SmolLM2 by default) is loaded with the kernel and fused primitives installed, one
prompt is fed through it, and every call of the kernel's product is checked: the dequantized
weights times ``x`` in float64 (the reference), times ``x`` rounded as the 8-bit kernels round it
(the ideal), and the kernel's own output. Per layer name (and served width), the relative RMS
error of each over the prompt's calls and their ratio: a product far above its ideal is a bug
in that layout's loop (how Gemma 3's widened Q5_0 layers were found: ratio ~18 with mlxrt-qmv
0.5.0, 1.00 since 0.5.1). The kernel runs in this process as chosen at load, so
``MLXRT_QMV_EXACT`` / ``MLXRT_QMV_KERNEL`` pick the path (the exact path's ideal column is
still the 8-bit one).

    python benchmarks/qmv_products.py --model gemma-3-270m-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
from collections import defaultdict

PROMPT = "The largest planet in our solar system is Jupiter, and photosynthesis is the process by which plants"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="an MLX model folder or a .gguf file (default: the embedded SmolLM2 Q4_1)")
    ap.add_argument("--prompt", default=PROMPT)
    args = ap.parse_args()

    from mlxrt import blas

    blas.activate()
    import mlx.core as mx
    import numpy as np
    from mlx_lm.utils import load

    from mlxrt.engine import qmv
    from mlxrt.loading.resolve import resolve_model

    st = qmv.load()
    if not st.active:
        raise SystemExit(f"the kernel is not active: {st.reason}")
    model, tokenizer = load(str(resolve_model(args.model).path))
    ext = st.module
    names: dict[int, str] = {}
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])  # kernel², ideal², reference², calls
    product = ext.quantized_matmul

    def checked(x, w, scales, biases, gs, bits):
        y = product(x, w, scales, biases, gs, bits)
        xf = np.array(x.astype(mx.float32), dtype=np.float64).reshape(-1, x.shape[-1])
        dq = np.array(mx.dequantize(w, scales.astype(mx.float32), biases.astype(mx.float32), group_size=gs,
                                    bits=bits), dtype=np.float64)
        blocks = xf.reshape(xf.shape[0], -1, 32)
        top = np.abs(blocks).max(axis=-1, keepdims=True)
        rounded = (np.rint(blocks / np.where(top > 0, top, 1) * 127) * top / 127).reshape(xf.shape)
        ref = xf @ dq.T
        s = sums[names.get(id(w), "?")]
        s[0] += float(((np.array(y.astype(mx.float32), dtype=np.float64).reshape(ref.shape) - ref) ** 2).sum())
        s[1] += float(((rounded @ dq.T - ref) ** 2).sum())
        s[2] += float((ref ** 2).sum())
        s[3] += 1
        return y

    ext.quantized_matmul = checked  # before install: the kernel's layers look it up once, then
    qmv.install(model, st)
    qmv.install_fused(model, st)
    for name, module in model.named_modules():
        if "weight" in module and hasattr(module, "bits"):
            names[id(module["weight"])] = f"{name.rsplit('.', 1)[-1]} ({module.bits}-bit)"
    mx.eval(model(mx.array(tokenizer.encode(args.prompt))[None]))
    print(f"kernel: {st.text}")
    print("| layers | calls | kernel rel. RMS error | ideal 8-bit | ratio |")
    print("|---|--:|--:|--:|--:|")
    for name, (err, ideal, ref, calls) in sorted(sums.items()):
        print(f"| {name} | {calls} | {(err / ref) ** 0.5:.5f} | {(ideal / ref) ** 0.5:.5f} | {(err / ideal) ** 0.5:.2f} |")


if __name__ == "__main__":
    main()
