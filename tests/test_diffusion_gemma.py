"""DiffusionGemma: the MLX port against transformers, and chat completions through the denoising lane."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import openai
import pytest
from support import openai_client

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
CANVAS = 16  # the tiny checkpoint's canvas_length
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


def _golden_module():
    spec = importlib.util.spec_from_file_location("make_diffusion_gemma_golden",
                                                  GOLDEN_DIR / "make_diffusion_gemma_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mlx_figures(path: Path, inputs) -> dict[str, np.ndarray]:
    """The reference script's figures, computed by the MLX port."""
    import json

    import mlx.core as mx

    from mlxrt.families.diffusion_gemma.generation import entropy_bound_accept, token_entropy
    from mlxrt.families.diffusion_gemma.model import EncoderCache, load_text_model

    g = _golden_module()
    model = load_text_model(path, json.loads((path / "config.json").read_text()))
    cache = EncoderCache(model.args)
    model.encode([int(t) for t in inputs["prompt"]], cache)
    canvas = mx.array(np.asarray(inputs["canvas"])[None].astype(np.int32))
    step1 = model.decode(canvas, cache)
    processed1 = step1 / g.schedule_temperature(g.STEPS)
    out = {"accept1": np.array(entropy_bound_accept(token_entropy(processed1), 0.1))[0]}
    step2 = model.decode(canvas, cache, processed1)
    block = mx.argmax(step2, axis=-1)
    out["block"] = np.array(block[0])
    model.encode(block[0], cache)
    step3 = model.decode(mx.array(np.asarray(inputs["canvas2"])[None].astype(np.int32)), cache)
    cols = np.asarray(inputs["columns"])
    for name, logits in (("step1", step1), ("step2", step2), ("step3", step3)):
        out.update(g.summarize(name, np.array(logits[0]), cols))
    return out


def _compare(ours: dict, ref, *, text_atol: float = 2e-4, sc_atol: float = 5e-3) -> None:
    for step, atol in (("step1", text_atol), ("step2", sc_atol), ("step3", text_atol)):
        np.testing.assert_allclose(ours[f"{step}_cols"], ref[f"{step}_cols"], atol=atol, rtol=0, err_msg=step)
        np.testing.assert_allclose(ours[f"{step}_lse"], ref[f"{step}_lse"], atol=atol, rtol=0, err_msg=step)
        np.testing.assert_array_equal(ours[f"{step}_argmax"], ref[f"{step}_argmax"], err_msg=step)
    np.testing.assert_array_equal(ours["accept1"], ref["accept1"])
    np.testing.assert_array_equal(ours["block"], ref["block"])


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory) -> Path:
    from mlxrt.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("dg") / "dg", "diffusion_gemma_no_vision")


def test_port_matches_transformers_goldens(text_checkpoint):
    """Prompt longer than the sliding window; self-conditioned step; continuation canvas."""
    ref = np.load(GOLDEN_DIR / "diffusion_gemma_text.npz")
    ours = _mlx_figures(text_checkpoint, ref)
    _compare(ours, ref)
    assert ref["accept1"].sum() >= 1 and not ref["accept1"].all()  # the sampler made a real choice


def test_port_matches_transformers_live(text_checkpoint):
    pytest.importorskip("torch")
    g = _golden_module()
    ref = g.reference(text_checkpoint)
    _compare(_mlx_figures(text_checkpoint, ref), ref)


def test_golden_comparison_fails_on_a_wrong_model(text_checkpoint, tmp_path):
    """The comparison is sharp: another seed's weights do not pass it."""
    from mlxrt.testing import write_tiny_checkpoint

    other = write_tiny_checkpoint(tmp_path / "other", "diffusion_gemma_no_vision", seed=1)
    ref = np.load(GOLDEN_DIR / "diffusion_gemma_text.npz")
    with pytest.raises(AssertionError):
        _compare(_mlx_figures(other, ref), ref)


# -- serving ---------------------------------------------------------------------------------------


@pytest.fixture
def dg_client(mlxrt_tiny_checkpoint, mlxrt_serve):
    return mlxrt_serve(mlxrt_tiny_checkpoint("diffusion_gemma_no_vision"), options={"batch": 4})


