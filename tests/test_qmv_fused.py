"""The mlxrt-qmv kernel's fused primitives (``rms_norm``, ``rope``, ``attention``): each equals the
``mx.fast`` operation it stands for (MLX's CPU runs those as small-op fallback graphs), hands what
it does not support to that operation, and, swapped into a model by ``install_fused``, leaves
greedy tokens — a lone stream's and a left-padded batch's — as they were while a decode step
dispatches a quarter of the ops. Skipped where the kernel is not built."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from support import primitive_counts

from mlxrt import compat
from mlxrt.engine import qmv

try:
    import mlxrt_qmv as ext
except ImportError:
    ext = None
pytestmark = pytest.mark.skipif(ext is None, reason="mlxrt-qmv is not built (scripts/setup builds it with a compiler)")


def _rel(got: mx.array, ref: mx.array) -> float:
    assert got.shape == ref.shape and got.dtype == ref.dtype
    return (mx.abs(got - ref).max() / (mx.abs(ref).max() + 1e-9)).item()


def test_rms_norm_equals_mlx_and_is_one_op():
    mx.random.seed(0)
    x, w = mx.random.normal((2, 3, 576)), mx.random.normal((576,))
    assert _rel(ext.rms_norm(x, w, 1e-5), mx.fast.rms_norm(x, w, 1e-5)) < 1e-6
    assert _rel(ext.rms_norm(x, None, 1e-6), mx.fast.rms_norm(x, None, 1e-6)) < 1e-6
    strided = mx.random.normal((4, 2, 64)).transpose(1, 0, 2)  # rows not in memory order
    assert _rel(ext.rms_norm(strided, w[:64], 1e-5), mx.fast.rms_norm(strided, w[:64], 1e-5)) < 1e-6
    assert primitive_counts(ext.rms_norm(x, w, 1e-5)) == Counter({"MlxrtRmsNorm": 1})
    # half precision is MLX's own computation, exactly
    half = x.astype(mx.bfloat16)
    assert mx.array_equal(ext.rms_norm(half, w.astype(mx.bfloat16), 1e-5),
                          mx.fast.rms_norm(half, w.astype(mx.bfloat16), 1e-5)).item()
    assert "MlxrtRmsNorm" not in primitive_counts(ext.rms_norm(half, None, 1e-5))


def _rope_float64(x: mx.array, dims: int, traditional: bool, base: float, offset: int | mx.array) -> np.ndarray:
    """RoPE in float64 from the angles MLX computes (in float32), for (batch, heads, positions, dim)."""
    xs = np.array(x, dtype=np.float64)
    half = dims // 2
    inv = np.exp(np.arange(half, dtype=np.float32) * np.float32(-np.log(base) / half)).astype(np.float32)
    offsets = np.array(offset, dtype=np.float32).reshape(-1, 1, 1, 1)  # one per batch row, or one
    pos = np.arange(xs.shape[2], dtype=np.float32)[None, None, :, None] + offsets
    theta = (pos * inv).astype(np.float64)
    cos, sin = np.cos(theta), np.sin(theta)
    out = xs.copy()
    first, second = (slice(0, dims, 2), slice(1, dims, 2)) if traditional else (slice(0, half), slice(half, dims))
    x1, x2 = xs[..., first], xs[..., second]
    out[..., first], out[..., second] = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    return out


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims", [64, 32])
def test_rope_equals_mlx_for_scalar_and_per_row_offsets(traditional, dims):
    mx.random.seed(1)
    # (batch, heads, positions, head dim) as attention layers pass it: a transposed view
    x = mx.random.normal((2, 5, 4, 64)).transpose(0, 2, 1, 3)
    for offset in (0, 37, 4000, mx.array([3, 90]), mx.array(12)):
        got = ext.rope(x, dims, traditional, 10000.0, 1.0, offset)
        ref = mx.fast.rope(x, dims, traditional=traditional, base=10000.0, scale=1.0, offset=offset)
        exact = _rope_float64(x, dims, traditional, 10000.0, offset)
        # both compute the angles alike in float32; their sines differ (libm's against MLX's
        # vectorized ones), which shows at large angles: the primitive is the nearer to exact
        err, mlx_err = (np.abs(np.array(a, dtype=np.float64) - exact).max() for a in (got, ref))
        assert err <= max(1.5 * mlx_err, 1e-6), (offset, err, mlx_err)
        assert _rel(got, ref) < 2e-4, offset
    three = mx.random.normal((4, 7, 64))
    assert _rel(ext.rope(three, dims, traditional, 1e5, 0.5, 5),
                mx.fast.rope(three, dims, traditional=traditional, base=1e5, scale=0.5, offset=5)) < 2e-5
    assert primitive_counts(ext.rope(x, dims, traditional, 10000.0, 1.0, 9))["MlxrtRope"] == 1
    assert "Sin" in primitive_counts(ext.rope(x.astype(mx.float16), dims, traditional, 10000.0, 1.0, 9))  # MLX's fallback


def _kv(batch: int, heads: int, length: int, dim: int, capacity: int = 64) -> mx.array:
    """Keys or values as mlx-lm's KVCache hands them to attention: the first ``length`` positions
    of a larger buffer (a strided view)."""
    return mx.random.normal((batch, heads, capacity, dim))[:, :, :length, :]


@pytest.mark.parametrize("queries", [1, 4])
def test_attention_equals_mlx_with_every_mask_kind_and_grouped_heads(queries):
    mx.random.seed(2)
    batch, q_heads, kv_heads, keys, dim = 2, 9, 3, 40, 64
    q = mx.random.normal((batch, queries, q_heads, dim)).transpose(0, 2, 1, 3)
    k, v = _kv(batch, kv_heads, keys, dim), _kv(batch, kv_heads, keys, dim)
    masks = ["causal", mx.random.uniform(shape=(batch, 1, queries, keys)) > 0.3,
             mx.random.normal((batch, 1, queries, keys)), mx.random.normal((queries, keys))]
    if queries == 1:
        masks.insert(0, None)
    for mask in masks:
        got = ext.attention(q, k, v, 0.125, mask)
        assert primitive_counts(got)["MlxrtAttention"] == 1
        ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
        assert _rel(got, ref) < 1e-5, mask if isinstance(mask, str | None) else mask.dtype
    # a row whose keys are all masked out: MLX spreads its weight evenly, so does the primitive
    none = mx.zeros((batch, 1, queries, keys), dtype=mx.bool_)
    assert _rel(ext.attention(q, k, v, 0.125, none),
                mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=none)) < 1e-5


@pytest.mark.parametrize("q_heads,kv_heads,dim", [(9, 3, 64), (8, 8, 128), (20, 1, 80), (4, 2, 32), (4, 2, 12)])
def test_attention_over_many_keys_equals_mlx_and_a_left_padded_row_equals_the_row_alone(q_heads, kv_heads, dim):
    """The decode step's attention over a long context (the vectorized loop, both kernel threads
    for a lone query past 1 MB of keys and values): MLX's result within 1e-5, for several head
    shapes (80: not a multiple of 16; 12: not of 8, the portable loop; 20 heads on one key head:
    more than one group pass). A row of a left-padded batch (its first keys masked out) gets its
    own result alone bit for bit, which a seeded request's text under load depends on."""
    mx.random.seed(5)
    keys, pad = 3000, 37
    q = mx.random.normal((1, 1, q_heads, dim)).transpose(0, 2, 1, 3)
    k, v = _kv(1, kv_heads, keys, dim, capacity=keys + 256), _kv(1, kv_heads, keys, dim, capacity=keys + 256)
    alone = ext.attention(q, k, v, dim ** -0.5, None)
    assert primitive_counts(alone)["MlxrtAttention"] == 1
    assert _rel(alone, mx.fast.scaled_dot_product_attention(q, k, v, scale=dim ** -0.5)) < 1e-5
    # the same row second in a batch of two, behind `pad` masked keys; the first row is noise
    noise_q = mx.random.normal(q.shape)
    noise_k, noise_v = mx.random.normal((1, kv_heads, keys + pad, dim)), mx.random.normal((1, kv_heads, keys + pad, dim))
    bq = mx.concatenate([noise_q, q])
    bk = mx.concatenate([noise_k, mx.concatenate([mx.random.normal((1, kv_heads, pad, dim)), k], axis=2)])
    bv = mx.concatenate([noise_v, mx.concatenate([mx.random.normal((1, kv_heads, pad, dim)), v], axis=2)])
    keep = mx.concatenate([mx.ones((1, 1, 1, keys + pad), dtype=mx.bool_),
                           (mx.arange(keys + pad) >= pad).reshape(1, 1, 1, -1)])
    batched = ext.attention(bq, bk, bv, dim ** -0.5, keep)
    assert mx.array_equal(batched[1:], alone).item()


