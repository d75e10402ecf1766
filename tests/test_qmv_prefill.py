"""Newcomers prefilled together (:mod:`mlxrt.engine.batch_steps`) on a model whose products are
the mlxrt-qmv kernel's 8-bit ones: one model call for the group, and every row's tokens and
log-probabilities bit for bit those it gets when it comes alone — the batch invariance a seeded
request's text depends on (tests/test_batching.py). Skips where the kernel is not built or runs
a path without it (MLXRT_QMV_EXACT=1: more than 32 rows then go through the BLAS)."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

try:
    import mlxrt_qmv as qmv_ext
except ImportError:
    qmv_ext = None
pytestmark = pytest.mark.skipif(qmv_ext is None or qmv_ext.MAX_ROWS < 4096,
                                reason="the mlxrt-qmv kernel with its 8-bit products is not active")

#: Prompts of 40, 9, 23, 1, 57 and 33 tokens: chunks under and over the attention primitive's 16
#: queries, one left entirely to the batch.
PROMPTS = [[(7 * i + 3 * k) % 90 + 5 for i in range(n)] for k, n in enumerate((40, 9, 23, 1, 57, 33))]


@pytest.fixture(scope="module")
def model():
    import mlx.nn as nn
    from mlx_lm.models import llama

    from mlxrt.engine import qmv

    args = llama.ModelArgs(model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=512,
                           tie_word_embeddings=True)
    mx.random.seed(5)
    m = llama.Model(args)
    nn.quantize(m, group_size=32, bits=4)
    m.model.embed_tokens = nn.QuantizedEmbedding.from_embedding(nn.Embedding(512, 128), group_size=32, bits=8)
    mx.eval(m.parameters())
    assert not qmv.rows_invariant(m)  # not before the kernel computes its layers
    qmv.install(m)
    qmv.install_fused(m)
    return m


class _Calls:
    """The model, recording the shape of each prefill call (more than one token a row)."""

    def __init__(self, model):
        self.model = model
        self.prefills: list[tuple[int, int]] = []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, inputs, *args, **kwargs):
        if inputs.shape[1] > 1:
            self.prefills.append(tuple(inputs.shape))
        return self.model(inputs, *args, **kwargs)


def _run(model, prompts, *, caches=None, held=None, together=None, max_tokens=6, step=64):
    from mlxrt.engine.batch_steps import BatchSteps

    stream = mx.default_stream(mx.default_device())
    gen = BatchSteps(model, completion_batch_size=8, prefill_batch_size=8, prefill_step_size=step, stream=stream)
    if together is not None:
        gen._together = together
    uids = gen.insert(prompts, max_tokens=[max_tokens] * len(prompts), caches=caches, all_tokens=held)
    got = {uid: [] for uid in uids}
    done: set[int] = set()
    while len(done) < len(uids):
        for r in gen.next()[1]:
            got[r.uid].append((r.token, r.logprobs))
            if r.finish_reason is not None:
                done.add(r.uid)
    gen.close()
    return [got[uid] for uid in uids]


def _same_bits(a, b):
    assert [t for t, _ in a] == [t for t, _ in b]
    for (_, x), (_, y) in zip(a, b, strict=True):
        assert mx.array_equal(x, y).item()


def test_the_kernel_s_model_is_row_invariant_and_a_float_one_is_not(model, tmp_path):
    from mlx_lm.utils import load_model

    from mlxrt.engine import qmv
    from mlxrt.testing import write_tiny_checkpoint

    assert qmv.rows_invariant(model)
    assert not qmv.rows_invariant(_Calls(model))  # a wrapper (the lane's adapter model): not known
    float_model, _ = load_model(write_tiny_checkpoint(tmp_path / "f", "llama"))
    qmv.install(float_model)
    qmv.install_fused(float_model)
    assert not qmv.rows_invariant(float_model)  # its products go through the BLAS


def test_newcomers_prefilled_together_get_the_bits_they_get_alone(model):
    alone = [_run(model, [p], step=256)[0] for p in PROMPTS]
    calls = _Calls(model)
    together = _run(calls, PROMPTS, together=True, step=256)
    # one call for the chunks at least half the longest (56, 39, 32 tokens before each last
    # one), the shorter ones (22, 8) alone
    assert sorted(calls.prefills) == [(1, 8), (1, 22), (3, 56)], calls.prefills
    for a, b in zip(alone, together, strict=True):
        _same_bits(a, b)


def test_newcomers_with_prompt_cache_hits_prefilled_together_keep_their_bits(model):
    from mlx_lm.models.cache import make_prompt_cache

    prompts = [PROMPTS[4][:50], PROMPTS[0][:28], PROMPTS[2][:20]]
    held = [30, 12, 0]

    def caches():
        out = []
        for prompt, n in zip(prompts, held, strict=True):
            cache = make_prompt_cache(model)
            if n:
                model(mx.array(prompt[:n])[None], cache=cache)
                mx.eval([layer.state for layer in cache])
            out.append(cache)
        return out

    rests = [p[n:] for p, n in zip(prompts, held, strict=True)]
    heads = [p[:n] for p, n in zip(prompts, held, strict=True)]
    made = caches()
    alone = [_run(model, [r], caches=[c], held=[h])[0] for r, c, h in zip(rests, made, heads, strict=True)]
    calls = _Calls(model)
    together = _run(calls, rests, caches=caches(), held=heads, together=True)
    assert calls.prefills == [(3, 19)]  # 19, 15 and 19 new tokens before each last one, left-padded caches
    for a, b in zip(alone, together, strict=True):
        _same_bits(a, b)


@pytest.fixture(scope="module")
def q4_checkpoint(tmp_path_factory):
    """A tiny qwen3 checkpoint quantized to 4 bits, group 32, as mlx-lm saves one."""
    import shutil

    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    from mlxrt.testing import write_tiny_checkpoint

    src = write_tiny_checkpoint(tmp_path_factory.mktemp("f32") / "qwen3", "qwen3")
    folder = tmp_path_factory.mktemp("q4") / "qwen3-q4"
    loaded, config = load_model(src)
    loaded, config = quantize_model(loaded, config, group_size=32, bits=4)
    save_model(folder, loaded)
    save_config(config, folder / "config.json")
    for f in src.iterdir():
        if f.suffix in (".json", ".jinja") and not (folder / f.name).exists():
            shutil.copy(f, folder / f.name)
    return folder


def test_seeded_requests_that_come_together_return_their_text_alone(q4_checkpoint, server_process):
    """Served: eight seeded, sampled requests sent at once (prefilled together) each return the
    text it returns alone."""
    import concurrent.futures as cf

    import openai

    server = server_process([str(q4_checkpoint), "--dtype", "stored", "--prompt-cache-size", "0"])
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    prompts = [" ".join(f"word{(7 * i + k) % 50}" for i in range(10 + 3 * k)) for k in range(8)]

    def chat(i: int) -> str:
        out = client.chat.completions.create(model="default", messages=[{"role": "user", "content": prompts[i]}],
                                             max_tokens=20, temperature=1.0, seed=100 + i)
        return out.choices[0].message.content

    alone = [chat(i) for i in range(8)]
    assert len(set(alone)) > 1
    with cf.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(chat, range(8)))
    assert together == alone


@pytest.mark.parametrize("bits", [5, 6, 3, 2])
def test_a_k_quant_conversion_s_other_widths(bits):
    """A GGUF K-quant conversion's 5-, 6- or 3-bit group-32 layers beside 4-bit ones: the 8-bit
    kernels compute them too (their portable loops, the same 8-bit x), each row's bits its own,
    so such a model still prefills newcomers together; 2-bit layers (and every other width on
    the AVX2 and exact kernels) stay MLX's own layers, and the model then prefills one at a time."""
    import mlx.nn as nn

    from mlxrt.engine import qmv

    def model(other_bits):
        mx.random.seed(bits)
        seq = nn.Sequential(nn.Linear(128, 96, bias=False), nn.RMSNorm(96), nn.Linear(96, 64, bias=False))
        nn.quantize(seq, group_size=32, bits=4)
        seq.layers[2] = nn.QuantizedLinear.from_linear(nn.Linear(96, 64, bias=False), group_size=32,
                                                       bits=other_bits)
        return seq

    plain = model(4)
    assert qmv.install(plain) == 2 and qmv.install_fused(plain) == 1 and qmv.rows_invariant(plain)
    seq = model(bits)
    x = mx.random.normal((70, 128))
    before = seq(x)
    ours = bits in qmv_ext.BITS
    assert qmv.install(seq) == (2 if ours else 1) and qmv.install_fused(seq) == 1
    assert (type(seq.layers[2]) is nn.QuantizedLinear) is not ours
    got = seq(x)
    assert mx.allclose(got, before, rtol=0.05, atol=0.05).item()
    assert qmv.rows_invariant(seq) is ours
    if ours:
        for i in (0, 33, 69):
            assert mx.array_equal(seq(x[i:i + 1]), got[i:i + 1]).item()
    w, s, b = seq.layers[2]["weight"], seq.layers[2]["scales"], seq.layers[2]["biases"]
    h = mx.random.normal((2, 96))
    assert qmv_ext.supported(h, w, 32, bits) is ours
    if not ours:  # MLX's op itself
        ref = mx.quantized_matmul(h, w, s, b, transpose=True, group_size=32, bits=bits)
        assert mx.array_equal(qmv_ext.quantized_matmul(h, w, s, b, 32, bits), ref).item()
