"""Tokenizer start-up: mlxrt's own loader against mlx-lm's, each in a fresh process.

Each run imports mlx and numpy first (a server has them anyway), then times loading the
tokenizer and rendering one chat template, and reads the process's peak RSS; medians of
``--runs`` fresh processes per loader and folder are printed, with whether transformers got
imported.

    python benchmarks/tokenizer_load.py                      # tiny qwen3 + the embedded SmolLM2
    python benchmarks/tokenizer_load.py --tokenizer qwen3    # also ../shared/data/tokenizers/qwen3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# ../shared beside the checkout, or $MLXRT_SHARED (as the tests find it)
SHARED = Path(os.environ.get("MLXRT_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
TOKENIZERS = SHARED / "data" / "tokenizers"
LOADERS = {
    "mlxrt": "from mlxrt.text.tokenizer import load_tokenizer as load; t = load(P)",
    "mlx-lm": "from mlx_lm.utils import load_tokenizer as load; from pathlib import Path; t = load(Path(P))",
}
PROGRAM = (
    "import resource, sys, time; import mlx.core, mlx.nn, numpy; P = {path!r}; t0 = time.perf_counter(); "
    "{load}; t.chat_template and t.apply_chat_template([{{'role': 'user', 'content': 'hi'}}], tokenize=False, "
    "add_generation_prompt=True); print(time.perf_counter() - t0, "
    "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 'transformers' in sys.modules)"
)


def measure(path: Path, load: str, runs: int) -> tuple[float, float, bool]:
    """(median seconds, median peak RSS MiB, transformers imported) over ``runs`` processes."""
    rows = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", PROGRAM.format(path=str(path), load=load)],
                             capture_output=True, text=True, check=True).stdout.split()
        rows.append((float(out[0]), float(out[1]), out[2] == "True"))
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows), rows[0][2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", action="append", default=[], help="a folder of ../shared/data/tokenizers")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from mlxrt.loading.embedded import embedded_available, embedded_model_dir
    from mlxrt.testing import write_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        folders = {"tiny qwen3": write_tiny_checkpoint(Path(tmp) / "qwen3", "qwen3")}
        if embedded_available():
            folders["SmolLM2"] = embedded_model_dir()
        folders.update({name: TOKENIZERS / name for name in args.tokenizer})
        for name, path in folders.items():
            for who, load in LOADERS.items():
                seconds, rss, imported = measure(path, load, args.runs)
                print(f"{name:12s} {who:7s} load+render {seconds * 1000:7.0f} ms  peak RSS {rss:6.0f} MiB  "
                      f"transformers imported: {imported}")


if __name__ == "__main__":
    main()