@pytest.mark.parametrize("mask", [None, "causal", "bool", "float"])
def test_long_prefill_attention_is_mlx_s_graph_with_the_fast_softmax_bit_for_bit(mask):
    """More queries than the primitive takes (a prefill chunk): MLX's own fallback graph, its
    softmax the MlxrtSoftmax primitive, so the result is mx.fast's bit for bit (grouped heads
    included); half precision goes to mx.fast itself."""
    mx.random.seed(3)
    queries, keys = ext.MAX_QUERIES + 24, ext.MAX_QUERIES + 61
    long_q = mx.random.normal((2, 6, queries, 32))
    k, v = _kv(2, 2, keys, 32, capacity=128), _kv(2, 2, keys, 32, capacity=128)
    m = {"bool": mx.random.uniform(shape=(2, 1, queries, keys)) > 0.3,
         "float": mx.random.normal((queries, keys))}.get(mask, mask)
    assert not ext.attention_supported(long_q, k, v)
    got = ext.attention(long_q, k, v, 0.2, m)
    ops = primitive_counts(got)
    assert "MlxrtAttention" not in ops and ops["MlxrtSoftmax"] == 1
    assert mx.array_equal(got, mx.fast.scaled_dot_product_attention(long_q, k, v, scale=0.2, mask=m)).item()
    half = long_q[:, :, :1].astype(mx.float16)
    assert not ext.attention_supported(half, k.astype(mx.float16), v.astype(mx.float16))
    h = ext.attention(long_q.astype(mx.float16), k.astype(mx.float16), v.astype(mx.float16), 0.2, "causal")
    assert "MlxrtSoftmax" not in primitive_counts(h)


