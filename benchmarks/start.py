"""Start-up: spawn to the first completion, mlxrt serve against mlx_lm.server, interleaved rounds.

Each round starts every server once, in turn, on the same checkpoint (default: the tiny random
llama `benchmarks/serving.py` uses) and records, per start:

  * ready: process spawn until a non-streaming 4-token chat completion returns (the
    `ready` of `serving.py --side-by-side`, polled every 10 ms);
  * CPU: user + system time the process used until then (all its threads, from /proc): on a
    machine shared with other work it moves far less than the wall clock;
  * RSS: its resident high-water mark (VmHWM) at that point.

It prints medians and the median of the per-round ratios to mlx_lm.server. Like `serving.py`
it compiles the bytecode of an editable checkout first (`serving.compile_sources`).

    python benchmarks/start.py                          # ~1 min on 2 cores
    python benchmarks/start.py --rounds 8 --server "before=/path/to/other/venv/bin/mlxrt serve {model}"

`--server LABEL=COMMAND` adds a server (repeatable): COMMAND is split like a shell line,
`{model}` is replaced by the checkpoint folder, and `--port N` is appended.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import _loadavg, _stop, compile_sources, free_port


def _cpu_and_hwm(pid: int) -> tuple[float, float]:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    hwm = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return cpu, int(hwm.group(1)) / 1024 if hwm else float("nan")


def one_start(command: list[str], limit: float = 300) -> dict[str, float]:
    """Start ``command --port N`` once: its ready time, CPU time and peak RSS then."""
    port = free_port()
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0.0}
    t0 = time.perf_counter()
    proc = subprocess.Popen([*command, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - t0 < limit:
            if proc.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {proc.returncode}")
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=limit)
                if r.status_code == 200:
                    ready = time.perf_counter() - t0
                    cpu, hwm = _cpu_and_hwm(proc.pid)
                    return {"ready_s": ready, "cpu_s": cpu, "rss_mib": hwm}
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        raise TimeoutError(command[0])
    finally:
        _stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint folder (default: the tiny random llama)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--server", action="append", default=[], metavar="LABEL=COMMAND",
                        help="another server to start, e.g. 'before=/other/.venv/bin/mlxrt serve {model}'")
    args = parser.parse_args()
    if compiled := compile_sources():
        print(f"compiled the bytecode of {', '.join(compiled)}", file=sys.stderr)
    model = args.model
    if model is None:
        from mlxrt.testing import write_tiny_checkpoint

        model = str(write_tiny_checkpoint(Path(tempfile.gettempdir()) / "mlxrt-start-bench" / "tiny-llama", "llama"))
    bindir = Path(sys.executable).parent
    servers = {"mlxrt": [str(bindir / "mlxrt"), "serve", model, "--log-level", "warning"]}
    for item in args.server:
        label, _, command = item.partition("=")
        servers[label] = [part.replace("{model}", model) for part in shlex.split(command)]
    servers["mlx_lm.server"] = [sys.executable, "-m", "mlx_lm", "server", "--model", model, "--log-level", "WARNING"]
    print(f"load average at start {_loadavg()}", file=sys.stderr)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
    for k in range(args.rounds):
        for name, command in servers.items():
            results[name].append(one_start(command))
            r = results[name][-1]
            print(f"  round {k} {name}: ready {r['ready_s']:.3f} s, CPU {r['cpu_s']:.2f} s, RSS {r['rss_mib']:.1f} MiB",
                  file=sys.stderr, flush=True)
    base = results["mlx_lm.server"]
    print(f"\nstart on {model}: medians of {args.rounds} interleaved rounds; × = median of per-round ratios "
          "to mlx_lm.server")
    print("| server | ready (s) | CPU to ready (s) | RSS at ready (MiB) | ready × | CPU × |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in ("ready_s", "cpu_s", "rss_mib")}
        ratios = ["—", "—"] if name == "mlx_lm.server" else [
            f"{statistics.median(a[key] / b[key] for a, b in zip(runs, base, strict=True)):.2f}×"
            for key in ("ready_s", "cpu_s")]
        print(f"| {name} | {med['ready_s']:.2f} | {med['cpu_s']:.2f} | {med['rss_mib']:.1f} | {ratios[0]} | {ratios[1]} |")
    print(f"load average at the end {_loadavg()}")


if __name__ == "__main__":
    main()
