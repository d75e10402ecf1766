"""The mlxrt-qmv kernel's ``decode_attention`` (one sequence's decode step over mlx-lm's
``KVCache`` or ``RotatingKVCache`` as three primitives): the same bits as the rotations, the
cache's slice updates and slices and the attention it stands for, the cache's arrays updated as
item assignment updates them (the buffer reused only where nothing else holds it), and through
``mlxrt.engine.one_token`` a model's greedy tokens and logits step for step equal to the path
without it (``MLXRT_FUSED_DECODE=0``), past the cache's growth, a rotating cache's trim and its
wraps, for the AVX2 and the portable loops. Skipped where the kernel is not built."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from support import primitive_counts, tiny_mlx_lm_model

from mlxrt.engine import qmv

try:
    import mlxrt_qmv as ext
except ImportError:
    ext = None
pytestmark = pytest.mark.skipif(ext is None, reason="mlxrt-qmv is not built (scripts/setup builds it with a compiler)")


def _reference(q, k, v, k_cache, v_cache, args, row=None, length=None):
    """mlx-lm's step with the kernel's own primitives: reshape into heads, rope, the cache's
    slice updates (``update_and_fetch``: row ``row``, default the offset), its slices (the first
    ``length`` rows, default offset + 1; all of them as a wrapped rotating cache returns its
    buffer), attention, reshape back."""
    offset, scale, dims, traditional, base, rope_scale = args
    row, length = offset if row is None else row, offset + 1 if length is None else length
    heads, kv_heads, dim, dim_v = q.size // k_cache.shape[3], k_cache.shape[1], k_cache.shape[3], v_cache.shape[3]
    queries = ext.rope(q.reshape(1, heads, 1, dim), dims, traditional, base, rope_scale, offset)
    keys = ext.rope(k.reshape(1, kv_heads, 1, dim), dims, traditional, base, rope_scale, offset)
    k_cache[..., row:row + 1, :] = keys
    v_cache[..., row:row + 1, :] = v.reshape(1, kv_heads, 1, dim_v)
    if length < k_cache.shape[2]:
        k_cache, v_cache = k_cache[..., :length, :], v_cache[..., :length, :]
    return ext.attention(queries, k_cache, v_cache, scale, None).reshape(1, 1, -1)


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "dims", "traditional", "offset", "rows"), [
    (9, 3, 64, 64, False, 23, {}),  # SmolLM2's shapes, a KVCache's step: row offset, its first offset + 1 rows
    (4, 4, 16, 8, True, 23, {}),  # rotating part of each head only, adjacent pairs
    (6, 2, 12, 12, False, 23, {}),  # a head dimension not a multiple of 8: the portable loop
    # a RotatingKVCache of 40 rows past its wrap: position 57 written to row 17, all rows attended
    (4, 1, 256, 256, False, 57, {"row": 17, "length": 40}),  # (Gemma 3 270M's heads)
    (6, 2, 12, 12, False, 80, {"row": 0, "length": 40}),
    (4, 2, 16, 16, False, 23, {"row": 23, "length": 24}),  # the defaults, spelled out
])
def test_decode_attention_gives_the_bits_of_the_primitives_it_stands_for(heads, kv_heads, dim, dims, traditional,
                                                                         offset, rows):
    mx.random.seed(1)
    size = 40
    caches = [mx.random.normal((1, kv_heads, size, dim)) for _ in range(2)]
    q, k, v = (mx.random.normal((1, 1, n * dim)) for n in (heads, kv_heads, kv_heads))
    mx.eval(caches, q, k, v)
    ref_k, ref_v, k_cache, v_cache = mx.array(caches[0]), mx.array(caches[1]), mx.array(caches[0]), mx.array(caches[1])
    args = (offset, 0.3, dims, traditional, 1e4, 0.5)
    ref = _reference(q, k, v, ref_k, ref_v, args, **rows)
    held = k_cache
    out = ext.decode_attention(q, k, v, k_cache, v_cache, *args, **rows)
    assert held is k_cache  # the caller's arrays are updated, as item assignment updates them
    assert out.shape == (1, 1, heads * dim)
    for got, want in ((out, ref), (k_cache, ref_k), (v_cache, ref_v)):
        assert mx.array_equal(got, want).item()
    # the query's heads as a per-head norm leaves them, (1, heads, 1, dim), here a strided view: alike
    strided = mx.random.normal((1, 1, dim, heads)).transpose(0, 3, 1, 2)
    mx.eval(strided)
    again, again_ref = [mx.array(c) for c in caches], [mx.array(c) for c in caches]
    out_t = ext.decode_attention(strided, k, v, again[0], again[1], *args, **rows)
    assert mx.array_equal(out_t, _reference(mx.contiguous(strided), k, v, again_ref[0], again_ref[1], args,
                                            **rows)).item()


def test_decode_attention_writes_in_place_only_what_nothing_else_holds():
    kv_heads, size, dim = 4, 2048, 128  # 4 MiB a cache
    k_cache, v_cache = mx.zeros((1, kv_heads, size, dim)) + 1, mx.zeros((1, kv_heads, size, dim)) + 2
    q, k, v = (mx.ones((1, 1, kv_heads * dim)) for _ in range(3))
    mx.eval(k_cache, v_cache, q, k, v)
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    for offset in range(4):
        mx.eval(ext.decode_attention(q, k, v, k_cache, v_cache, offset, 0.1, dim, False, 1e4, 1.0))
    # the caches' buffers written in place: a copy would hold old and new at once
    assert mx.get_peak_memory() - before < 1 << 20
    # a view of the cache still held (a prompt-cache snapshot, say): the step writes a copy
    view = k_cache[:, :, :8]
    mx.eval(view)
    mx.eval(ext.decode_attention(q, k, v, k_cache, v_cache, 4, 0.1, dim, False, 1e4, 1.0))
    assert mx.get_peak_memory() - before >= size * kv_heads * dim * 4
    assert view[0, 0, 4, 0].item() == 1.0 and k_cache[0, 0, 4, 0].item() != 1.0


def test_decode_attention_refuses_what_it_does_not_compute():
    q, k, v = mx.zeros((1, 1, 64)), mx.zeros((1, 1, 64)), mx.zeros((1, 1, 64))
    k_cache, v_cache = mx.zeros((1, 1, 8, 64)), mx.zeros((1, 1, 8, 64))
    assert ext.decode_attention_supported(q, k, v, k_cache, v_cache, 7, 64)
    assert ext.decode_attention_supported(q, k, v, k_cache, v_cache, 100, 64, row=3, length=8)  # a wrapped rotating cache
    for bad, rows in (((q, k, v, k_cache, v_cache, 8, 64), {}),  # the buffer is full
                      ((q, k, v, k_cache, v_cache, 100, 64), {"row": 8, "length": 8}),  # a row past its end
                      ((q, k, v, k_cache, v_cache, 100, 64), {"row": -1, "length": 8}),
                      ((q, k, v, k_cache, v_cache, 3, 64), {"row": 3, "length": 9}),  # more rows than it has
                      ((q, k, v, k_cache, v_cache, 3, 64), {"row": 3, "length": 0}),
                      ((q, k, v, k_cache, v_cache, -1, 64), {"row": 3, "length": 4}),
                      ((q.astype(mx.float16), k, v, k_cache, v_cache, 0, 64), {}),
                      ((q, k, v, mx.zeros((2, 1, 8, 64)), mx.zeros((2, 1, 8, 64)), 0, 64), {}),  # a batch
                      ((q, k, v, k_cache, v_cache, 0, 65), {})):
        assert not ext.decode_attention_supported(*bad, **rows)
        with pytest.raises(ValueError, match="decode_attention"):
            ext.decode_attention(*bad[:6], 1.0, bad[6], False, 1e4, 1.0, **rows)


def _tiny(model_type: str, sliding_window: int = 4) -> nn.Module:
    return tiny_mlx_lm_model(model_type, vocab_size=512, seed=4, quantized=True, sliding_window=sliding_window)


def _steps(model: nn.Module, prompt: list[int], n: int,
           max_kv_size: int | None = None) -> tuple[list[int], list[np.ndarray], list[Counter], list[tuple]]:
    """Greedy tokens and each step's logits, the prompt's first, each step's primitives, and the
    caches' states after each step (``max_kv_size``: every layer's a rotating cache of that many
    rows keeping the first 4, as mlx-lm's ``max_kv_size`` makes them, not the model's own)."""
    from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

    cache = (make_prompt_cache(model) if max_kv_size is None
             else [RotatingKVCache(max_size=max_kv_size, keep=4) for _ in model.layers])
    logits = model(mx.array([prompt]), cache=cache)[:, -1, :]
    tokens, rows, ops, states = [], [], [], []
    for _ in range(n):
        rows.append(np.array(logits))
        tokens.append(int(mx.argmax(logits, axis=-1).item()))
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[:, -1, :]
        ops.append(primitive_counts(logits))
        mx.eval(logits)
        states.append(tuple((c.offset, getattr(c, "_idx", None), np.array(c.keys).tobytes(), np.array(c.values).tobytes())
                            for c in cache))
    return tokens, rows, ops, states


def _fused_and_plain(model_type: str, monkeypatch: pytest.MonkeyPatch, sliding_window: int = 4) -> tuple:
    """Two of the same tiny model: the kernel's layers with the fused decode step, and without it."""
    fused, plain = _tiny(model_type, sliding_window), _tiny(model_type, sliding_window)
    qmv.install_fused(fused)
    monkeypatch.setenv("MLXRT_FUSED_DECODE", "0")
    qmv.install_fused(plain)
    assert plain.layers[0].self_attn._mlxrt_fused is None and fused.layers[0].self_attn._mlxrt_fused is not None
    return fused, plain


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text"])
def test_a_model_s_decode_is_bit_identical_with_and_without_the_fused_step(model_type, monkeypatch):
    # 250 prompt tokens and 12 steps: the cache's buffer (256 rows) fills, update_and_fetch grows
    # it on that step, and the fused step resumes on the grown buffer (Gemma's sliding layer, a
    # 4-token window: trimmed on the first step, its write index wrapping every 4 after)
    prompt = [(i * 37) % 500 + 3 for i in range(250)]
    fused, plain = _fused_and_plain(model_type, monkeypatch)
    tokens, logits, ops, _ = _steps(fused, prompt, 12)
    want_tokens, want_logits, want_ops, _ = _steps(plain, prompt, 12)
    assert tokens == want_tokens
    assert all(np.array_equal(a, b) for a, b in zip(logits, want_logits, strict=True))
    # both layers (Gemma's sliding one over its rotating cache too) on the last step
    assert ops[-1]["MlxrtDecodeAttention"] == 2 and ops[-1]["MlxrtCacheWrite"] == 4
    assert ops[-1]["MlxrtAttention"] == 0 and "MlxrtDecodeAttention" not in want_ops[-1]