def _chat(client, **kw):
    return openai_client(client).chat.completions.create(model="tiny", messages=MESSAGES, **kw)


def test_chat_completion_non_stream(dg_client):
    r = _chat(dg_client, max_tokens=20, seed=7)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 20
    assert r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 20
    assert r.choices[0].message.content
    again = _chat(dg_client, max_tokens=20, seed=7)
    assert again.choices[0].message.content == r.choices[0].message.content  # seeded: reproducible
    other = _chat(dg_client, max_tokens=20, seed=8)
    assert other.choices[0].message.content != r.choices[0].message.content
    assert _chat(dg_client, max_tokens=4, seed=-3).usage.completion_tokens == 4  # negative seeds work
    warm = [_chat(dg_client, max_tokens=20, seed=7, temperature=1.0).choices[0].message.content for _ in range(2)]
    assert warm[0] == warm[1] != r.choices[0].message.content  # sampled denoising: seeded, and not argmax
    assert _chat(dg_client, max_tokens=4, seed=2**64 + 5).usage.completion_tokens == 4


def test_stream_emits_one_delta_per_settled_block(dg_client):
    max_tokens = 40
    chunks = list(_chat(dg_client, max_tokens=max_tokens, seed=3, stream=True,
                        stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    blocks = math.ceil(max_tokens / CANVAS)  # 16 + 16 + 8 tokens
    # one delta per block, plus at most the detokenizer's held-back tail in the finish frame
    # (token by token it would be ~40)
    assert blocks <= len(deltas) <= blocks + 1
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].usage.completion_tokens == max_tokens
    whole = _chat(dg_client, max_tokens=max_tokens, seed=3)
    assert "".join(deltas) == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_string_ends_the_answer(dg_client):
    text = _chat(dg_client, max_tokens=48, seed=5).choices[0].message.content
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip() and text.index(stop) > 0
    r = _chat(dg_client, max_tokens=48, seed=5, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[:text.index(stop)]
    assert r.usage.completion_tokens < 48
    streamed = list(_chat(dg_client, max_tokens=48, seed=5, stop=[stop], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text[:text.index(stop)]


def test_serial_lane_no_prompt_cache_and_refusals(dg_client):
    with pytest.raises(openai.BadRequestError) as err:
        _chat(dg_client, max_tokens=8, logprobs=True, top_logprobs=2)
    assert "denoising model" in str(err.value)
    resp = dg_client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 8})
    assert resp.status_code == 200  # still serving after the refusal
    assert resp.headers["x-mlxrt-cache"].startswith("off")
    stats = dg_client.get("/stats").json()["engine"]
    assert stats["lane"] == "serial"  # --batch 4 was asked for: a denoising model does not batch
    assert stats["prompt_cache"]["entries"] == 0


def test_generator_cuts_the_block_after_eos():
    """A block is cut after its first end-of-sequence id, and generation ends there."""
    import attrs

    from mlxrt.families.diffusion_gemma.generation import DiffusionGenerator
    from mlxrt.records import GenerationRequest

    class Gen(DiffusionGenerator):
        def _denoise(self, cache, key, temperature, should_cancel):
            return [7, 8, 1, 9] + [10] * (CANVAS - 4)

    class Model:
        args = attrs.make_class("A", {"canvas_length": attrs.field(default=CANVAS),
                                      "num_layers": attrs.field(default=1)})()

        def encode(self, *a, **k):
            pass

    gen = Gen(Model(), None, eos=[1])
    blocks = list(gen.generate([2, 3], GenerationRequest("r", (2, 3), max_tokens=100), lambda: False))
    assert blocks == [[7, 8, 1]]
    blocks = list(Gen(Model(), None, eos=[99]).generate([2], GenerationRequest("r", (2,), max_tokens=20),
                                                         lambda: False))
    assert [len(b) for b in blocks] == [16, 4]


# -- vision ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vision_checkpoint(tmp_path_factory) -> Path:
    from mlxrt.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("dgv") / "dgv", "diffusion_gemma")


def _adapter(path: Path):
    import functools
    import json

    from mlxrt.families.diffusion_gemma.model import load_text_model
    from mlxrt.families.diffusion_gemma.vision import DiffusionVision

    config = json.loads((path / "config.json").read_text())
    proc_file = path / "processor_config.json"
    proc = json.loads(proc_file.read_text())["image_processor"] if proc_file.is_file() else {}
    model = functools.cache(lambda: load_text_model(path, config))
    return DiffusionVision(path, config, proc, model=model), config


def _image_rows(spliced, config) -> np.ndarray:
    return np.array(spliced.embeddings)[np.array(spliced.ids) == config["image_token_id"]]


def _vision_figures(path: Path, ref) -> dict[str, np.ndarray]:
    import json

    import mlx.core as mx

    from mlxrt.families.diffusion_gemma.generation import DenoiseSchedule, DiffusionGenerator
    from mlxrt.families.diffusion_gemma.model import EncoderCache, load_text_model

    g = _golden_module()
    adapter, config = _adapter(path)
    spliced = adapter.splice(g.VISION_HEAD + [config["image_token_id"]] + g.VISION_TAIL, [g.sample_image()])
    model = load_text_model(path, json.loads((path / "config.json").read_text()))
    cache = EncoderCache(model.args)
    DiffusionGenerator(model, DenoiseSchedule(), [1])._prefill(spliced, cache)
    logits = model.decode(mx.array(np.asarray(ref["canvas"])[None].astype(np.int32)), cache)
    return {"ids": np.array(spliced.ids), "features": _image_rows(spliced, config),
            **g.summarize("image", np.array(logits[0]), np.asarray(ref["columns"]))}


def _compare_vision(ours, ref) -> None:
    np.testing.assert_array_equal(ours["ids"], ref["ids"])
    np.testing.assert_allclose(ours["features"], ref["features"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(ours["image_cols"], ref["image_cols"], atol=5e-3, rtol=0)
    np.testing.assert_allclose(ours["image_lse"], ref["image_lse"], atol=5e-3, rtol=0)
    np.testing.assert_array_equal(ours["image_argmax"], ref["image_argmax"])


def test_vision_matches_transformers_goldens(vision_checkpoint):
    """Processor, tower, projector and the encoder's bidirectional image block, as generate() runs them."""
    ref = np.load(GOLDEN_DIR / "diffusion_gemma_vision.npz")
    ours = _vision_figures(vision_checkpoint, ref)
    _compare_vision(ours, ref)
    text_only = np.load(GOLDEN_DIR / "diffusion_gemma_text.npz")  # same canvas, no image
    assert np.abs(ref["image_cols"] - text_only["step1_cols"]).max() > 0.1


def test_vision_matches_transformers_live(vision_checkpoint):
    torch = pytest.importorskip("torch")
    from transformers import DiffusionGemmaForBlockDiffusion

    _, info = DiffusionGemmaForBlockDiffusion.from_pretrained(str(vision_checkpoint), dtype=torch.float32,
                                                              output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])  # the real layout
    ref = _golden_module().reference_vision(vision_checkpoint)
    _compare_vision(_vision_figures(vision_checkpoint, ref), ref)


def test_image_changes_the_generation(vision_checkpoint):
    import json

    from mlxrt.families.diffusion_gemma.generation import DenoiseSchedule, DiffusionGenerator
    from mlxrt.families.diffusion_gemma.model import load_text_model
    from mlxrt.records import GenerationRequest, SamplingParams

    g = _golden_module()
    adapter, config = _adapter(vision_checkpoint)
    prompt = g.VISION_HEAD + [config["image_token_id"]] + g.VISION_TAIL
    spliced = adapter.splice(prompt, [g.sample_image()])
    model = load_text_model(vision_checkpoint, json.loads((vision_checkpoint / "config.json").read_text()))
    gen = DiffusionGenerator(model, DenoiseSchedule(max_denoising_steps=4), [1])
    request = GenerationRequest("r", spliced.ids, max_tokens=16, sampling=SamplingParams(seed=1))
    with_image = list(gen.generate(spliced, request, lambda: False))
    without = list(gen.generate(list(spliced.ids), request, lambda: False))
    assert with_image and with_image != without


def test_image_rules(vision_checkpoint, mlxrt_tiny_checkpoint):
    from PIL import Image

    from mlxrt.errors import InvalidRequest

    adapter, config = _adapter(vision_checkpoint)
    img = Image.new("RGB", (64, 48), (200, 10, 10))
    prompt = [2, 300, config["image_token_id"], 301]
    with pytest.raises(InvalidRequest, match="^DiffusionGemma image input supports exactly one image$"):
        adapter.splice(prompt, [img, img])
    with pytest.raises(InvalidRequest, match="exactly one image"):
        adapter.splice(prompt, [])
    assert adapter._tower is None  # refused before the tower loaded
    spliced = adapter.splice(prompt, [img])
    assert adapter._tower is not None and spliced.images == 1
    assert len(spliced.ids) == spliced.embeddings.shape[0]  # the SplicedPrompt contract
    assert spliced.ids.count(config["image_token_id"]) == _image_rows(spliced, config).shape[0] > 0
    with pytest.raises(InvalidRequest, match="exactly one image placeholder"):
        adapter.splice([2, 300, 301], [img])
    bare, _ = _adapter(mlxrt_tiny_checkpoint("diffusion_gemma_no_vision"))
    with pytest.raises(InvalidRequest, match="^this checkpoint has no vision tower$") as err:
        bare.splice(prompt, [img])
    assert err.value.status == 400


def test_text_only_serving_never_loads_the_tower(mlxrt_tiny_checkpoint, mlxrt_serve):
    client = mlxrt_serve(mlxrt_tiny_checkpoint("diffusion_gemma"))
    assert _chat(client, max_tokens=8).choices[0].message.content is not None
    model = openai_client(client).models.list().data[0]
    assert model.model_extra.get("vision") is True
    assert client.app.state.models.primary.engine.profile.vision._tower is None


# -- the denoising lane ----------------------------------------------------------------------------


class _Blocks:
    """A scripted Denoiser: yields the given blocks; records cancellation polls and closing."""

    def __init__(self, blocks, on_block=None):
        self.blocks, self.on_block, self.closed = blocks, on_block, False

    def generate(self, prompt, request, should_cancel):
        try:
            for i, block in enumerate(self.blocks):
                if should_cancel():
                    return
                yield block
                if self.on_block:
                    self.on_block(i)
        finally:
            self.closed = True


def _run_lane(denoiser, *, max_tokens=64, stop=(), deadline=None):
    import threading

    from mlxrt.engine.denoising_lane import DenoisingLane
    from mlxrt.engine.lanes import Job, Row
    from mlxrt.records import CacheReport, GenerationRequest
    from mlxrt.text.detokenize import Detokenizer
    from mlxrt.text.stops import StopMatcher

    events, ended = [], []
    job = Job(GenerationRequest("r", (1, 2, 3), max_tokens=max_tokens, stop=tuple(stop)), deliver=events.append,
              cancelled=threading.Event(), deadline=deadline)
    row = Row(job=job, sampler=None, processors=[], report=CacheReport("off", 0, 3), cache=None, reused=0,
              eos=frozenset({0}), detok=Detokenizer(lambda ids: "".join(chr(96 + i) for i in ids)),
              stops=StopMatcher(tuple(stop)), timeout=1.0)
    lane = DenoisingLane(denoiser, done=lambda r, reason, cache, tokens: ended.append(reason), tick=lambda n: None)
    return lane, row, job, events, ended


def test_lane_streams_blocks_and_stops_at_eos():
    from mlxrt.records import FinishEvent, FinishReason

    denoiser = _Blocks([[1, 2, 3], [4, 0, 5], [6]])
    lane, row, _job, events, ended = _run_lane(denoiser)
    lane.run(row)
    row.finish(ended[0])
    assert [e.text for e in events[:-1]] == ["abc", "d"]
    assert ended == [FinishReason.STOP] and denoiser.closed
    assert isinstance(events[-1], FinishEvent) and events[-1].completion_tokens == 5  # EOS counts


def test_lane_stop_string_inside_a_block():
    from mlxrt.records import FinishReason

    lane, row, _job, events, ended = _run_lane(_Blocks([[1, 2], [3, 4, 5]]), stop=["cd"])
    lane.run(row)
    row.finish(ended[0])
    assert "".join(e.text for e in events) == "ab" and ended == [FinishReason.STOP]
    assert events[-1].stop_sequence == "cd"


def test_lane_cancel_between_blocks_closes_the_generator():
    from mlxrt.records import FinishReason

    holder = {}
    denoiser = _Blocks([[1], [2], [3]], on_block=lambda i: holder["job"].cancelled.set())
    lane, row, job, events, ended = _run_lane(denoiser)
    holder["job"] = job
    lane.run(row)
    assert ended == [FinishReason.CANCELLED] and denoiser.closed and len(events) == 1


def test_lane_timeout_is_a_504():
    import time

    from mlxrt.engine.lanes import RequestTimeout
    from mlxrt.records import FinishReason

    lane, row, _job, events, ended = _run_lane(_Blocks([[1], [2]]), deadline=time.monotonic() - 1)
    lane.run(row)
    row.finish(ended[0])
    assert ended == [FinishReason.CANCELLED] and isinstance(events[-1], RequestTimeout)
    assert events[-1].status == 504


def test_anthropic_messages_through_the_denoising_lane(dg_client):
    from support import anthropic_client

    client = anthropic_client(dg_client)
    # Anthropic Messages has no seed: an unseeded canvas may settle an EOS early, so assert only
    # what holds for every sample (a stop reason that matches the token count).
    msg = client.messages.create(model="tiny", max_tokens=20, messages=MESSAGES)
    _assert_stop_matches_usage(msg)
    with client.messages.stream(model="tiny", max_tokens=20, messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    _assert_stop_matches_usage(final)
    assert text or final.stop_reason == "end_turn"


def _assert_stop_matches_usage(msg, max_tokens: int = 20) -> None:
    assert msg.stop_reason in {"max_tokens", "end_turn"}
    if msg.stop_reason == "max_tokens":
        assert msg.usage.output_tokens == max_tokens
    else:
        assert msg.usage.output_tokens <= max_tokens


def test_bfloat16_checkpoint_decodes(tmp_path):
    """A bf16 checkpoint loads in bf16 and decodes on the CPU (whose gather_mm is float32-only).
    (Its logits are not compared with float32: on this random model transformers' own bf16
    run is as far from its float32 one, ~7 in max logit.)"""
    import json

    import mlx.core as mx

    from mlxrt.families.diffusion_gemma.model import EncoderCache, load_text_model
    from mlxrt.testing import write_tiny_checkpoint

    path = write_tiny_checkpoint(tmp_path / "bf16", "diffusion_gemma_no_vision", dtype="bfloat16")
    model = load_text_model(path, json.loads((path / "config.json").read_text()))
    assert model.embed_weight.dtype == mx.bfloat16
    cache = EncoderCache(model.args)
    model.encode(list(range(5, 25)), cache)
    logits = np.array(model.decode(mx.arange(CANVAS, dtype=mx.int32)[None] + 40, cache))
    assert logits.dtype == np.float32 and logits.shape == (1, CANVAS, model.args.vocab_size)
    assert np.isfinite(logits).all() and logits.std() > 0.1


# -- image requests over HTTP (needs the dialects' image input: mlxrt.loading.images, SplicedPrompt) --------


def _needs_image_input():
    from mlxrt import records

    if not hasattr(records, "SplicedPrompt"):
        pytest.skip("this mlxrt has no image input in its dialects yet")


def _data_url(seed: int) -> str:
    import base64
    import io

    from PIL import Image

    img = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (90, 120, 3), dtype=np.uint8), "RGB")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _image_messages(n: int, seed: int = 0) -> list[dict]:
    parts = [{"type": "text", "text": "What is in this picture?"}]
    parts += [{"type": "image_url", "image_url": {"url": _data_url(seed + i)}} for i in range(n)]
    return [{"role": "user", "content": parts}]


def test_image_chat_completion_through_openai_and_anthropic(mlxrt_tiny_checkpoint, mlxrt_serve):
    _needs_image_input()
    from support import anthropic_client

    client = mlxrt_serve(mlxrt_tiny_checkpoint("diffusion_gemma"))
    oc = openai_client(client)
    text = oc.chat.completions.create(model="tiny", max_tokens=16, seed=1,
                                      messages=[{"role": "user", "content": "What is in this picture?"}])
    one = oc.chat.completions.create(model="tiny", messages=_image_messages(1), max_tokens=16, seed=1)
    other = oc.chat.completions.create(model="tiny", messages=_image_messages(1, seed=5), max_tokens=16, seed=1)
    assert one.usage.prompt_tokens > text.usage.prompt_tokens  # the image's soft tokens count
    assert one.choices[0].message.content != text.choices[0].message.content
    assert one.choices[0].message.content != other.choices[0].message.content
    streamed = list(oc.chat.completions.create(model="tiny", messages=_image_messages(1), max_tokens=16, seed=1,
                                               stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == one.choices[0].message.content
    msg = anthropic_client(client).messages.create(model="tiny", max_tokens=16, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": _data_url(0).split(",", 1)[1]}},
        {"type": "text", "text": "What is in this picture?"}]}])
    assert msg.usage.input_tokens == one.usage.prompt_tokens


