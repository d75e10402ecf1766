"""The mlxrt-qmv kernel's cost a row of x on SmolLM2-135M's product shapes, by row count.

A prefill chunk or a batch's step multiplies several rows of x by each matrix; a well-blocked
product costs far less a row at 16 rows than at one (each weight block unpacked once, met by many
rows). For each shape (576->1536, 1536->576, 576->576, 576->192 at 4 bits, the tied 49152x576
head at 8 bits; several copies of each, so the weights come from beyond L2 as in a step) and each
row count, the process's CPU time a row of x (all threads), best of ``--reps``. Each side runs in
its own process; with ``--baseline DIR`` (a directory holding another build of ``mlxrt_qmv``, e.g.
``pip install --target DIR ./kernels/mlxrt-qmv`` from another commit) the two take turns for
``--rounds`` rounds and the table gives baseline > this one, the lesser of the rounds.

    python benchmarks/qmv_rows.py --kernel "avx512 vnni" --threads 1
    python benchmarks/qmv_rows.py --baseline /tmp/qmv_before --rounds 3

On a shared machine read the CPU column; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

#: (out, in, bits, copies)
SHAPES = [(1536, 576, 4, 8), (576, 1536, 4, 8), (576, 576, 4, 16), (192, 576, 4, 32), (49152, 576, 8, 1)]

_CHILD = r"""
import json, resource, sys, time
import mlx.core as mx
import mlxrt_qmv as q
shapes, rows_list, reps = json.loads(sys.argv[1])
mx.random.seed(0)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
res = {"kernel": q.kernel_name()}
for out, inn, bits, count in shapes:
    base = mx.random.normal((out, inn)) / inn ** 0.5
    mats = [mx.quantize(base * (1 + i * 1e-3), group_size=32, bits=bits) for i in range(count)]
    mx.eval(mats)
    for rows in rows_list:
        x = mx.random.normal((rows, inn))
        mx.eval(x)
        best = []
        for r in range(reps + 1):
            c = cpu()
            for w, s, b in mats:
                mx.eval(q.quantized_matmul(x, w, s, b, 32, bits))
            if r:  # the first is a warm-up
                best.append(cpu() - c)
        res[f"{out}x{inn} {rows}"] = min(best) / count / rows * 1e6
print(json.dumps(res))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, action="append", default=[], help="rows of x (repeatable; default 1-64)")
    ap.add_argument("--kernel", default="", help="MLXRT_QMV_KERNEL (default: this CPU's)")
    ap.add_argument("--threads", type=int, default=0, help="MLXRT_QMV_THREADS (default: the kernel's)")
    ap.add_argument("--baseline", help="a directory with another build of mlxrt_qmv, taking turns with this one")
    ap.add_argument("--rounds", type=int, default=1, help="rounds (the lesser of them printed)")
    ap.add_argument("--reps", type=int, default=5, help="passes a round per process (its best)")
    args = ap.parse_args()
    rows = args.rows or [1, 2, 4, 8, 16, 32, 64]
    env = dict(os.environ)
    if args.kernel:
        env["MLXRT_QMV_KERNEL"] = args.kernel
    if args.threads:
        env["MLXRT_QMV_THREADS"] = str(args.threads)
    sides = {"this": env}
    if args.baseline:
        sides = {"baseline": {**env, "PYTHONPATH": args.baseline}, **sides}
    got: dict[str, list[dict]] = {s: [] for s in sides}
    print(f"load average {os.getloadavg()[0]:.2f}; CPU us a row of x", flush=True)
    for _ in range(args.rounds):
        for side, e in sides.items():
            out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([SHAPES, rows, args.reps])], env=e,
                                 capture_output=True, text=True, timeout=900)
            if out.returncode:
                sys.exit(out.stderr[-2000:])
            got[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(" / ".join(f"{s}: {got[s][0]['kernel']}" for s in sides))
    print(f"{'shape':>10} " + " ".join(f"{f'M={m}':>15}" for m in rows))
    for out, inn, _, _ in SHAPES:
        cells = []
        for m in rows:
            vals = [min(g[f"{out}x{inn} {m}"] for g in got[s]) for s in sides]
            cells.append(" > ".join(f"{v:.1f}" for v in vals))
        print(f"{f'{out}x{inn}':>10} " + " ".join(f"{c:>15}" for c in cells))
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
