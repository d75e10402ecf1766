"""Image inputs: what a request referenced (:class:`ImageRef`), fetched and decoded into RGB
:class:`PIL.Image.Image`\\ s for a family's vision adapter.

Every dialect records the images of its messages as :class:`ImageRef`\\ s, in prompt order,
each naming the request part it came from (``messages[0].content[1]``). Nothing is fetched or
decoded while a body is parsed: :func:`load_images` runs off the event loop once the served
model is known to take images, so a text-only model answers "no vision input" without
touching the network.

Accepted: ``data:<mime>;base64,<...>`` URLs, ``http(s)://`` URLs (fetched with a byte cap and a
timeout; private, loopback and link-local addresses are refused unless the operator allows
them, so a client cannot make the server probe its own network) and base64 data with a media
type (Anthropic). Formats: PNG, JPEG, WebP, GIF (first frame), BMP, TIFF. EXIF orientation is
applied; transparency is composited on white (as transformers' ``convert_rgb`` does). Every
failure is an :class:`~mlxrt.errors.InvalidRequest` (400) naming the part.
"""

from __future__ import annotations

import base64
import binascii
import io
import ipaddress
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxrt.errors import InvalidRequest

__all__ = ["ImageRef", "ImageLimits", "load_image", "load_images", "url_ref", "content_parts", "FORMATS"]

#: Pillow format names accepted (``Image.format``).
FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF", "MPO"})
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
DEFAULT_FETCH_TIMEOUT = 10.0
DEFAULT_MAX_PIXELS = 40_000_000


@attrs.frozen
class ImageRef:
    """One image a request referenced, before it is fetched or decoded.

    :ivar where: The request part it came from, for error messages (``messages[0].content[1]``).
    :ivar url: A ``data:`` or ``http(s)`` URL.
    :ivar data: Base64 image bytes (Anthropic ``source.type: base64``), with ``media_type``.
    :ivar media_type: The declared MIME type of ``data``.
    :ivar error: Why the part itself is malformed (reported only if the model takes images).
    """

    where: str
    url: str | None = None
    data: str | None = None
    media_type: str | None = None
    error: str | None = None


def url_ref(value: Any, where: str) -> ImageRef:
    """An OpenAI-style image URL (``"https://..."``, ``"data:..."`` or ``{"url": ...}``) as a
    reference; a malformed value is recorded, and reported only if the model takes images."""
    url = value.get("url") if isinstance(value, Mapping) else value
    if not isinstance(url, str) or not url:
        return ImageRef(where=where, error="image_url must be a URL string or {\"url\": ...}")
    return ImageRef(where=where, url=url)


def content_parts(pieces: Sequence[str | ImageRef], sep: str = "") -> str | list[dict[str, Any]]:
    """A message's content from its text pieces and images, in order: a plain string when it
    has no image (``sep``-joined), else template parts (``{"type": "text"}`` /
    ``{"type": "image"}``) as Hugging Face chat templates take them."""
    if not any(isinstance(p, ImageRef) for p in pieces):
        return sep.join(p for p in pieces if isinstance(p, str))
    return [{"type": "image"} if isinstance(p, ImageRef) else {"type": "text", "text": p} for p in pieces]


@attrs.frozen
class ImageLimits:
    """Operator limits on image inputs (``mlxrt serve`` flags of the same names).

    :ivar max_bytes: Encoded bytes one image may have (``--max-image-bytes``).
    :ivar fetch_timeout: Seconds an ``http(s)`` fetch may take (``--image-fetch-timeout``).
    :ivar max_pixels: Decoded pixels one image may have (a decompression-bomb guard).
    :ivar allow_private: Fetch from private/loopback addresses too (``--allow-private-image-urls``).
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    fetch_timeout: float = DEFAULT_FETCH_TIMEOUT
    max_pixels: int = DEFAULT_MAX_PIXELS
    allow_private: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ImageLimits:
        def given(name: str, default: Any) -> Any:
            value = options.get(name)
            return default if value is None else value

        return cls(max_bytes=int(given("max_image_bytes", DEFAULT_MAX_BYTES)),
                   fetch_timeout=float(given("image_fetch_timeout", DEFAULT_FETCH_TIMEOUT)),
                   allow_private=bool(options.get("allow_private_image_urls")))


def _bad(ref: ImageRef, why: str) -> InvalidRequest:
    return InvalidRequest(f"{ref.where}: {why}", param=ref.where, code="invalid_image")


def _b64(ref: ImageRef, text: str, limits: ImageLimits) -> bytes:
    # Base64 grows 4/3: refuse an oversize payload before decoding it.
    if len(text) * 3 // 4 > limits.max_bytes + 3:
        raise _bad(ref, f"image is larger than the {limits.max_bytes}-byte limit")
    try:
        raw = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise _bad(ref, "image data is not valid base64") from None
    return raw


def _data_url(ref: ImageRef, url: str, limits: ImageLimits) -> bytes:
    head, comma, payload = url[5:].partition(",")
    if not comma:
        raise _bad(ref, "malformed data: URL")
    if not head.endswith(";base64"):
        raise _bad(ref, "data: URL must be base64")
    mime = head[: -len(";base64")]
    if mime and not mime.lower().startswith("image/"):
        raise _bad(ref, f"data: URL media type {mime!r} is not an image")
    return _b64(ref, payload, limits)


def _public(host: str) -> bool:
    """Every address ``host`` resolves to is a public one."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return True  # the fetch itself reports the resolution failure
    for info in infos:
        addr = ipaddress.ip_address(info[4][0].split("%")[0])
        if addr.is_private or addr.is_loopback or addr.is_link_local or addr.is_reserved \
                or addr.is_multicast or addr.is_unspecified:
            return False
    return True


