"""A lone row of x against 5-bit weights and the same integers widened to 8 bits, per product.

A GGUF's Q5_0 layers (Gemma 3 270M Q4_K_M: q, k, gate and up, hidden size 640) reach the
mlxrt-qmv kernel at 5 bits or widened to 8 (``mlxrt.loading.gguf_quant.served_layout``). For each
shape, one row of x against ``--copies``-many distinct matrices (together ~160 MB, so that they come
from DRAM as in a decode step), float16 scales and the centre 16 as ``install()`` leaves a Q5_0
layer; a round evaluates every copy's product in one ``mx.eval``; the figure is µs a product, the
least and the median of ``--reps`` rounds. Each build runs in its own process; with ``--baseline
DIR`` (a directory holding another build of ``mlxrt_qmv``) the two take turns for ``--rounds``.

    python benchmarks/qmv_packed.py
    python benchmarks/qmv_packed.py --baseline /tmp/qmv_before --rounds 2

On a shared machine read the least figures, and compare only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SHAPES = [(2048, 640), (640, 2048), (1024, 640), (256, 640)]

_CHILD = r"""
import json, sys, time
import numpy as np, mlx.core as mx, mlxrt_qmv as q
from mlxrt.loading.gguf_quant import pack
shapes, reps = json.loads(sys.argv[1])
rng = np.random.default_rng(0)
res = {"kernel": q.kernel_name(), "fast_bits": list(getattr(q, "FAST_BITS", ()))}  # API < 8: none
for n, k in shapes:
    qi = np.clip(np.rint(16 + rng.standard_normal((n, k)) * 5), 0, 31).astype(np.uint8)
    d = (rng.random((n, k // 32)) * 0.02 + 0.002).astype(np.float16)
    count = max(8, (160 << 20) // (n * k))
    mats = {bits: [(mx.array(pack(qi, bits)), mx.array(d), mx.array(d * np.float16(-16))) for _ in range(count)]
            for bits in (5, 8)}
    mx.eval(mats)
    x = mx.random.normal((1, k))
    times = {5: [], 8: []}
    for r in range(reps + 1):
        for bits in (5, 8):
            outs = [q.quantized_matmul(x, w, s, b, 32, bits, 16.0) for w, s, b in mats[bits]]
            t = time.perf_counter()
            mx.eval(outs)
            if r:  # the first is a warm-up
                times[bits].append((time.perf_counter() - t) / count * 1e6)
    for bits in (5, 8):
        res[f"{n}x{k} {bits}-bit"] = [round(min(times[bits]), 1), round(float(np.median(times[bits])), 1)]
    del mats
print(json.dumps(res))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="a directory with another build of mlxrt_qmv, taking turns with this one")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--reps", type=int, default=25, help="rounds of every copy's products a process")
    args = ap.parse_args()
    sides = {"this": os.environ.get("PYTHONPATH", "")}
    if args.baseline:
        sides["baseline"] = os.pathsep.join(p for p in (args.baseline, sides["this"]) if p)
    print(f"load average {os.getloadavg()[0]:.2f}")
    for _ in range(args.rounds):
        for side, path in sides.items():
            env = {**os.environ, "PYTHONPATH": path, "MLXRT_QMV_EXACT": "0"}
            out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([SHAPES, args.reps])], env=env,
                                 capture_output=True, text=True, check=True).stdout
            print(side, out.strip())


if __name__ == "__main__":
    main()