@pytest.mark.parametrize("mask", ["causal", "bool", "float"])
def test_a_long_prompt_s_attention_goes_in_pieces_of_queries_with_mx_fast_s_bits(mask):
    """Scores of more than 32 MB (here 4 heads x 600 queries x 4,000 keys): the queries in pieces,
    each with its rows of the mask and, with a causal mask, only the keys its queries may see —
    mx.fast's result within 1e-6 (bit for bit with the bundled BLAS and MKL; OpenBLAS's products
    round differently with fewer rows, ~4e-7), with less memory."""
    mx.random.seed(6)
    queries, keys = 600, 4000
    q = mx.random.normal((1, 4, queries, 32))
    k, v = mx.random.normal((1, 2, keys, 32)), mx.random.normal((1, 2, keys, 32))
    m = {"bool": mx.random.uniform(shape=(1, 1, queries, keys)) > 0.2,
         "float": mx.random.normal((queries, keys))}.get(mask, mask)
    got = ext.attention(q, k, v, 0.17, m)
    assert primitive_counts(got)["MlxrtSoftmax"] == 2
    assert _rel(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.17, mask=m)) < 1e-6


@pytest.mark.parametrize("shape,start", [((2, 3, 37, 50), 13), ((4, 300, 400), 100), ((5, 20), 0), ((1, 9, 64), 3)])
def test_a_causal_softmax_equals_mlx_s_mask_where_and_softmax_bit_for_bit(shape, start):
    """softmax(x, causal_start): query i of the last-but-one axis sees keys up to start + i — MLX's
    softmax of where(mask, x, finfo.min), bit for bit (over the kernel's threads when the rows are
    many: 1,200 rows of 400 keys), masked keys exact zeros; float16 goes to MLX's own ops."""
    mx.random.seed(7)
    x = mx.random.normal(shape) * 4
    queries, keys = shape[-2], shape[-1]
    mask = (mx.arange(start, start + queries)[:, None] >= mx.arange(keys)[None])
    ref = mx.softmax(mx.where(mask, x, mx.array(np.finfo(np.float32).min, mx.float32)), axis=-1, precise=True)
    got = ext.softmax(x, causal_start=start)
    assert primitive_counts(got)["MlxrtSoftmax"] == 1 and "Select" not in primitive_counts(got)
    assert mx.array_equal(got, ref).item()
    h = x.astype(mx.float16)
    ref16 = mx.softmax(mx.where(mask, h, mx.array(np.finfo(np.float16).min, mx.float16)), axis=-1, precise=True)
    assert mx.array_equal(ext.softmax(h, causal_start=start), ref16).item()