@pytest.mark.parametrize(("model_type", "window", "prompt_length", "mlx_lm_steps"), [
    # after 5 tokens the sliding layer's first step grows its buffer to the window (mlx-lm's
    # path), the fused steps fill it (the first offset + 1 rows) and wrap at step 27 to row 0
    ("gemma3_text", 32, 5, {0: 1}),
    # after 250 the first step trims the prefill's 250 rows to 32 and writes row 0 (mlx-lm's
    # path); the fused steps go round from row 1 and wrap at step 32; the global layer grows its
    # 256-row buffer on step 6 (mlx-lm's path)
    ("gemma3_text", 32, 250, {0: 1, 6: 1}),
    # every layer rotating (mlx-lm's max_kv_size) with 4 rows kept: the first step trims, the
    # write index wraps from 16 to row 4 at step 12 and every 12 steps after
    ("llama", None, 40, {0: 0}),
])
def test_a_rotating_cache_s_decode_is_bit_identical_with_and_without_the_fused_step(
        model_type, window, prompt_length, mlx_lm_steps, monkeypatch):
    prompt = [(i * 37) % 500 + 3 for i in range(prompt_length)]
    fused, plain = _fused_and_plain(model_type, monkeypatch, sliding_window=window or 4)
    max_kv_size = 16 if window is None else None
    tokens, logits, ops, states = _steps(fused, prompt, 40, max_kv_size)
    want_tokens, want_logits, _, want_states = _steps(plain, prompt, 40, max_kv_size)
    assert tokens == want_tokens
    assert [row.tobytes() for row in logits] == [row.tobytes() for row in want_logits]
    # the caches' offsets, write indices and buffers (in their rotated order) after each step alike
    assert states == want_states
    # the steps on which a rotating cache grows or trims (and a plain one grows) keep mlx-lm's path there
    assert [step["MlxrtDecodeAttention"] for step in ops] == [mlx_lm_steps.get(i, 2) for i in range(40)]


def test_the_portable_loops_give_the_same_bits():
    # MLXRT_QMV_KERNEL=portable (as on a CPU without AVX2): this file's tests in a process that runs them
    env = {**os.environ, "MLXRT_QMV_KERNEL": "portable"}
    code = "import mlxrt_qmv; print(mlxrt_qmv.kernel_name())"
    if os.environ.get("MLXRT_QMV_KERNEL") == "portable":
        pytest.skip("this process already runs the portable loops")
    name = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert name.stdout.strip().startswith("portable"), name.stderr[-2000:]
    run = subprocess.run([str(Path(sys.executable).parent / "pytest"), "-q", "-p", "no:cacheprovider", __file__,
                          "-k", "not portable_loops"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
