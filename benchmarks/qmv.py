"""Matrix-vector bandwidth on MLX's CPU backend: float32 matmul (through the BLAS mlxrt loads),
mx.quantized_matmul at 4 and 8 bits, and the mlxrt-qmv kernel at 4 and 8 bits.

For each shape (out × in) and path it prints the weight bytes one product reads (packed weights,
scales and biases; float32 for the float path), the median time of one product and GB/s =
bytes / time, and the process's CPU time per product (all its threads: on a loaded machine
wall time counts waiting for a core, CPU time does not). Each timed round evaluates one product against each of enough distinct weight
copies to fill ``--working-set`` MB (default 96, three times this machine's 32 MB L3), so the
weights come from DRAM as in a decode step, not from cache. Rows of x: ``--rows`` (default 1).

    python benchmarks/qmv.py                       # 1536x576 and SmolLM2's shapes, 1 row
    python benchmarks/qmv.py --rows 4 --rounds 9
    python benchmarks/qmv.py --threads 1           # the kernel on one thread (MLXRT_QMV_THREADS)
    python benchmarks/qmv.py --decode              # and SmolLM2 served: decode/prefill tok/s by path
    python benchmarks/qmv.py --decode-only --no-baseline --served-rounds 4   # served only, interleaved
    python benchmarks/qmv.py --identity            # SmolLM2's greedy completions by kernel, compared

Prints the BLAS, the kernel and the load average, since timings on shared cores are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

#: SmolLM2-135M's matrices (out, in): the 1536x576 the issue quotes (down_proj's transpose is
#: 576x1536), q/o_proj 576x576, k/v_proj 192x576, gate/up_proj 1536x576, the tied lm_head 49152x576.
SHAPES = [(1536, 576), (576, 1536), (576, 576), (192, 576), (49152, 576)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1, help="rows of x (1..8)")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds; the median is printed")
    ap.add_argument("--working-set", type=float, default=96, help="MB of distinct weights per round")
    ap.add_argument("--group-size", type=int, default=32, help="quantization group size (GGUF Q4_1/Q8_0: 32)")
    ap.add_argument("--threads", type=int, default=0, help="kernel threads (default: MLXRT_QMV_THREADS or all)")
    ap.add_argument("--shape", action="append", default=[], help="OUTxIN, repeatable (default: SmolLM2's)")
    ap.add_argument("--decode", action="store_true", help="then serve SmolLM2 each way and time decode/prefill")
    ap.add_argument("--decode-only", action="store_true", help="only the served SmolLM2 timings")
    ap.add_argument("--repeats", type=int, default=3, help="served timings: runs per server (median)")
    ap.add_argument("--served-rounds", type=int, default=2,
                    help="served timings: interleaved rounds, every configuration started once per round")
    ap.add_argument("--identity", action="store_true",
                    help="only: serve SmolLM2's stored weights through the int8 kernel, the float kernel and "
                         "MLX's own path and compare their greedy completions")
    ap.add_argument("--no-baseline", action="store_true",
                    help="served timings: leave out MLX's own quantized path (its prefill takes minutes)")
    args = ap.parse_args()
    if args.identity:
        greedy_identity()
        return
    if args.decode_only:
        serve_decode(args)
        return

    from mlxrt.loading import blas

    status = blas.activate()
    import mlx.core as mx

    from mlxrt.engine import qmv

    kernel = qmv.load()
    if kernel.module is not None and args.threads:
        kernel.module.set_threads(args.threads)
    print(f"BLAS: {status}; kernel: {kernel.text}; load average {os.getloadavg()[0]:.2f}")
    shapes = [tuple(map(int, s.lower().split("x"))) for s in args.shape] or SHAPES
    print("| shape (out×in) | rows | path | MB read | µs | GB/s | CPU µs |\n|---|---|---|---|---|---|---|")
    for n, k in shapes:
        for path in ("float32", "mx.quantized_matmul 4-bit", "mx.quantized_matmul 8-bit", "kernel 4-bit", "kernel 8-bit"):
            if path.startswith("kernel") and kernel.module is None:
                continue
            bits = 4 if "4-bit" in path else 8 if "8-bit" in path else 0
            us, cpu_us, nbytes = measure(mx, kernel.module, n, k, bits, path.startswith("kernel"), args)
            print(f"| {n}×{k} | {args.rows} | {path} | {nbytes / 1e6:.2f} | {us:.1f} | {nbytes / us / 1e3:.1f} "
                  f"| {cpu_us:.1f} |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    if args.decode:
        serve_decode(args)


#: Served configurations: name, extra ``mlxrt serve`` flags, extra environment.
SERVED = [
    ("defaults (--dtype auto)", [], {}),
    ("--dtype float32", ["--dtype", "float32"], {}),
    ("--dtype stored, kernel", ["--dtype", "stored"], {}),
    ("--dtype stored, no kernel (MLXRT_QMV=0)", ["--dtype", "stored"], {"MLXRT_QMV": "0"}),
]


def serve_decode(args: argparse.Namespace) -> None:
    """The embedded SmolLM2 served each way: the dtype /stats reports, decode tok/s (a streamed
    greedy completion of 64 tokens), the server's CPU ms per decoded token and prefill tok/s (a
    ~150-word prompt). ``--served-rounds`` interleaved rounds (every configuration once per round,
    in turn, so a burst of other load on shared cores hits all of them alike; run one after the
    other, a configuration's figure depends on when it ran), ``--repeats`` runs per server;
    medians, then each round's decode figures."""
    import httpx

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from blas import decode, prefill
    from serving import free_port, start_server

    mlxrt = os.path.join(os.path.dirname(sys.executable), "mlxrt")
    tick = os.sysconf("SC_CLK_TCK")

    def cpu_s(pid: int) -> float:  # the server's user + system CPU time, all threads
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    configs = [c for c in SERVED if not (args.no_baseline and c[2].get("MLXRT_QMV") == "0")]
    runs: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name, _f, _e in configs}
    served: dict[str, tuple[str, str]] = {}
    for rnd in range(args.served_rounds):
        for name, flags, env in configs:
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            port = free_port()
            try:
                proc = start_server([mlxrt, "serve", "--prompt-cache-size", "0", *flags], port, limit=300)
            finally:
                for k, v in saved.items():
                    os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
            try:
                url = f"http://127.0.0.1:{port}"
                dtype = httpx.get(f"{url}/stats", timeout=30).json()["dtype"]
                served[name] = (dtype["served"], dtype["reason"] if dtype["requested"] == "auto" else "")
                decode(url, 4)  # warm-up
                c0 = cpu_s(proc.pid)
                dec = statistics.median(decode(url, 64) for _ in range(args.repeats))
                cpu_ms = (cpu_s(proc.pid) - c0) * 1e3 / (args.repeats * 64)
                pre = statistics.median(prefill(url, 150) for _ in range(args.repeats))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            runs[name].append((dec, cpu_ms, pre, os.getloadavg()[0]))
            print(f"  round {rnd + 1}: {name}: decode {dec:.1f} tok/s, {cpu_ms:.1f} CPU ms/token, prefill {pre:.1f} "
                  f"tok/s, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    print("\n| configuration | served dtype | decode tok/s | CPU ms/token | prefill tok/s | decode by round | "
          "load avg | auto's reason |\n|---|---|---|---|---|---|---|---|")
    for name, got in runs.items():
        med = [statistics.median(r[i] for r in got) for i in range(4)]
        print(f"| {name} | {served[name][0]} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | "
              f"{', '.join(f'{r[0]:.1f}' for r in got)} | {med[3]:.1f} | {served[name][1]} |", flush=True)