def _checked(ref: ImageRef, url: str, limits: ImageLimits) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _bad(ref, f"unsupported image url scheme: {url[:16]}")
    if not limits.allow_private and not _public(parts.hostname):
        raise _bad(ref, f"image URL host {parts.hostname!r} is a private or loopback address "
                        "(the server fetches public URLs only; see --allow-private-image-urls)")
    return url


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Checks every redirect target as the first URL was checked."""

    def __init__(self, ref: ImageRef, limits: ImageLimits) -> None:
        self.ref, self.limits = ref, limits

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201
        _checked(self.ref, newurl, self.limits)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _fetch(ref: ImageRef, url: str, limits: ImageLimits) -> bytes:
    _checked(ref, url, limits)
    opener = urllib.request.build_opener(_Redirects(ref, limits))
    request = urllib.request.Request(url, headers={"User-Agent": "mlxrt", "Accept": "image/*"})
    try:
        with opener.open(request, timeout=limits.fetch_timeout) as response:
            length = response.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > limits.max_bytes:
                raise _bad(ref, f"image is larger than the {limits.max_bytes}-byte limit")
            raw = response.read(limits.max_bytes + 1)
    except InvalidRequest:
        raise
    except urllib.error.HTTPError as exc:
        raise _bad(ref, f"image fetch failed: {exc.code} {url}") from None
    except TimeoutError:
        raise _bad(ref, f"image fetch timed out after {limits.fetch_timeout:g} s: {url}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise _bad(ref, f"image fetch timed out after {limits.fetch_timeout:g} s: {url}") from None
        raise _bad(ref, f"image fetch failed: {reason} {url}") from None
    if len(raw) > limits.max_bytes:
        raise _bad(ref, f"image is larger than the {limits.max_bytes}-byte limit")
    return raw


def _encoded(ref: ImageRef, limits: ImageLimits) -> bytes:
    if ref.error is not None:
        raise _bad(ref, ref.error)
    if ref.data is not None:
        if ref.media_type is not None and not ref.media_type.lower().startswith("image/"):
            raise _bad(ref, f"media type {ref.media_type!r} is not an image")
        raw = _b64(ref, ref.data, limits)
    elif ref.url is not None:
        raw = _data_url(ref, ref.url, limits) if ref.url.startswith("data:") else _fetch(ref, ref.url, limits)
    else:
        raise _bad(ref, "no image data or URL")
    if len(raw) > limits.max_bytes:
        raise _bad(ref, f"image is larger than the {limits.max_bytes}-byte limit")
    if not raw:
        raise _bad(ref, "image could not be decoded (empty)")
    return raw


def decode_bytes(ref: ImageRef, raw: bytes, limits: ImageLimits) -> Any:
    """Encoded bytes → an RGB image (EXIF orientation applied, first frame of animations)."""
    import warnings

    from PIL import Image, ImageOps

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw))
            if image.format not in FORMATS:
                raise _bad(ref, f"image format {image.format or 'unknown'} is not supported "
                                "(PNG, JPEG, WebP, GIF, BMP, TIFF)")
            width, height = image.size
            if width * height > limits.max_pixels:
                raise _bad(ref, f"image is {width}x{height} pixels, over the {limits.max_pixels}-pixel limit")
            image.seek(0)
            image.load()
            image = ImageOps.exif_transpose(image)
    except InvalidRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _bad(ref, "image is too large to decode") from None
    except Exception as exc:  # Pillow raises many types for corrupt data
        raise _bad(ref, f"image could not be decoded ({type(exc).__name__})") from None
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def load_image(ref: ImageRef, limits: ImageLimits | None = None) -> Any:
    """Fetch or decode one image; an RGB :class:`PIL.Image.Image`.

    :raises InvalidRequest: naming ``ref.where``: malformed, oversize, unreachable or
        undecodable input.
    """
    limits = limits or ImageLimits()
    return decode_bytes(ref, _encoded(ref, limits), limits)


def load_images(refs: Sequence[ImageRef], limits: ImageLimits | None = None) -> list[Any]:
    """:func:`load_image` for each reference, in order."""
    return [load_image(ref, limits) for ref in refs]