def test_softmax_equals_mlx_bit_for_bit():
    """mx.softmax over the last axis, MLX's float32 bits: rows of every length mod 8, infinities,
    a row of one element, huge and tiny values; float16 goes to mx.softmax."""
    mx.random.seed(4)
    for shape in [(3, 7), (2, 5, 8), (4, 3, 37), (9, 64, 1000), (1, 1), (2, 17), (5000, 3)]:
        x = mx.random.normal(shape) * 7
        got = ext.softmax(x)
        assert primitive_counts(got)["MlxrtSoftmax"] == 1
        assert mx.array_equal(got, mx.softmax(x, axis=-1, precise=True)).item(), shape
    x = mx.array([[0.0, -mx.inf, 1.0, -1e30, 100.0, 3.0, 2.0, 1.0, 0.5], [-90.0, 0.0, 90.0, 1e-30, -1e-30, 7, 8, 9, 10]])
    assert mx.array_equal(ext.softmax(x), mx.softmax(x, axis=-1)).item()
    h = mx.random.normal((3, 9)).astype(mx.float16)
    assert "MlxrtSoftmax" not in primitive_counts(ext.softmax(h))
    assert mx.array_equal(ext.softmax(h), mx.softmax(h, axis=-1, precise=True)).item()


def _tiny(model_type: str) -> nn.Module:
    if model_type == "qwen3":  # q_norm / k_norm: RMSNorms inside attention too
        from mlx_lm.models import qwen3 as arch

        args = arch.ModelArgs(model_type="qwen3", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=512,
                              max_position_embeddings=512, rope_theta=1e6, head_dim=32, tie_word_embeddings=True)
    else:
        from mlx_lm.models import llama as arch

        args = arch.ModelArgs(model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=512,
                              tie_word_embeddings=True)
    mx.random.seed(4)
    model = arch.Model(args)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def _greedy(model: nn.Module, prompt: list[int], n: int) -> tuple[list[int], Counter]:
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    tokens, out, ops = mx.array([prompt]), [], Counter()
    for _ in range(n):
        nxt = mx.argmax(model(tokens, cache=cache)[:, -1, :], axis=-1)
        ops = primitive_counts(nxt)
        out.append(int(nxt.item()))
        tokens = mx.array([[out[-1]]])
    return out, ops


