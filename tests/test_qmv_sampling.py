"""The mlxrt-qmv kernel's ``sort``, ``exp`` and ``argmax`` primitives give MLX's results bit for bit
(every float class, ties, any bit pattern, several rows; greedy draws go through ``argmax``), and the nucleus (top-p) filter built on them
draws the same tokens as mlx-lm's ``make_sampler`` with the same seed, both alone and in the
chain ``build_sampler`` makes. Skipped where the kernel is not built."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import apply_top_p, make_sampler
from support import primitive_counts

from mlxrt.engine import qmv
from mlxrt.engine.sampling import build_sampler, seeded
from mlxrt.host import make_host
from mlxrt.records import GenerationRequest, ModelInfo, SamplingParams

try:
    import mlxrt_qmv as ext
except ImportError:
    ext = None
pytestmark = pytest.mark.skipif(ext is None, reason="mlxrt-qmv is not built (scripts/setup builds it with a compiler)")


def _same_bits(got: mx.array, ref: mx.array) -> bool:
    a, b = np.array(got), np.array(ref)
    return got.dtype == ref.dtype and a.shape == b.shape and bool(
        ((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))).all())


def _rows() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(n).astype(np.float32) * s for n, s in ((49152, 4.0), (151936, 1.0), (2, 1.0), (9, 30.0))]
    # ties, both zeros, infinities, NaNs of both signs, subnormals, values past exp's ±88
    edge = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -0.0, 0.0, 5e-40, -5e-40, 88.5, -100.0],
                    np.float32)
    rows.append(np.tile(edge, 7))
    rows.append(rng.integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32).view(np.float32))  # any bits
    rows.append(np.round(rng.standard_normal(5000) * 3).astype(np.float32))  # many equal values
    return rows


def test_sort_gives_mlx_s_order_and_bits():
    for row in _rows():
        x = mx.array(row)[None]
        assert _same_bits(ext.sort(x), mx.sort(x, axis=-1)), row.size
    x = mx.random.normal((6, 3000))  # several rows over the kernel's threads; a transposed view
    assert _same_bits(ext.sort(x), mx.sort(x, axis=-1))
    assert _same_bits(ext.sort(x.T), mx.sort(x.T, axis=-1))
    assert "MlxrtSort" in primitive_counts(ext.sort(x))
    h = x.astype(mx.float16)  # other dtypes are mx.sort's
    assert _same_bits(ext.sort(h).astype(mx.float32), mx.sort(h, axis=-1).astype(mx.float32))


def test_exp_gives_mlx_s_bits():
    for row in _rows():
        x = mx.array(row)
        assert _same_bits(ext.exp(x), mx.exp(x)), row.size
    x = mx.random.normal((3, 5, 7)) * 40  # odd shapes: a tail shorter than eight
    assert _same_bits(ext.exp(x), mx.exp(x))
    assert "MlxrtExp" in primitive_counts(ext.exp(x))


def test_argmax_gives_mlx_s_index_and_greedy_draws_go_through_it():
    # the first NaN, else the first maximum (ties, both zeros, -inf rows), any length and rows
    for row in _rows():
        x = mx.array(row)
        assert ext.argmax(x).item() == mx.argmax(x).item(), row.size
    nan, inf = float("nan"), float("inf")
    for row in ([1.0, nan, 3.0, nan], [nan, 1.0], [-inf, -inf], [-0.0, 0.0], [1.0, 3.0, 3.0], [2.0] * 9 + [3.0] * 2):
        assert ext.argmax(mx.array(row)).item() == mx.argmax(mx.array(row)).item(), row
    x = mx.random.normal((5, 3, 4001))
    got = ext.argmax(x)
    assert got.dtype == mx.uint32 and mx.array_equal(got, mx.argmax(x, axis=-1)).item()
    h = x.astype(mx.float16)  # other dtypes are mx.argmax's
    assert mx.array_equal(ext.argmax(h), mx.argmax(h, axis=-1)).item()
    # mlx-lm's greedy sampler (or none) draws through it, any other sampler as it is
    from mlx_lm.sample_utils import greedy_sampler

    lp = _logprobs(3)
    for sampler in (greedy_sampler, None):
        drawn = qmv.draw(sampler, lp)
        assert "MlxrtArgmax" in primitive_counts(drawn) and mx.array_equal(drawn, mx.argmax(lp, axis=-1)).item()
    assert qmv.draw(lambda logprobs: mx.zeros((3,), dtype=mx.uint32), lp).tolist() == [0, 0, 0]


def _logprobs(rows: int, n: int = 49152, seed: int = 0) -> mx.array:
    mx.random.seed(seed)
    logits = mx.random.normal((rows, n)) * 3
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.95, 0.999])
def test_the_nucleus_filter_is_mlx_lm_s(top_p):
    filt = qmv.top_p_filter()
    assert filt is not None
    for rows in (1, 4):
        lp = _logprobs(rows, seed=int(top_p * 1000) + rows)
        got, ref = filt(lp, top_p), apply_top_p(lp, top_p)
        assert _same_bits(got, ref)
        assert 0 < int(mx.isfinite(got).sum()) < got.size  # it kept some tokens and dropped others
    peaked = mx.array([[0.0] + [-mx.inf] * 50])  # one certain token: kept alone
    assert _same_bits(filt(peaked, 0.9), apply_top_p(peaked, 0.9))


def test_a_top_p_request_draws_mlx_lm_s_tokens_with_the_same_seed():
    request = GenerationRequest(request_id="r", prompt_ids=(1,), max_tokens=1,
                                sampling=SamplingParams(temperature=0.8, top_p=0.9, top_k=50, min_p=0.02))
    ours = seeded(build_sampler(make_host(), request, ModelInfo(model_id="m", path=".", model_type="x")), 1234)
    mlx_lm_s = seeded(make_sampler(temp=0.8, top_p=0.9, top_k=50, min_p=0.02), 1234)
    lp = _logprobs(1, seed=5)
    drawn = [(ours(lp).item(), mlx_lm_s(lp).item()) for _ in range(40)]
    assert all(a == b for a, b in drawn)
    assert len({a for a, _ in drawn}) > 3  # a real draw, not one token each time
