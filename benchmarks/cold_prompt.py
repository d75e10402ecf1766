"""A cold long prompt's time to first token, one server at a time: mlxrt (this install's, or
another checkout's ``mlxrt``), or llama-server on the same GGUF.

Each prompt is ``benchmarks/serving.py``'s cold prompt (a system message of varied notes, then
a question), asked for 1 token, so its TTFT is the prefill. Two prompts a length, different
texts, so neither reuses the other's cache.

    python benchmarks/cold_prompt.py                                   # this install's mlxrt
    python benchmarks/cold_prompt.py --mlxrt /path/to/main/.venv/bin/mlxrt
    python benchmarks/cold_prompt.py --llama-server /path/to/llama-server --tokens 3000
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serving


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, action="append", help="prompt lengths (default 335, 1000, 3000)")
    ap.add_argument("--mlxrt", default=str(Path(sys.executable).parent / "mlxrt"), help="the mlxrt to serve with")
    ap.add_argument("--llama-server", metavar="PATH", help="serve with llama-server instead (-t 2 -np 8 -c 65536)")
    args = ap.parse_args()

    from mlxrt.loading.embedded import embedded_gguf_path, embedded_model_dir

    folder = str(embedded_model_dir())
    prompts = serving.Prompts(folder)
    port = serving.free_port()
    url = f"http://127.0.0.1:{port}"
    if args.llama_server:
        cmd = [args.llama_server, "-m", str(embedded_gguf_path()), "-t", str(serving.LLAMA_THREADS), "-np",
               str(serving.LLAMA_SLOTS), "-c", "65536", "--host", "127.0.0.1", "--port", str(port)]
    else:
        cmd = [args.mlxrt, "serve", folder, "--port", str(port), "--log-level", "warning"]
    llama = bool(args.llama_server)  # its stop signals blocked, stopped with SIGKILL: serving.block_stop_signals
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=serving.block_stop_signals if llama else None)
    try:
        serving.first_completion(url, proc, time.perf_counter())
        print(f"{' '.join(cmd[:2])}; load average {serving._loadavg()}")
        print("| prompt (tokens) | TTFT (s), two prompts |\n|--:|--:|")
        for n in args.tokens or [335, 1000, 3000]:
            runs = []
            for seed in (100_000, 200_000):
                messages = [{"role": "system", "content": prompts.prefix(seed + n, n - 20)},
                            {"role": "user", "content": "Who mended something, and where?"}]
                (r,) = serving.serial(url, [(messages, 1)])
                runs.append(r)
            print(f"| {round(sum(r.prompt_tokens for r in runs) / 2)} | "
                  f"{', '.join(f'{r.ttft:.2f}' for r in runs)} |", flush=True)
    finally:
        serving._stop(proc, hard=llama)


if __name__ == "__main__":
    main()
