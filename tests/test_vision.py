"""Gemma 4 vision: the MLX tower against transformers' reference, and image chats through the
official openai and anthropic clients on the tiny multimodal checkpoint."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from support import anthropic_client, openai_client
from vision_images import IMAGES, checker, gradient

GOLDEN = Path(__file__).resolve().parent / "golden" / "gemma4_vision.npz"


def png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def data_url(image, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def gemma4_dir(tmp_path_factory) -> Path:
    from mlxrt.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("g4v") / "gemma4", "gemma4")


@pytest.fixture(scope="module")
def adapter(gemma4_dir):
    import mlx_lm

    from mlxrt.families.gemma4.splice import Gemma4Vision
    from mlxrt.records import ModelInfo

    model, _tok = mlx_lm.load(str(gemma4_dir))
    info = ModelInfo(model_id="g4", path=gemma4_dir, model_type="gemma4",
                     config=json.loads((gemma4_dir / "config.json").read_text()))
    return Gemma4Vision(info, lambda: model), model, info


@pytest.fixture
def gemma4(gemma4_dir, mlxrt_serve):
    return mlxrt_serve(gemma4_dir, options={"prompt_cache_size": 10})


# -- parity -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_tower_matches_transformers_golden(adapter, name):
    ad, _model, _info = adapter
    golden = np.load(GOLDEN)[f"features_{name}"]
    got = np.array(ad.image_features(IMAGES[name]()))
    assert got.shape == golden.shape == (60, 64)
    assert np.abs(got - golden).max() < 5e-3


def test_spliced_prompt_logits_match_transformers_golden(adapter):
    import mlx.core as mx

    ad, model, info = adapter
    golden = np.load(GOLDEN)
    ids = [int(i) for i in golden["ids"]]
    cfg = info.config
    b, e = ids.index(cfg["boi_token_id"]), ids.index(cfg["eoi_token_id"])
    templated = ids[:b] + [cfg["image_token_id"]] + ids[e + 1:]  # what the chat template writes
    spliced = ad.splice(templated, [gradient()])
    assert list(spliced.ids) == ids and spliced.images == 1
    assert spliced.feed_ids.count(cfg["image_token_id"]) == 0  # pad at image rows (per-layer inputs)
    logits = np.array(model(mx.array(spliced.feed_ids)[None], input_embeddings=spliced.embeddings[None])[0, -2:])
    assert np.abs(logits - golden["logits"]).max() < 5e-3


def test_vision_bidirectional_attention_matches_transformers_golden(tmp_path):
    """``use_bidirectional_attention: "vision"``: image tokens see each other both ways on
    sliding layers (window 16, shorter than the image); the causal result is far off."""
    import sys

    import mlx.core as mx
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    from mlxrt.families.gemma4.splice import Gemma4Vision
    from mlxrt.records import ModelInfo
    from mlxrt.testing import write_tiny_checkpoint

    sys.path.insert(0, str(GOLDEN.parent))
    from make_gemma4_vision_golden import BIDIR

    path = write_tiny_checkpoint(tmp_path / "bidir", "gemma4", config_overrides=BIDIR)
    model, _tok = mlx_lm.load(str(path))
    info = ModelInfo(model_id="b", path=path, model_type="gemma4",
                     config=json.loads((path / "config.json").read_text()))
    golden = np.load(GOLDEN)
    ids, cfg = [int(i) for i in golden["ids"]], info.config
    b, e = ids.index(cfg["boi_token_id"]), ids.index(cfg["eoi_token_id"])
    spliced = Gemma4Vision(info, lambda: model).splice(ids[:b] + [cfg["image_token_id"]] + ids[e + 1:],
                                                        [gradient()])
    assert spliced.prefill is not None

    def last_logits():
        out = model(mx.array(spliced.feed_ids)[None], cache=make_prompt_cache(model),
                    input_embeddings=spliced.embeddings[None])
        return np.array(out[0, -2:])

    causal = last_logits()
    with spliced.prefill():
        bidirectional = last_logits()
    assert np.abs(bidirectional - golden["logits_bidir"]).max() < 5e-3
    assert np.abs(causal - golden["logits_bidir"]).max() > 0.1
    assert np.abs(last_logits() - causal).max() == 0  # the scope restored the model's own masks


def test_tower_matches_transformers_live(adapter):
    torch = pytest.importorskip("torch")
    from transformers import Gemma4ForConditionalGeneration
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    from mlxrt.testing._tiny_gemma4_vision import IMAGE_PROCESSOR

    ad, _model, info = adapter
    ref = Gemma4ForConditionalGeneration.from_pretrained(str(info.path), dtype=torch.float32).eval()
    processor = Gemma4ImageProcessorPil(**{k: v for k, v in IMAGE_PROCESSOR.items() if k != "image_processor_type"})
    image = checker(70, 40)  # a size the goldens do not cover
    batch = processor(images=[image], return_tensors="pt")
    with torch.no_grad():
        want = ref.model.get_image_features(batch["pixel_values"], batch["image_position_ids"]).pooler_output[0]
    got = np.array(ad.image_features(image))
    assert got.shape == tuple(want.shape)
    assert np.abs(got - want.numpy()).max() < 5e-3


def test_splice_refuses_a_placeholder_count_mismatch(adapter):
    from mlxrt.errors import InvalidRequest

    ad, _model, info = adapter
    with pytest.raises(InvalidRequest, match="1 image placeholder"):
        ad.splice([2, info.config["image_token_id"], 5], [gradient(), gradient()])


# -- serving ------------------------------------------------------------------------------------


def _openai_chat(client, image_url: str | None, max_tokens: int = 8, **kw):
    parts = [{"type": "text", "text": "describe the picture"}]
    if image_url is not None:
        parts.append({"type": "image_url", "image_url": {"url": image_url}})
    return openai_client(client).chat.completions.create(
        model="m", messages=[{"role": "user", "content": parts}], max_tokens=max_tokens, temperature=0, **kw)


def test_openai_image_chat_changes_the_output(gemma4):
    ad = gemma4.app.state.models.primary.engine.profile.vision
    text_only = _openai_chat(gemma4, None)
    assert not ad.loaded  # a text-only request never loads the tower
    one = _openai_chat(gemma4, data_url(gradient()))
    assert ad.loaded
    other = _openai_chat(gemma4, data_url(checker(), "JPEG"))
    again = _openai_chat(gemma4, data_url(gradient()))
    outputs = {text_only.choices[0].message.content, one.choices[0].message.content,
               other.choices[0].message.content}
    assert len(outputs) == 3, outputs  # the image (and which image) changes the greedy output
    assert again.choices[0].message.content == one.choices[0].message.content
    # 60 soft tokens + <|image>/<image|> (+ the template's "\n\n" around the image) in usage
    assert 62 < one.usage.prompt_tokens - text_only.usage.prompt_tokens <= 62 + 4


def test_openai_image_request_bypasses_the_prompt_cache(gemma4):
    url = data_url(gradient())
    raw = openai_client(gemma4).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        max_tokens=2, temperature=0)
    raw2 = openai_client(gemma4).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        max_tokens=2, temperature=0)
    assert raw.headers["x-mlxrt-cache"].startswith("off") and raw2.headers["x-mlxrt-cache"].startswith("off")
    assert raw2.parse().usage.prompt_tokens_details is None or \
        not raw2.parse().usage.prompt_tokens_details.cached_tokens
    assert gemma4.get("/v1/models").json()["data"][0]["vision"] is True


def test_openai_stream_with_image(gemma4):
    stream = openai_client(gemma4).chat.completions.create(
        model="m", messages=[{"role": "user", "content": [
            {"type": "text", "text": "describe the picture"},
            {"type": "image_url", "image_url": {"url": data_url(gradient())}}]}],
        max_tokens=8, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == _openai_chat(gemma4, data_url(gradient())).choices[0].message.content


def _anthropic(client, block, max_tokens: int = 8):
    return anthropic_client(client).messages.create(
        model="m", max_tokens=max_tokens, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": [{"type": "text", "text": "describe the picture"}, block]}])


def test_anthropic_image_blocks_base64_and_url(gemma4):
    b64 = base64.b64encode(png_bytes(gradient())).decode()
    a = _anthropic(gemma4, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}})
    b = _anthropic(gemma4, {"type": "image", "source": {"type": "url", "url": data_url(gradient())}})
    c = _anthropic(gemma4, {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                        "data": base64.b64encode(png_bytes(checker())).decode()}})
    text = anthropic_client(gemma4).messages.create(
        model="m", max_tokens=8, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "describe the picture"}])
    assert a.content[0].text == b.content[0].text  # the same image by base64 or by URL
    with anthropic_client(gemma4).messages.stream(
            model="m", max_tokens=8, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
                {"type": "text", "text": "describe the picture"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}]}]) as s:
        assert "".join(s.text_stream) == a.content[0].text
    assert len({a.content[0].text, c.content[0].text, text.content[0].text}) == 3
    assert a.usage.input_tokens > text.usage.input_tokens + 60


def test_responses_input_image(gemma4):
    def ask(content):
        return openai_client(gemma4).responses.create(
            model="m", max_output_tokens=6, temperature=0, store=False,
            input=[{"role": "user", "content": content}])

    text = ask([{"type": "input_text", "text": "hi"}])
    image = ask([{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": data_url(gradient())}])
    assert image.usage.input_tokens - text.usage.input_tokens > 62
    assert image.output_text != text.output_text


@pytest.fixture
def image_site(tmp_path):
    """A local web server with gradient.png (loopback: the server needs --allow-private-image-urls)."""
    import functools
    import http.server
    import threading

    (tmp_path / "gradient.png").write_bytes(png_bytes(gradient()))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_http_image_url_through_a_real_server(gemma4_dir, server_process, image_site):
    import openai

    server = server_process([str(gemma4_dir), "--allow-private-image-urls", "--max-image-bytes", "1MiB",
                             "--image-fetch-timeout", "5"])
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)

    def chat(url):
        return client.chat.completions.create(model="m", max_tokens=6, temperature=0, messages=[
            {"role": "user", "content": [{"type": "text", "text": "describe the picture"},
                                         {"type": "image_url", "image_url": {"url": url}}]}])

    fetched = chat(f"{image_site}/gradient.png").choices[0].message.content
    assert fetched == chat(data_url(gradient())).choices[0].message.content  # same pixels, same answer
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[1\]: image fetch failed: 404"):
        chat(f"{image_site}/missing.png")
    small = server_process([str(gemma4_dir), "--max-image-bytes", "1KB"])
    client = openai.OpenAI(base_url=f"{small.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="image is larger than the 1000-byte limit"):
        chat(data_url(gradient()))
    with pytest.raises(openai.BadRequestError, match="private or loopback"):  # the default refuses loopback
        chat(f"{image_site}/gradient.png")


BAD = [
    ("data:image/png;base64,%%%notbase64", "image data is not valid base64"),
    ("data:image/png;base64," + base64.b64encode(b"not an image at all").decode(), "image could not be decoded"),
    ("data:image/png,rawbytes", "data: URL must be base64"),
    ("ftp://example.com/cat.png", "unsupported image url scheme"),
    ("http://127.0.0.1:1/cat.png", "private or loopback"),
]


@pytest.mark.parametrize(("url", "why"), BAD)
def test_openai_bad_image_is_400_naming_the_part(gemma4, url, why):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        _openai_chat(gemma4, url)
    assert err.value.status_code == 400
    message = err.value.body["message"] if "message" in err.value.body else err.value.body["error"]["message"]
    assert message.startswith("messages[0].content[1]: ") and why in message, message
    assert _openai_chat(gemma4, None, max_tokens=2).choices[0].finish_reason  # still serving


def test_anthropic_bad_image_is_400_naming_the_block(gemma4):
    import anthropic

    with pytest.raises(anthropic.BadRequestError) as err:
        _anthropic(gemma4, {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                        "data": base64.b64encode(b"GIF89a broken").decode()}})
    assert "messages.0.content.1: image could not be decoded" in str(err.value)
    with pytest.raises(anthropic.BadRequestError) as err:
        _anthropic(gemma4, {"type": "image", "source": {"type": "file", "file_id": "f"}})
    assert "messages.0.content.1: source must be" in str(err.value)
    assert _anthropic(gemma4, {"type": "text", "text": "x"}).content  # still serving


def test_too_elongated_image_is_400(gemma4):
    import openai

    # 2000x10 resizes to 48 x 3360 pixels: 210 patches across, past the tiny tower's 128 positions
    with pytest.raises(openai.BadRequestError, match="a 2000x10 image is too elongated"):
        _openai_chat(gemma4, data_url(gradient(2000, 10)))


def test_anthropic_count_tokens_counts_the_soft_tokens(gemma4):
    block = {"type": "image", "source": {"type": "url", "url": data_url(gradient())}}
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, block]}]}
    with_image = gemma4.post("/v1/messages/count_tokens", json=body)
    body["messages"][0]["content"] = "hi"
    text = gemma4.post("/v1/messages/count_tokens", json=body)
    assert with_image.status_code == 200, with_image.text
    assert with_image.json()["input_tokens"] - text.json()["input_tokens"] > 62


def test_anthropic_tool_result_image_reaches_the_vision_input(gemma4):
    """An image a tool returned (an agent's screenshot) goes to the vision input, as in a user turn."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png_bytes(gradient())).decode()}}

    def body(result):
        return {"model": "m", "max_tokens": 6, "temperature": 0, "tools": [
            {"name": "screenshot", "input_schema": {"type": "object", "properties": {}}}], "messages": [
            {"role": "user", "content": "What is on screen?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot",
                                               "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]}]}

    with_image = gemma4.post("/v1/messages/count_tokens", json=body([{"type": "text", "text": "shot"}, image]))
    text = gemma4.post("/v1/messages/count_tokens", json=body([{"type": "text", "text": "shot"}]))
    assert with_image.status_code == 200, with_image.text
    assert with_image.json()["input_tokens"] - text.json()["input_tokens"] > 62
    answered = gemma4.post("/v1/messages", json=body([{"type": "text", "text": "shot"}, image]))
    assert answered.status_code == 200, answered.text
    assert answered.json()["usage"]["input_tokens"] == with_image.json()["input_tokens"]


def test_oversize_image_is_400(gemma4_dir, mlxrt_serve):
    import openai

    client = mlxrt_serve(gemma4_dir, options={"max_image_bytes": 1000})
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[1\]: image is larger than the "
                                                     r"1000-byte limit"):
        _openai_chat(client, data_url(gradient()))


def test_text_model_refuses_images(mlxrt_tiny_checkpoint, mlxrt_serve):
    import openai

    client = mlxrt_serve(mlxrt_tiny_checkpoint("qwen3"))
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[1\]: the served model has no "
                                                     "vision input"):
        _openai_chat(client, data_url(gradient()))
    assert client.get("/v1/models").json()["data"][0]["vision"] is False


def test_image_request_takes_the_serial_lane_beside_a_batch(gemma4_dir, mlxrt_serve):
    client = mlxrt_serve(gemma4_dir, options={"batch": 4})
    engine = client.app.state.models.primary.engine
    assert engine.lane == "batch"
    # A lone text request decodes in the serial lane's loop (it would join the batch if another came).
    _openai_chat(client, None, max_tokens=2)
    assert engine.stats()["served_by_lane"] == {"serial": 1, "batch": 0}
    _openai_chat(client, data_url(gradient()), max_tokens=2)
    assert engine.stats()["served_by_lane"] == {"serial": 2, "batch": 0}
    _openai_chat(client, None, max_tokens=2)
    assert engine.stats()["served_by_lane"] == {"serial": 3, "batch": 0}
    assert engine.lane == "batch"


def test_two_images_in_one_message(gemma4):
    parts = [{"type": "text", "text": "compare"},
             {"type": "image_url", "image_url": {"url": data_url(gradient())}},
             {"type": "image_url", "image_url": {"url": data_url(checker())}}]
    client = openai_client(gemma4)
    both = client.chat.completions.create(model="m", messages=[{"role": "user", "content": parts}],
                                          max_tokens=8, temperature=0)
    swapped = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": [parts[0], parts[2], parts[1]]}], max_tokens=8,
        temperature=0)
    one = client.chat.completions.create(model="m", messages=[{"role": "user", "content": parts[:2]}],
                                         max_tokens=8, temperature=0)
    assert both.usage.prompt_tokens - one.usage.prompt_tokens > 62
    assert both.usage.prompt_tokens == swapped.usage.prompt_tokens  # 60 soft tokens each
    assert both.choices[0].message.content != swapped.choices[0].message.content  # order matters


def test_embeddings_are_released_on_every_path(gemma4, monkeypatch):
    import gc
    import weakref

    import openai

    adapter = gemma4.app.state.models.primary.engine.profile.vision
    made = []
    splice = adapter.splice

    def tracked(prompt_ids, images):
        spliced = splice(prompt_ids, images)
        made.append(weakref.ref(spliced.embeddings))
        return spliced

    monkeypatch.setattr(adapter, "splice", tracked)
    url = data_url(gradient())
    _openai_chat(gemma4, url, max_tokens=3)  # finished
    with pytest.raises(openai.BadRequestError):  # refused after the splice, at planning (every
        # max_tokens is now reduced to what fits, so an out-of-vocabulary bias is what refuses it)
        _openai_chat(gemma4, url, max_tokens=3, logit_bias={"99999999": 1})
    stream = openai_client(gemma4).chat.completions.create(  # the client leaves mid-stream
        model="m", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        max_tokens=50, temperature=0, stream=True)
    next(iter(stream))
    stream.close()
    _openai_chat(gemma4, None, max_tokens=2)  # the engine moved on
    gc.collect()
    assert len(made) == 3
    assert all(ref() is None for ref in made)


def test_served_vision_bidirectional_prefill(tmp_path, mlxrt_serve):
    """The engine prefills an image prompt of a "vision"-bidirectional checkpoint with its masks:
    the served greedy tokens are the bidirectional forward's, not the causal one's."""
    import contextlib
    import sys

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxrt.testing import write_tiny_checkpoint

    sys.path.insert(0, str(GOLDEN.parent))
    from make_gemma4_vision_golden import BIDIR

    client = mlxrt_serve(write_tiny_checkpoint(tmp_path / "bidir", "gemma4", config_overrides=BIDIR))
    engine = client.app.state.models.primary.engine
    url = data_url(gradient())
    messages = [{"role": "user", "content": [{"type": "text", "text": "describe the picture"},
                                             {"type": "image_url", "image_url": {"url": url}}]}]
    served = openai_client(client).chat.completions.create(model="m", messages=messages, max_tokens=1,
                                                           temperature=0, logprobs=True)
    text = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "describe the picture"}, {"type": "image"}]}],
        add_generation_prompt=True, tokenize=False)
    ids = engine.tokenizer.encode(text, add_special_tokens=False)

    def first_token(bidirectional: bool) -> tuple[int, float]:
        def run(loaded):
            spliced = engine.profile.vision.splice(ids, [gradient()])
            scope = spliced.prefill() if bidirectional else contextlib.nullcontext()
            with scope:
                out = loaded.model(mx.array(spliced.feed_ids)[None], cache=make_prompt_cache(loaded.model),
                                   input_embeddings=spliced.embeddings[None])
            logprobs = out[0, -1] - mx.logsumexp(out[0, -1])
            token = int(mx.argmax(logprobs).item())
            return token, float(logprobs[token].item())

        return engine.call_blocking(run)

    (want, want_lp), (_causal, causal_lp) = first_token(True), first_token(False)
    assert abs(want_lp - causal_lp) > 1e-2  # the test tells the two apart
    got = served.choices[0].logprobs.content[0]
    assert got.token == engine.tokenizer.decode([want])
    assert abs(got.logprob - want_lp) < 1e-3
