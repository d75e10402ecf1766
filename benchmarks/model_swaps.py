"""What model swaps leave behind: a strict ``mlxrt serve`` with ``--max-models 1`` answering an
alias and the default in turn (every request loads one model and unloads the other), on
loopback. Prints the requests, their 5xx count, each model's loads, and the server's threads
and RSS (from ``/proc``, so Linux only) after the first two swaps and after the rest.

By default the models are tiny random checkpoints of two families written to a temporary
folder (issue 31, finding 4: each load used to leave a thread and ~0.3 MB behind).

    python benchmarks/model_swaps.py --swaps 100
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import free_port, start_server


def snapshot(pid: int) -> tuple[int, float]:
    """The process's threads (the OS's count: MLX's native ones included) and RSS in MB."""
    threads = len(os.listdir(f"/proc/{pid}/task"))
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return threads, round(pages * os.sysconf("SC_PAGE_SIZE") / 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--swaps", type=int, default=100, help="requests after the warm-up, alternating models")
    args = parser.parse_args()
    from mlxrt.testing import write_tiny_checkpoint

    root = Path(tempfile.mkdtemp())
    served, other = (write_tiny_checkpoint(root / name, name) for name in ("llama", "qwen3"))
    port = free_port()
    mlxrt = str(Path(sys.executable).with_name("mlxrt"))
    proc = start_server([mlxrt, "serve", str(served), "--model-alias", f"other={other}", "--max-models", "1",
                         "--strict-model"], port)
    url = f"http://127.0.0.1:{port}"
    try:
        def ask(model: str) -> int:
            return httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
                "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).status_code

        codes = [ask("other"), ask("default")]  # warm: both loaded once
        before = snapshot(proc.pid)
        codes += [ask("other" if i % 2 == 0 else "default") for i in range(args.swaps)]
        after = snapshot(proc.pid)
        loads = {m["id"]: m["loads"] for m in httpx.get(f"{url}/stats").json()["models"]["models"]}
        print(f"requests {len(codes)}, 5xx {sum(c >= 500 for c in codes)}, non-200 {sum(c != 200 for c in codes)}; "
              f"loads {loads}; threads {before[0]} -> {after[0]}; RSS {before[1]} -> {after[1]} MB")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