def _batched(model: nn.Module, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy tokens of several prompts decoded as one left-padded batch (mlx-lm's BatchKVCache:
    a bool mask and one rope offset per row)."""
    from mlx_lm.models.cache import BatchKVCache

    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    cache = [BatchKVCache(pads) for _ in model.layers]
    tokens = mx.array([[0] * pad + p for pad, p in zip(pads, prompts, strict=True)])
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(n):
        nxt = mx.argmax(model(tokens, cache=cache)[:, -1, :], axis=-1)
        for row, t in zip(out, nxt.tolist(), strict=True):
            row.append(t)
        tokens = nxt[:, None]
    return out


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_install_fused_keeps_greedy_tokens_and_cuts_a_decode_step_s_ops(model_type):
    model = _tiny(model_type)
    prompt = list(range(7, 27))
    prompts = [list(range(3, 15)), list(range(40, 60)), [9, 8, 7]]
    before, ops_before = _greedy(model, prompt, 10)
    batch_before = _batched(model, prompts, 6)
    swapped = qmv.install_fused(model)
    norms = 2 * (2 + (2 if model_type == "qwen3" else 0)) + 1  # per block 2 (+ q/k norms), the final norm
    assert swapped == norms + 2 + 2  # and one RoPE and one attention (mlxrt.engine.one_token) per block
    kinds = {type(m).__name__ for _, m in model.named_modules()}
    assert {"FusedRMSNorm", "FusedRoPE"} <= kinds and "RMSNorm" not in kinds
    after, ops_after = _greedy(model, prompt, 10)
    assert after == before
    assert _batched(model, prompts, 6) == batch_before
    # a lone decode step's attention is three primitives a layer (mlxrt.engine.one_token with the
    # kernel's decode_attention): the key's and the value's writes, the attention
    assert ops_after["MlxrtDecodeAttention"] == 2 and ops_after["MlxrtCacheWrite"] == 4
    assert ops_after["MlxrtRmsNorm"] == norms
    assert not {"Sin", "Cos", "Rsqrt", "Softmax", "Transpose", "Contiguous", "MlxrtRope", "MlxrtAttention",
                "SliceUpdate", "Slice"} & set(ops_after)
    assert sum(ops_after.values()) * 2 < sum(ops_before.values()), (ops_before, ops_after)
    # a second install finds nothing left to swap and routes attention once
    assert qmv.install_fused(model) == 0


def test_a_long_prompt_through_the_fused_model_matches_mlx_s_own_path():
    """A 2,100-token prompt prefilled in chunks of 2,048 (the engine's) through the swapped-in
    primitives: the first chunk's attention in pieces of queries with the causal softmax, the
    second whole, then decode steps over 2,100 keys — the same logits as mlx-lm's own path (MLX's
    fallback graph and softmax) within 1e-5, and the same greedy tokens."""
    from mlx_lm.models.cache import make_prompt_cache

    model = _tiny("llama")
    prompt = [(i * 37) % 500 + 3 for i in range(2100)]

    def run() -> tuple[mx.array, list[int]]:
        cache = make_prompt_cache(model)
        model(mx.array([prompt[:2048]]), cache=cache)
        logits = model(mx.array([prompt[2048:]]), cache=cache)[:, -1, :]
        first = logits
        out = []
        for _ in range(4):
            out.append(int(mx.argmax(logits, axis=-1).item()))
            logits = model(mx.array([[out[-1]]]), cache=cache)[:, -1, :]
        return first, out

    ref_logits, ref_tokens = run()
    qmv.install_fused(model)
    chunk = model(mx.array([prompt[:2048]]), cache=make_prompt_cache(model))
    assert primitive_counts(chunk)["MlxrtSoftmax"] == 2 * 2  # two layers, two pieces each
    logits, tokens = run()
    assert _rel(logits, ref_logits) < 1e-5
    assert tokens == ref_tokens


def test_route_attention_replaces_mlx_lm_s_attention_once_and_falls_back_for_quantized_caches():
    from mlx_lm.models import base, llama
    from mlx_lm.models.cache import QuantizedKVCache

    model = _tiny("llama")
    qmv.install_fused(model)
    routed = llama.scaled_dot_product_attention
    assert routed.__wrapped__ is base.scaled_dot_product_attention
    assert compat.route_attention(model, lambda original: original) == 1 and llama.scaled_dot_product_attention is routed
    # a quantized KV cache keeps mlx-lm's quantized attention
    cache = [QuantizedKVCache(group_size=32, bits=8) for _ in model.layers]
    logits = model(mx.array([[1, 2, 3]]), cache=cache)
    assert logits.shape == (1, 3, 512) and mx.isfinite(logits).all().item()


def test_install_fused_computes_gemma_s_norms_through_the_kernel():
    # mlx-lm's Gemma RMSNorm (its weight stored less one) is its own class: without the swap each
    # of its norms is MLX's ~11-op fallback graph on the CPU
    from mlx_lm.models import gemma3_text as arch

    args = arch.ModelArgs(model_type="gemma3_text", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=512,
                          sliding_window=8, sliding_window_pattern=2, query_pre_attn_scalar=32)
    mx.random.seed(4)
    model = arch.Model(args)
    nn.quantize(model, group_size=32, bits=4)
    for _, layer in model.named_modules():  # weights away from zero, so that the stored offset shows
        if isinstance(layer, arch.RMSNorm):
            layer.weight = mx.random.normal(layer.weight.shape) * 0.5
    mx.eval(model.parameters())
    prompt = mx.array([[5, 9, 17, 3, 44, 2, 8, 9, 10, 11]])
    ref, ops_before = model(prompt), primitive_counts(model(prompt))
    norms = sum(isinstance(layer, arch.RMSNorm) for _, layer in model.named_modules())
    qmv.install_fused(model)
    assert sum(type(layer).__name__ == "FusedOffsetRMSNorm" for _, layer in model.named_modules()) == norms
    got = model(prompt)
    ops = primitive_counts(got)
    assert _rel(got, ref) < 1e-4
    assert ops["MlxrtRmsNorm"] == norms and not {"Rsqrt", "Square"} & set(ops) and {"Rsqrt"} <= set(ops_before)
    # 1 + weight is computed once, not in each forward, and again when a weight array is replaced
    assert primitive_counts(model(prompt))["Add"] == ops["Add"] - norms
    norm, x = model.model.norm, mx.random.normal((3, 128))
    assert _rel(norm(x), mx.fast.rms_norm(x, 1.0 + norm.weight, norm.eps)) < 1e-6
    norm.weight = norm.weight * 3.0
    assert _rel(norm(x), mx.fast.rms_norm(x, 1.0 + norm.weight, norm.eps)) < 1e-6
