"""Slow clients: does `/health` still answer while thousands of sockets send headers slowly?

For each server (`mlxrt serve`, then `python -m mlx_lm server`) on a tiny random-weight
checkpoint, on a free loopback port: open N sockets that each send the start of a request
head and then one more byte per round (a slowloris), and time a fresh `GET /health` each
round. Prints one markdown table, both servers side by side: how many sockets opened, probes
answered, median and worst probe latency. Loopback only; everything is closed at the end.

    python benchmarks/slow_clients.py                      # 2,000 sockets, 10 rounds
    python benchmarks/slow_clients.py --server-nofile 1024   # servers under Linux's usual limit
    python benchmarks/slow_clients.py --sockets 500 --rounds 5 --only mlxrt
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import free_port, server_command

HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.25)
    raise TimeoutError("server did not become healthy")


def run(name: str, model: str, sockets: int, rounds: int, nofile: int | None) -> dict[str, object]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def limit() -> None:  # in the server's process only: the client needs its sockets
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.Popen(server_command(name, model, port, []), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd="/", preexec_fn=limit)
    opened: list[socket.socket] = []
    try:
        wait_healthy(url, proc)
        for _ in range(sockets):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2)
                s.setblocking(False)
                s.send(HEAD)
                opened.append(s)
            except OSError:
                break
        latencies: list[float] = []
        for _ in range(rounds):
            for s in opened:
                try:
                    s.send(b"a")
                except OSError:
                    pass
            started = time.monotonic()
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    latencies.append((time.monotonic() - started) * 1000)
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return {"opened": len(opened), "answered": len(latencies),
                "median_ms": statistics.median(latencies) if latencies else None,
                "worst_ms": max(latencies) if latencies else None}
    finally:
        for s in opened:
            s.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sockets", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--only", choices=["mlxrt", "mlx_lm.server"])
    parser.add_argument("--server-nofile", type=int, default=None,
                        help="open-file limit of the server processes (macOS's default is 256; Linux's 1024)")
    args = parser.parse_args()
    from mlxrt.testing import write_tiny_checkpoint

    model = str(write_tiny_checkpoint(Path(tempfile.mkdtemp()) / "tiny", "llama"))
    names = [args.only] if args.only else ["mlxrt", "mlx_lm.server"]
    results = {name: run(name, model, args.sockets, args.rounds, args.server_nofile) for name in names}
    print(f"load average {' '.join(os.getloadavg().__repr__().strip('()').split(', '))}; "
          f"{args.sockets} slow sockets, {args.rounds} probes of GET /health (5 s timeout each), server "
          f"open-file limit {args.server_nofile or resource.getrlimit(resource.RLIMIT_NOFILE)[0]}\n")
    print("| metric | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for key, label in (("opened", "slow sockets open"), ("answered", "probes answered"),
                       ("median_ms", "probe median (ms)"), ("worst_ms", "probe worst (ms)")):
        cells = [results[n][key] for n in names]
        print(f"| {label} | " + " | ".join("-" if c is None else f"{c:.1f}" if isinstance(c, float) else str(c)
                                          for c in cells) + " |")


if __name__ == "__main__":
    main()