def test_image_rules_over_http(mlxrt_tiny_checkpoint, mlxrt_serve):
    _needs_image_input()
    client = mlxrt_serve(mlxrt_tiny_checkpoint("diffusion_gemma"))
    oc = openai_client(client)
    with pytest.raises(openai.BadRequestError) as err:
        oc.chat.completions.create(model="tiny", messages=_image_messages(2), max_tokens=8)
    assert err.value.body["message"] == "DiffusionGemma image input supports exactly one image"
    bare = openai_client(mlxrt_serve(mlxrt_tiny_checkpoint("diffusion_gemma_no_vision")))
    with pytest.raises(openai.BadRequestError) as err:
        bare.chat.completions.create(model="tiny", messages=_image_messages(1), max_tokens=8)
    assert err.value.body["message"] == "this checkpoint has no vision tower"
    # both servers serve on (seeded: an unseeded canvas may settle an EOS inside 8 tokens)
    for server in (bare, oc):
        out = server.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, seed=3, temperature=0)
        assert out.usage.completion_tokens == 8 and out.choices[0].finish_reason == "length"


def test_denoising_model_without_a_denoiser_fails_its_load(mlxrt_tiny_checkpoint, mlxrt_serve):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from mlxrt import hookimpl
    from mlxrt.errors import ModelLoadError
    from mlxrt.records import LoadedModel

    class Broken:
        @hookimpl(tryfirst=True)
        def mlxrt_load_model(self, info, host):
            return LoadedModel(model=None, tokenizer=load_tokenizer(info.path), engine="denoising")

    with pytest.raises(ModelLoadError, match="gave no denoiser"):
        mlxrt_serve(mlxrt_tiny_checkpoint("diffusion_gemma_no_vision"), plugins=[Broken()])


def test_chunked_prefill_equals_one_pass(text_checkpoint):
    """The prompt is encoded in chunks (sliding-window cache trimmed between them): same logits."""
    import json

    import mlx.core as mx

    from mlxrt.families.diffusion_gemma.generation import DenoiseSchedule, DiffusionGenerator
    from mlxrt.families.diffusion_gemma.model import EncoderCache, load_text_model

    model = load_text_model(text_checkpoint, json.loads((text_checkpoint / "config.json").read_text()))
    prompt = [(11 * i) % 1700 + 5 for i in range(37)]
    canvas = mx.arange(CANVAS, dtype=mx.int32)[None] + 100
    logits = []
    for chunk in (4096, 5, 8):
        cache = EncoderCache(model.args)
        DiffusionGenerator(model, DenoiseSchedule(), [1], prefill_chunk=chunk)._prefill(prompt, cache)
        assert cache.offset == len(prompt) and cache.kept(0) == model.args.sliding_window - 1
        logits.append(np.array(model.decode(canvas, cache)))
    np.testing.assert_allclose(logits[1], logits[0], atol=2e-5, rtol=0)
    np.testing.assert_allclose(logits[2], logits[0], atol=2e-5, rtol=0)
