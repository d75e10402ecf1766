"""Prompt-cache reuse per cache kind: turn-2 TTFT over cold TTFT, mlxrt serve vs mlx_lm.server.

For each family (llama and qwen3: plain KV; gemma3_text and gemma4_text: sliding-window layers,
whose RotatingKVCache rolls past its window on this prefix; qwen3_5: gated-DeltaNet recurrent
state beside full attention) a random-weight checkpoint from `mlxrt.testing.write_tiny_checkpoint`,
widened so that prefill dominates a request (hidden 256, 4 layers), is served by `mlxrt serve` and
then by `python -m mlx_lm server`, one at a time. Each server gets, per repeat, over streaming
OpenAI chat (temperature 0):

  turn 1  a ~PREFIX-token system prompt of notes + a question (8 tokens);
  turn 2  turn 1's messages + its reply + a new question (4 tokens): the prompt cache's case;
  cold    the same shape on a system prompt of other notes (4 tokens): nothing to reuse.

and the table gives the median TTFT of each, turn 2's cached tokens and the ratio turn 2 / cold
(target: <= 0.2 for every family, never worse than mlx_lm.server's ratio), and turn 2's TTFT of
mlxrt over mlx_lm.server's. On a loaded machine the cold prefills of the two servers, measured
minutes apart, swing by tens of percent, and so does the ratio of ratios; the last column
compares the warm requests directly.

    python benchmarks/prompt_cache_families.py                     # all families, 3 repeats
    python benchmarks/prompt_cache_families.py --only gemma3_text --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import (
    Prompts,
    _loadavg,
    _stop,
    first_completion,
    free_port,
    serial,
    server_command,
)

WIDE = {"hidden_size": 256, "intermediate_size": 768}
#: Per family: config overrides (sliding windows stay below the prefix: the cache rolls).
FAMILIES = {
    "llama": WIDE,
    "qwen3": WIDE,
    "qwen3_5": {"text_config": WIDE, "vision_config": {"out_hidden_size": 256}},
    "gemma3_text": {**WIDE, "sliding_window": 512},
    "gemma4_text": {**WIDE, "sliding_window": 512},
}
Q1 = {"role": "user", "content": "From the notes, who mended something, and where?"}
Q2 = {"role": "user", "content": "And what did the archivist do?"}


def measure(name: str, model: Path, prompts: Prompts, prefix: int, repeats: int, log: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as fh:
        proc = subprocess.Popen(server_command(name, str(model), port, []), stdout=fh, stderr=subprocess.STDOUT)
        try:
            first_completion(url, proc, time.perf_counter())
            turn2, cold, first, cached, tokens = [], [], [], [], []
            for k in range(repeats):
                system = {"role": "system", "content": prompts.prefix(2 * k, prefix)}
                other = {"role": "system", "content": prompts.prefix(2 * k + 1, prefix)}
                (t1,) = serial(url, [([system, Q1], 8)])
                reply = {"role": "assistant", "content": t1.text}
                t2, c = serial(url, [([system, Q1, reply, Q2], 4), ([other, Q1, reply, Q2], 4)])
                first.append(t1.ttft)
                turn2.append(t2.ttft)
                cold.append(c.ttft)
                cached.append(t2.cached_tokens or 0)
                tokens.append(t2.prompt_tokens)
        finally:
            _stop(proc)
    ms = lambda xs: round(1000 * statistics.median(xs), 1)  # noqa: E731
    return {"turn1_ms": ms(first), "turn2_ms": ms(turn2), "cold_ms": ms(cold), "cached": min(cached),
            "prompt": max(tokens), "ratio": round(statistics.median(turn2) / statistics.median(cold), 3)}


def _cells(r: dict) -> list[str]:
    return [str(r["turn2_ms"]), str(r["cold_ms"]), f"{r['cached']} / {r['prompt']}", f"{r['ratio']:.3f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", choices=list(FAMILIES), help="families to run (default: all)")
    parser.add_argument("--prefix", type=int, default=1500, help="system-prompt tokens (default 1500)")
    parser.add_argument("--repeats", type=int, default=3, help="conversations per server (default 3)")
    args = parser.parse_args()
    from mlxrt.testing import write_tiny_checkpoint

    load = [_loadavg()]
    rows = [["family", "mlxrt turn 2 ms", "mlxrt cold ms", "mlxrt cached / prompt", "mlxrt turn 2 / cold",
             "mlx_lm turn 2 ms", "mlx_lm cold ms", "mlx_lm cached / prompt", "mlx_lm turn 2 / cold",
             "mlxrt <= 0.2", "mlxrt ratio / mlx_lm ratio", "turn 2 ms mlxrt / mlx_lm"]]
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.only or FAMILIES:
            model = write_tiny_checkpoint(Path(tmp) / family, family, config_overrides=FAMILIES[family])
            prompts = Prompts(str(model))
            results = {}
            for name in ("mlxrt", "mlx_lm"):
                print(f"{family}: {name} ...", file=sys.stderr, flush=True)
                results[name] = measure(name, model, prompts, args.prefix, args.repeats, Path(tmp) / f"{family}-{name}.log")
            ours, theirs = results["mlxrt"], results["mlx_lm"]
            rows.append([family, *_cells(ours), *_cells(theirs),
                         "yes" if ours["ratio"] <= 0.2 else "NO", f"{ours['ratio'] / theirs['ratio']:.2f}",
                         f"{ours['turn2_ms'] / theirs['turn2_ms']:.2f}"])
    load.append(_loadavg())
    print("\n".join("| " + " | ".join(row) + " |" for row in [rows[0], ["---"] * len(rows[0]), *rows[1:]]))
    print(f"\nprefix {args.prefix} tokens, {args.repeats} repeats; load average {load[0]} -> {load[1]}")


if __name__ == "__main__":
    main()
