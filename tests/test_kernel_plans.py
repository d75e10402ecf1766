"""What the kernel's install finds in a model's scales (16-bit exactness, symmetric centres) is kept
across starts (mlxrt.loading.kernel_plans): a second start with the same weights compares no
scale and gets the same layers and logits; other weights, a damaged plan or ``MLXRT_QMV_COMPACT=0``
compare as before."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("gguf")
mx = pytest.importorskip("mlx.core")

from gguf_files import write_tiny  # noqa: E402

import mlxrt.engine.qmv as qmv  # noqa: E402

pytestmark = pytest.mark.skipif(not qmv.load().active, reason="the mlxrt-qmv kernel is not loaded")

#: Q8_0 and Q4_0 (symmetric: computed biases, float16 scales), Q4_K (float32: d·scale_j is not
#: exact in 16 bits) and Q4_1 (float16, no centre).
TYPES = {"token_embd": "Q8_0", "output": "Q8_0", "attn_q": "Q4_0", "attn_k": "Q4_K", "attn_v": "Q4_1",
         "attn_output": "Q8_0", "ffn_gate": "Q4_0", "ffn_up": "Q4_1", "ffn_down": "Q8_0"}


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    from mlxrt.loading.gguf import convert_gguf

    monkeypatch.setenv("MLXRT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLXRT_QMV_COMPACT", raising=False)
    write_tiny(tmp_path / "tiny.gguf", "llama", TYPES)
    return convert_gguf(tmp_path / "tiny.gguf", tmp_path / "converted")


def _load(folder):
    from mlxrt.host import make_host
    from mlxrt.loading import load_weights
    from mlxrt.loading.resolve import ModelSource, read_model_info

    loaded, _plugin = load_weights(read_model_info(ModelSource(folder, "tiny", "folder")), make_host())
    model = loaded.model
    layers = {name: (str(m["scales"].dtype), getattr(m, "bias_centre", 0.0))
              for name, m in model.named_modules() if "scales" in m}
    return layers, np.array(model(mx.array([[3, 9, 27, 81, 5, 25]])).astype(mx.float32))


def _plans(tmp_path):
    return sorted((tmp_path / "home" / "kernel-plans").glob("*.json"))


def _comparing_fails(monkeypatch):
    def refused(*_args):
        raise AssertionError("compared the scales again")

    monkeypatch.setattr(qmv, "compact_scales", refused)
    monkeypatch.setattr(qmv, "symmetric_centre", refused)


def test_a_second_start_compares_no_scale_and_gets_the_same_layers(folder, tmp_path, monkeypatch):
    layers, logits = _load(folder)
    assert {dtype for dtype, _ in layers.values()} == {"mlx.core.float16", "mlx.core.float32"}
    assert {centre for _, centre in layers.values()} >= {0.0, 8.0, 128.0}  # Q4_0's and Q8_0's
    (plan,) = _plans(tmp_path)
    assert set(json.loads(plan.read_text())["layers"]) == set(layers)
    _comparing_fails(monkeypatch)
    again, logits_again = _load(folder)
    assert again == layers
    assert np.array_equal(logits_again, logits)


def test_other_weights_or_a_damaged_plan_are_compared_again(folder, tmp_path, monkeypatch):
    layers, _ = _load(folder)
    (plan,) = _plans(tmp_path)
    plan.write_text("{not json")
    assert _load(folder)[0] == layers  # compared again (the damaged plan is not read) and rewritten
    assert json.loads(plan.read_text())["layers"]
    weights = folder / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # "other weights"
    calls = []
    compact = qmv.compact_scales
    monkeypatch.setattr(qmv, "compact_scales", lambda s, b: calls.append(1) or compact(s, b))
    assert _load(folder)[0] == layers
    assert calls and len(_plans(tmp_path)) == 2


def test_compact_off_keeps_float32_scales_and_writes_no_plan(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("MLXRT_QMV_COMPACT", "0")
    layers, _ = _load(folder)
    assert {dtype for dtype, _ in layers.values()} == {"mlx.core.float32"}
    assert not _plans(tmp_path)
