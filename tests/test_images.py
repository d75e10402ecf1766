"""runtime/loading/images.py: image references → RGB PIL images, with the limits and error texts."""

from __future__ import annotations

import base64
import http.server
import io
import threading

import numpy as np
import pytest
from PIL import Image

from mlxrt.errors import InvalidRequest
from mlxrt.loading.images import ImageLimits, ImageRef, content_parts, load_image, url_ref

WHERE = "messages[0].content[1]"


def encoded(image: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    return buf.getvalue()


def sample(width: int = 12, height: int = 8) -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8), "RGB")


def as_data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF", "WEBP"])
def test_lossless_formats_decode_to_the_same_pixels(fmt):
    image = sample()
    kw = {"lossless": True} if fmt == "WEBP" else {}
    got = load_image(ImageRef(where=WHERE, url=as_data_url(encoded(image, fmt, **kw))))
    assert got.mode == "RGB" and got.size == (12, 8)
    assert np.array_equal(np.asarray(got), np.asarray(image))


def test_jpeg_and_base64_data_with_media_type():
    image = Image.new("RGB", (32, 16), (200, 30, 90))  # flat: JPEG keeps it within a few levels
    got = load_image(ImageRef(where=WHERE, data=base64.b64encode(encoded(image, "JPEG")).decode(),
                              media_type="image/jpeg"))
    assert got.size == (32, 16) and got.mode == "RGB"
    assert np.abs(np.asarray(got, dtype=float) - np.asarray(image, dtype=float)).max() < 6


def test_gif_first_frame():
    red, blue = Image.new("RGB", (6, 6), (255, 0, 0)), Image.new("RGB", (6, 6), (0, 0, 255))
    raw = encoded(red, "GIF", save_all=True, append_images=[blue])
    got = load_image(ImageRef(where=WHERE, url=as_data_url(raw, "image/gif")))
    assert got.getpixel((0, 0)) == (255, 0, 0)


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (20, 10), (0, 128, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    got = load_image(ImageRef(where=WHERE, url=as_data_url(encoded(image, "JPEG", exif=exif), "image/jpeg")))
    assert got.size == (10, 20)


def test_transparency_is_composited_on_white():
    image = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    got = load_image(ImageRef(where=WHERE, url=as_data_url(encoded(image, "PNG"))))
    assert got.getpixel((0, 0)) == (255, 255, 255)


@pytest.mark.parametrize(("ref", "why"), [
    (ImageRef(where=WHERE, url="data:image/png;base64,@@@"), "image data is not valid base64"),
    (ImageRef(where=WHERE, url="data:image/png;base64"), "malformed data: URL"),
    (ImageRef(where=WHERE, url="data:image/png,abc"), "data: URL must be base64"),
    (ImageRef(where=WHERE, url="data:text/plain;base64,aGk="), "is not an image"),
    (ImageRef(where=WHERE, url=as_data_url(b"\x89PNG\r\n\x1a\n broken")), "image could not be decoded"),
    (ImageRef(where=WHERE, url="file:///etc/passwd"), "unsupported image url scheme: file:///etc/pass"),
    (ImageRef(where=WHERE, url="http://localhost:9/x.png"), "private or loopback"),
    (ImageRef(where=WHERE, url="http://10.1.2.3/x.png"), "private or loopback"),
    (ImageRef(where=WHERE, data="aGk=", media_type="text/plain"), "is not an image"),
    (ImageRef(where=WHERE, error="source must be X"), "source must be X"),
    (ImageRef(where=WHERE), "no image data or URL"),
])
def test_bad_inputs_name_the_part(ref, why):
    with pytest.raises(InvalidRequest) as err:
        load_image(ref)
    assert err.value.status == 400
    assert err.value.message.startswith(f"{WHERE}: ") and why in err.value.message, err.value.message


def test_unsupported_format_is_refused():
    raw = encoded(sample(), "ICO")
    with pytest.raises(InvalidRequest, match="image format ICO is not supported"):
        load_image(ImageRef(where=WHERE, url=as_data_url(raw, "image/x-icon")))


def test_byte_and_pixel_limits():
    raw = encoded(sample(64, 64), "PNG")
    with pytest.raises(InvalidRequest, match="larger than the 100-byte limit"):
        load_image(ImageRef(where=WHERE, url=as_data_url(raw)), ImageLimits(max_bytes=100))
    with pytest.raises(InvalidRequest, match="64x64 pixels, over the 1000-pixel limit"):
        load_image(ImageRef(where=WHERE, url=as_data_url(raw)), ImageLimits(max_pixels=1000))


@pytest.fixture
def image_server():
    """A local HTTP server: /ok.png, /big.png, /missing, /slow, /redirect (to a loopback URL)."""
    body = encoded(sample(), "PNG")
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/ok.png":
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path == "/big.png":
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"\0" * 5000)
            elif self.path == "/slow":
                release.wait(5)
            elif self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "http://127.0.0.1:1/x.png")
                self.end_headers()
            else:
                self.send_response(404)
                self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", body
    release.set()
    server.shutdown()


def test_http_fetch(image_server):
    base, _body = image_server
    allow = ImageLimits(allow_private=True, fetch_timeout=1.0)
    got = load_image(ImageRef(where=WHERE, url=f"{base}/ok.png"), allow)
    assert np.array_equal(np.asarray(got), np.asarray(sample()))
    with pytest.raises(InvalidRequest, match=r"image fetch failed: 404"):
        load_image(ImageRef(where=WHERE, url=f"{base}/missing"), allow)
    with pytest.raises(InvalidRequest, match="larger than the 1000-byte limit"):
        load_image(ImageRef(where=WHERE, url=f"{base}/big.png"), ImageLimits(allow_private=True, max_bytes=1000))
    # A timeout reads like any other network failure (no hint whether a port is open).
    with pytest.raises(InvalidRequest, match=r"content\[1\]: image could not be fetched$"):
        load_image(ImageRef(where=WHERE, url=f"{base}/slow"), ImageLimits(allow_private=True, fetch_timeout=0.3))
    with pytest.raises(InvalidRequest, match="private or loopback"):  # refused by default
        load_image(ImageRef(where=WHERE, url=f"{base}/ok.png"))


def test_redirects_are_checked_like_the_first_url(image_server, monkeypatch):
    base, _ = image_server
    import mlxrt.loading.images as images

    # The first hop is allowed (pretend its address is public); its redirect to 127.0.0.1 is not.
    checked: list[str] = []
    monkeypatch.setattr(images, "_public", lambda address: checked.append(str(address)) or len(checked) == 1)
    with pytest.raises(InvalidRequest, match="host '127.0.0.1' is a private or loopback"):
        load_image(ImageRef(where=WHERE, url=base + "/redirect"))
    assert checked == ["127.0.0.1", "127.0.0.1"]


def test_url_ref_and_content_parts():
    assert url_ref({"url": "data:x"}, WHERE) == ImageRef(where=WHERE, url="data:x")
    assert url_ref("https://a/b.png", WHERE).url == "https://a/b.png"
    assert url_ref({"nope": 1}, WHERE).error
    ref = ImageRef(where=WHERE, url="u")
    assert content_parts(["a", "b"]) == "ab"
    assert content_parts(["a", ref, "b"]) == [{"type": "text", "text": "a"}, {"type": "image"},
                                              {"type": "text", "text": "b"}]
