"""The mlxrt-qmv kernels side by side on one model step's quantized products, interleaved.

A "step" is every quantized product of one forward pass of SmolLM2-135M (30 layers of q/k/v/o,
gate/up/down at 4 bits, group size 32, and the 49152x576 tied head at 8 bits: 211 products,
~116 MB of weights, so they come from DRAM as in a decode step), for ``--rows`` rows of x each
(1: a lone decode step; 8: a batch's; 32 or more: a prefill chunk). Each kernel runs in its own
process (the kernel is chosen once, at load, from ``MLXRT_QMV_KERNEL`` / ``MLXRT_QMV_EXACT``);
the processes take turns for ``--rounds`` rounds and the script prints, per kernel and row
count, the median wall time of a step and the process's CPU time per step (all threads). With
``--blas`` it adds the float path a long prefill took before mlxrt-qmv 0.5: the kernel's
dequantize and a float32 matmul through the BLAS mlxrt loads.

    python benchmarks/qmv_kernels.py                                  # rows 1 and 8, every kernel
    python benchmarks/qmv_kernels.py --rows 1 --rows 8 --rows 128 --blas
    python benchmarks/qmv_kernels.py --kernel "avx512 vnni" --kernel "avx2 int8" --threads 1

On a shared machine read the CPU column and the ratios; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

#: (out, in, bits, count): SmolLM2-135M's quantized matrices in one forward pass.
STEP = [(576, 576, 4, 60), (192, 576, 4, 60), (1536, 576, 4, 60), (576, 1536, 4, 30), (49152, 576, 8, 1)]

#: name -> environment: the default kernel of this CPU, the others forced.
KERNELS = {
    "default": {},
    "avx512 vnni": {"MLXRT_QMV_KERNEL": "avx512 vnni"},
    "avx2 int8": {"MLXRT_QMV_KERNEL": "avx2 int8"},
    "avx2 q15": {"MLXRT_QMV_KERNEL": "avx2 q15"},
    "exact": {"MLXRT_QMV_EXACT": "1"},
    "portable int8": {"MLXRT_QMV_KERNEL": "portable"},
}

_CHILD = r"""
import json, os, resource, sys, time
from mlxrt.loading import blas
blas.activate()
import mlx.core as mx
import mlxrt_qmv as q
step, rows_list, reps, use_blas = json.loads(sys.argv[1])
mx.random.seed(0)
mats = []
for out, inn, bits, count in step:
    base = mx.random.normal((out, inn)) / inn ** 0.5
    for i in range(count):
        w, s, b = mx.quantize(base * (1 + i * 1e-3), group_size=32, bits=bits)
        mats.append((w, s, b, bits))
mx.eval([m[:3] for m in mats])
res = {"kernel": q.kernel_name(), "max_rows": q.MAX_ROWS}
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
for rows in rows_list:
    xs = {inn: mx.random.normal((rows, inn)) for inn in {m[0].shape[1] * 32 // m[3] for m in mats}}
    mx.eval(list(xs.values()))
    if use_blas or rows > q.MAX_ROWS:  # past the kernel's rows mlxrt multiplies dequantized weights by the BLAS
        res[f"{rows} blas"] = True
        fn = lambda w, s, b, bits: xs[w.shape[1] * 32 // bits] @ q.dequantize(w, s, b, 32, bits).T
    else:
        fn = lambda w, s, b, bits: q.quantized_matmul(xs[w.shape[1] * 32 // bits], w, s, b, 32, bits)
    walls, cpus = [], []
    for r in range(reps + 1):
        t, c = time.perf_counter(), cpu()
        for m in mats:
            mx.eval(fn(*m))
        if r:  # the first is a warm-up
            walls.append(time.perf_counter() - t)
            cpus.append(cpu() - c)
    res[str(rows)] = [min(walls), min(cpus)]
print(json.dumps(res))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, action="append", default=[], help="rows of x (repeatable; default 1 and 8)")
    ap.add_argument("--kernel", action="append", default=[], help=f"kernels (repeatable; default all of {list(KERNELS)})")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median printed)")
    ap.add_argument("--reps", type=int, default=3, help="steps a round per process (its best)")
    ap.add_argument("--threads", type=int, default=0, help="MLXRT_QMV_THREADS (default: the kernel's)")
    ap.add_argument("--blas", action="store_true", help="also dequantize + float32 matmul through the BLAS")
    args = ap.parse_args()
    rows = args.rows or [1, 8]
    names = args.kernel or list(KERNELS)
    runs: list[tuple[str, dict[str, str], bool]] = [(n, KERNELS.get(n, {"MLXRT_QMV_KERNEL": n}), False) for n in names]
    if args.blas:
        runs.append(("dequantize + BLAS", {}, True))
    print(f"load average {os.getloadavg()[0]:.2f}; rows {rows}; {args.rounds} rounds x best of {args.reps}", flush=True)
    got: dict[str, list[dict]] = {n: [] for n, _, _ in runs}
    for _ in range(args.rounds):
        for name, env, use_blas in runs:
            full = {**os.environ, **env}
            if args.threads:
                full["MLXRT_QMV_THREADS"] = str(args.threads)
            out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([STEP, rows, args.reps, use_blas])],
                                 env=full, capture_output=True, text=True, timeout=900)
            if out.returncode:
                sys.exit(out.stderr[-2000:])
            got[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'path':<20} {'kernel':<14} " + " ".join(f"{f'rows {r}: wall / CPU ms':>26}" for r in rows))
    for name, _, _ in runs:
        cells = []
        for r in rows:
            wall = statistics.median(g[str(r)][0] for g in got[name]) * 1e3
            cpu = statistics.median(g[str(r)][1] for g in got[name]) * 1e3
            mark = "*" if got[name][0].get(f"{r} blas") and not name.startswith("dequantize") else " "
            cells.append(f"{wall:>11.2f}{mark} / {cpu:>10.2f}")
        print(f"{name:<20} {got[name][0]['kernel']:<14} " + " ".join(f"{c:>26}" for c in cells))
    print("* past the kernel's MAX_ROWS: dequantize + BLAS, as mlxrt serves it")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