#: Greedy-identity check: the kernel as each path (environment) and prompts to complete.
KERNELS = [("kernel (default)", {}), ("int8 kernel", {"MLXRT_QMV_KERNEL": "avx2 int8"}),
           ("float kernel", {"MLXRT_QMV_KERNEL": "avx2+fma"}), ("MLX's own", {"MLXRT_QMV": "0"})]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "List three prime numbers:", "Water boils at", "The quick brown fox"]


def greedy_identity(max_tokens: int = 64) -> None:
    """SmolLM2's stored 4/8-bit weights served (``--dtype stored``) through each path in KERNELS;
    greedy completions of PROMPTS (their texts) compared with the float kernel's (the one equal to
    MLX's products to rounding)."""
    import httpx

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from serving import free_port, start_server

    mlxrt = os.path.join(os.path.dirname(sys.executable), "mlxrt")
    answers: dict[str, list[str]] = {}
    for name, env in KERNELS:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        port = free_port()
        try:
            proc = start_server([mlxrt, "serve", "--prompt-cache-size", "0", "--dtype", "stored"], port, limit=300)
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        try:
            url = f"http://127.0.0.1:{port}"
            kernel = httpx.get(f"{url}/stats", timeout=30).json()["quantized_kernel"]["text"]
            answers[name] = []
            for prompt in PROMPTS:
                body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
                reply = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
                reply.raise_for_status()
                answers[name].append(reply.json()["choices"][0]["text"])
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        print(f"{name}: {kernel}", flush=True)
    ref = answers["float kernel"]
    print("\n| path | prompts with identical greedy tokens | first difference (prompt: character) |\n|---|---|---|")
    for name, got in answers.items():
        same = sum(a == b for a, b in zip(got, ref, strict=True))
        diffs = [f"{i}: {_first_difference(g, r)}" for i, (g, r) in enumerate(zip(got, ref, strict=True)) if g != r]
        print(f"| {name} | {same}/{len(ref)} ({max_tokens} tokens each) | {', '.join(diffs) or '—'} |")


def _first_difference(a: str, b: str) -> int:
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))


def measure(mx, module, n: int, k: int, bits: int, use_kernel: bool, args) -> tuple[float, float, int]:
    """Median wall µs and process CPU µs (all threads) of one product, and the bytes it reads."""
    gs = args.group_size
    w = mx.random.normal((n, k)) / k**0.5
    if bits:
        packed = mx.quantize(w, group_size=gs, bits=bits)
        nbytes = sum(a.nbytes for a in packed)
    else:
        nbytes = w.nbytes
    copies = max(1, int(args.working_set * 1e6 // nbytes))
    if bits:
        weights = [tuple(a + 0 for a in packed) for _ in range(copies)]
    else:
        weights = [w + 0 for _ in range(copies)]
    mx.eval(weights)
    x = mx.random.normal((args.rows, k))
    mx.eval(x)

    def one(wt):
        if not bits:
            return x @ wt.T
        if use_kernel:
            return module.quantized_matmul(x, *wt, gs, bits)
        return mx.quantized_matmul(x, *wt, transpose=True, group_size=gs, bits=bits)

    times, cpu = [], []
    for r in range(args.rounds + 1):
        c0, t0 = time.process_time(), time.perf_counter()
        mx.eval([one(wt) for wt in weights])
        if r:  # the first round warms up
            times.append((time.perf_counter() - t0) / copies)
            cpu.append((time.process_time() - c0) / copies)
    return statistics.median(times) * 1e6, statistics.median(cpu) * 1e6, nbytes


if __name__ == "__main__":
    main()
