"""DiffusionGemma benchmark: denoising speed of the MLX port on a random-weight checkpoint.

Writes the tiny DiffusionGemma checkpoint (``mlxrt.testing.write_tiny_checkpoint``), optionally
widened (``--hidden``, ``--layers``, ``--canvas``, ``--vocab`` from the generated tokenizer
upwards) so a decoder pass costs something, and runs the family's generator directly (no HTTP)
for ``--tokens`` tokens, several times. Early stopping is off (every canvas runs all
``--steps`` denoising steps), so the figures are the worst case per canvas. Printed, median
over runs: prefill seconds, time to the first settled block, decoder passes per second and
generated tokens per second. The system OpenBLAS is activated first, as ``mlxrt serve`` does.

    python benchmarks/diffusion_gemma.py                       # the tiny test checkpoint
    python benchmarks/diffusion_gemma.py --hidden 512 --layers 8 --canvas 64 --steps 24
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=48)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--canvas", type=int, default=16)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()

    from mlxrt.loading.blas import activate

    blas = activate()  # the system OpenBLAS, as `mlxrt serve` uses (docs/performance.md)
    import mlx.core as mx

    from mlxrt.families.diffusion_gemma.generation import DenoiseSchedule, DiffusionGenerator
    from mlxrt.families.diffusion_gemma.model import load_text_model
    from mlxrt.records import GenerationRequest, SamplingParams
    from mlxrt.testing import write_tiny_checkpoint

    types = (["sliding_attention"] * 2 + ["full_attention"]) * (a.layers // 3 + 1)
    types = types[:a.layers - 1] + ["full_attention"]
    text = {"hidden_size": a.hidden, "intermediate_size": 2 * a.hidden, "moe_intermediate_size": a.hidden // 2,
            "num_hidden_layers": a.layers, "layer_types": types}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp) / "dg", "diffusion_gemma_no_vision",
                                     config_overrides={"text_config": text, "canvas_length": a.canvas})
        model = load_text_model(path, json.loads((path / "config.json").read_text()))
    schedule = DenoiseSchedule(max_denoising_steps=a.steps, stability_threshold=None, confidence_threshold=None)
    gen = DiffusionGenerator(model, schedule, eos=[-1])  # no EOS: every run makes --tokens tokens
    prompt = [(7 * i) % 1700 + 5 for i in range(a.prompt)]
    rows = []
    for run in range(a.runs + 1):  # the first run warms up
        request = GenerationRequest("bench", tuple(prompt), max_tokens=a.tokens, sampling=SamplingParams(seed=run))
        t0 = time.perf_counter()
        blocks = gen.generate(prompt, request, lambda: False)
        first = next(blocks)
        t_first = time.perf_counter() - t0
        n = len(first) + sum(len(b) for b in blocks)
        took = time.perf_counter() - t0
        canvases = -(-n // a.canvas)
        if run:
            rows.append((t_first, canvases * a.steps / took, n / took))
    mx.synchronize()
    first, passes, tps = (statistics.median(c) for c in zip(*rows, strict=True))
    print(f"hidden={a.hidden} layers={a.layers} canvas={a.canvas} steps={a.steps} prompt={a.prompt} "
          f"tokens={a.tokens} device={mx.default_device()} blas={blas.kind}")
    print(f"first block {first * 1000:.0f} ms | decoder passes {passes:.1f}/s | {tps:.1f} tokens/s "
          f"(median of {a.runs})")


if __name__ == "__main__":
    main()
