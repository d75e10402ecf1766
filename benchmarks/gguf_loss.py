"""What converting a GGUF into MLX layouts loses, per ggml type (the figures of docs/models.md).

For each FILE: the weight error of every quantized tensor once converted (``mx.dequantize`` of the
MLX layout against gguf's own dequantization; max absolute and RMS relative to the weights' RMS),
by ggml type, optionally at other bit widths (``--bits 5,6,8``: what the re-quantized types would
lose there), and with ``--perplexity`` the perplexity of the converted model against the same model
with every weight dequantized to float32, on the first 1,200 characters of docs/architecture.md.

    python benchmarks/gguf_loss.py pure-Q6_K.gguf --bits 5,6,8
    python benchmarks/gguf_loss.py pure-Q2_K.gguf --perplexity --as Q2_K=5
"""

from __future__ import annotations

import argparse
import math
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

TEXT = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def weight_errors(path: Path, widths: list[int] | None) -> dict[tuple[str, int], dict[str, float]]:
    import mlx.core as mx
    import numpy as np

    from mlxrt.loading import gguf_quant as gq
    from mlxrt.loading.gguf_format import read_gguf

    g = read_gguf(path)
    acc: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for name, t in g.tensors.items():
        if t.type in ("F32", "F16", "BF16") or len(t.shape) < 2:
            continue
        raw, base = g.raw(name), gq.LAYOUTS[t.type]
        want = gq._dequantize(t.type, raw, t.shape[-1]).astype(np.float64)
        for bits in widths or [base.bits]:
            gq.LAYOUTS[t.type] = gq.Layout(bits, base.lossless and bits == base.bits)
            try:
                o = gq.mlx_tensor(name, t.type, raw, t.shape, mx.float32)
            finally:
                gq.LAYOUTS[t.type] = base
            got = np.array(mx.dequantize(o["weight"], o["scales"], o["biases"], group_size=32, bits=bits))
            err = got.reshape(want.shape) - want
            a = acc[(t.type, bits)]
            a[0] = max(a[0], float(np.abs(err).max()))
            a[1] += float((err ** 2).sum())
            a[2] += float((want ** 2).sum())
            a[3] += err.size
    return {k: {"max": v[0], "rel_rms": math.sqrt(v[1] / v[2]), "weights": v[3]} for k, v in acc.items()}


def perplexity(folder: Path) -> float:
    import mlx.core as mx
    from mlx_lm import load

    model, tok = load(str(folder))
    ids = mx.array([tok.encode(TEXT.read_text()[:1200])])
    logits = model(ids[:, :-1]).astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return math.exp(-mx.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean().item())


def perplexity_change(path: Path) -> tuple[float, float]:
    from mlxrt.loading import gguf_quant as gq
    from mlxrt.loading.gguf import convert_gguf

    with tempfile.TemporaryDirectory() as tmp:
        ours = perplexity(convert_gguf(path, Path(tmp) / "mlx", dtype="float32"))
        saved = dict(gq.LAYOUTS)
        gq.LAYOUTS.update({k: gq.Layout(None, True) for k in gq.LAYOUTS})  # every weight dequantized
        try:
            exact = perplexity(convert_gguf(path, Path(tmp) / "float", dtype="float32"))
        finally:
            gq.LAYOUTS.update(saved)
    shutil.rmtree(tmp, ignore_errors=True)
    return ours, exact


def main() -> None:
    from mlxrt.loading import gguf_quant as gq

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--bits", help="bit widths to measure every quantized type at (default: its own)")
    ap.add_argument("--perplexity", action="store_true")
    ap.add_argument("--as", dest="overrides", action="append", default=[], metavar="TYPE=BITS",
                    help="convert TYPE at BITS instead (re-quantized), e.g. Q2_K=5")
    args = ap.parse_args()
    for o in args.overrides:
        t, _, b = o.partition("=")
        gq.LAYOUTS[t] = gq.Layout(int(b), False)
    widths = [int(b) for b in args.bits.split(",")] if args.bits else None
    for path in args.files:
        for (t, bits), e in sorted(weight_errors(path, widths).items()):
            print(f"{path.name}: {t} as {bits}-bit: max {e['max']:.3g}, relative RMS {e['rel_rms']:.3g} "
                  f"({e['weights']:.0f} weights)")
        if args.perplexity:
            ours, exact = perplexity_change(path)
            print(f"{path.name}: perplexity {ours:.4f} converted, {exact:.4f} dequantized: "
                  f"{100 * (ours / exact - 1):+.3f} %")


if __name__ == "__main__":
    main()
