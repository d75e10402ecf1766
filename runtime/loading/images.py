"""Image inputs: what a request referenced (:class:`ImageRef`), fetched and decoded into RGB
:class:`PIL.Image.Image`\\ s for a family's vision adapter.

Every dialect records the images of its messages as :class:`ImageRef`\\ s, in prompt order,
each naming the request part it came from (``messages[0].content[1]``). Nothing is fetched or
decoded while a body is parsed: :func:`load_images` runs off the event loop once the served
model is known to take images, so a text-only model answers "no vision input" without
touching the network.

Accepted: ``data:<mime>;base64,<...>`` URLs, ``http(s)://`` URLs (fetched with a byte cap and a
timeout) and base64 data with a media type (Anthropic).

The fetcher is an SSRF guard, so a client cannot make the server probe its own network: each
URL (and each redirect hop, at most :data:`MAX_REDIRECTS`) is parsed once — the host unquoted
once and IDNA-encoded, credentials, backslashes and leftover escapes refused — and resolved
once; unless the operator allows private addresses (``--allow-private-image-urls``) every
address must be a public unicast one, and the connection goes to the checked address (Host
header and TLS server name as in the URL), so a DNS answer cannot change between check and
use. Every network failure reads alike (:data:`FETCH_FAILED`), whether a port was closed,
silent or refusing. Formats: PNG, JPEG, WebP, GIF (first frame), BMP, TIFF. EXIF orientation is
applied; transparency is composited on white (as transformers' ``convert_rgb`` does). Every
failure is an :class:`~mlxrt.errors.InvalidRequest` (400) naming the part.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import io
import ipaddress
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxrt.errors import InvalidRequest, QueueFull

__all__ = ["ImageRef", "ImageLimits", "PixelBudget", "PixelLease", "load_image", "load_images", "url_ref",
           "content_parts", "FORMATS"]

#: Pillow format names accepted (``Image.format``).
FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF", "MPO"})
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
DEFAULT_FETCH_TIMEOUT = 10.0
DEFAULT_MAX_PIXELS = 40_000_000
#: Per request: images at most, and decoded pixels of all its images together (about 150 MB
#: of RGB), so one request cannot make the server hold gigabytes of pixels.
DEFAULT_MAX_IMAGES = 16
DEFAULT_MAX_TOTAL_PIXELS = 50_000_000
#: All requests together: decoded pixels held at once (``--max-image-pixels-in-flight``), so
#: concurrent image requests cannot add up to gigabytes (each 40 MP PNG took ~180 MB).
DEFAULT_MAX_PIXELS_IN_FLIGHT = 100_000_000
#: Seconds a request waits for room in that budget before it gets 429 ``images_busy``.
PIXEL_WAIT_S = 10.0


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
    :ivar max_images: Images one request may carry (``--max-images``).
    :ivar max_total_pixels: Decoded pixels all images of one request may have together
        (``--max-image-pixels``).
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    fetch_timeout: float = DEFAULT_FETCH_TIMEOUT
    max_pixels: int = DEFAULT_MAX_PIXELS
    allow_private: bool = False
    max_images: int = DEFAULT_MAX_IMAGES
    max_total_pixels: int = DEFAULT_MAX_TOTAL_PIXELS

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ImageLimits:
        def given(name: str, default: Any) -> Any:
            value = options.get(name)
            return default if value is None else value

        return cls(max_bytes=int(given("max_image_bytes", DEFAULT_MAX_BYTES)),
                   fetch_timeout=float(given("image_fetch_timeout", DEFAULT_FETCH_TIMEOUT)),
                   allow_private=bool(options.get("allow_private_image_urls")),
                   max_images=int(given("max_images", DEFAULT_MAX_IMAGES)),
                   max_total_pixels=int(given("max_image_pixels", DEFAULT_MAX_TOTAL_PIXELS)))


class PixelBudget:
    """Decoded pixels all requests together may hold at once: a semaphore weighted by pixels.

    A request takes an image's pixels (from its header) before decoding it and gives them back
    when its images are dropped (:meth:`lease`). With no room, it waits up to
    :data:`PIXEL_WAIT_S` for other requests to give some back, then gets
    :class:`~mlxrt.errors.QueueFull` (429 ``images_busy``, ``Retry-After``). The budget is never
    below one request's own cap, so a request alone always fits.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.held = 0
        self._room = threading.Condition()

    def lease(self) -> PixelLease:
        """What one request holds; a context manager that gives it all back on exit."""
        return PixelLease(self)

    def _take(self, ref: ImageRef, pixels: int) -> None:
        pixels = min(pixels, self.total)
        with self._room:
            if not self._room.wait_for(lambda: self.held + pixels <= self.total, timeout=PIXEL_WAIT_S):
                raise QueueFull(f"{ref.where}: the server is decoding {self.held} pixels of images for other "
                                f"requests, its limit is {self.total} (--max-image-pixels-in-flight); retry shortly",
                                code="images_busy")
            self.held += pixels

    def _give(self, pixels: int) -> None:
        with self._room:
            self.held -= min(pixels, self.total)
            self._room.notify_all()


class PixelLease:
    """The pixels one request took of a :class:`PixelBudget` (given back on ``__exit__``)."""

    def __init__(self, budget: PixelBudget) -> None:
        self.budget = budget
        self.pixels = 0

    def take(self, ref: ImageRef, pixels: int) -> None:
        self.budget._take(ref, pixels)
        self.pixels += pixels

    def __enter__(self) -> PixelLease:
        return self

    def __exit__(self, *exc: Any) -> None:
        held, self.pixels = self.pixels, 0
        self.budget._give(held)


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


#: Redirects followed at most (each hop is checked like the first URL).
MAX_REDIRECTS = 5
#: The one text for every network failure (refused, reset, timed out, unresolvable): an
#: error must not tell a client which ports of which hosts are open.
FETCH_FAILED = "image could not be fetched"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_BAD_URL_CHARS = re.compile(r"[\\\x00-\x20\x7f%@]")


#: IPv6 prefixes whose last 32 bits are an IPv4 address the packet reaches: NAT64 (well-known
#: and local-use, RFC 6052 and 8215), IPv4-compatible (``::a.b.c.d``, deprecated but routed by
#: some stacks) and IPv4-translated (``::ffff:0:a.b.c.d``, RFC 2765).
_EMBEDDING_V4 = tuple(ipaddress.IPv6Network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "::/96",
                                                         "::ffff:0:0:0/96"))


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, NAT64, compatible, translated)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in net for net in _EMBEDDING_V4):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """A globally routable unicast address (not private, loopback, link-local, shared, multicast,
    reserved or unspecified). An IPv6 address that embeds an IPv4 address (``::ffff:127.0.0.1``,
    ``64:ff9b::7f00:1``, ``2002:7f00:1::``, ``::7f00:1``) is judged as that IPv4 address: those
    forms reach it through NAT64, 6to4 relays or the host's own stack."""
    if isinstance(address, ipaddress.IPv6Address) and (v4 := _embedded_ipv4(address)) is not None:
        address = v4
    return address.is_global and not address.is_multicast


@attrs.frozen
class _Target:
    """One hop of a fetch, parsed and resolved once: what is connected to is what was checked."""

    scheme: str
    host: str  # ASCII (IDNA) host name or IP literal: the Host header and the TLS server name
    port: int
    path: str
    address: str  # the checked IP address the connection goes to


def _target(ref: ImageRef, url: str, limits: ImageLimits) -> _Target:
    """Parse, normalise and resolve ``url``; refuse what the server must not fetch."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        raise _bad(ref, "image URL is malformed") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _bad(ref, f"unsupported image url scheme: {url[:16]}")
    # The host is unquoted once, as an HTTP client would; whatever is left must be a plain host.
    try:
        netloc = urllib.parse.unquote(parts.netloc, errors="strict")
    except UnicodeDecodeError:
        raise _bad(ref, "image URL is malformed") from None
    if "@" in netloc:
        raise _bad(ref, "image URL may not carry credentials (user@host)")
    if _BAD_URL_CHARS.search(netloc) or "\\" in url:
        raise _bad(ref, "image URL is malformed")
    try:
        hostinfo = urllib.parse.urlsplit(f"//{netloc}")
        port = hostinfo.port if hostinfo.port is not None else (443 if parts.scheme == "https" else 80)
        host = hostinfo.hostname or ""
        if not (0 < port < 65536) or not host:
            raise ValueError
        ascii_host = host if ":" in host else host.encode("idna").decode("ascii")
    except (ValueError, UnicodeError):
        raise _bad(ref, "image URL is malformed") from None
    try:
        infos = socket.getaddrinfo(ascii_host, port, type=socket.SOCK_STREAM)
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    except (OSError, UnicodeError, ValueError):
        raise _bad(ref, FETCH_FAILED) from None
    if not addresses:
        raise _bad(ref, FETCH_FAILED)
    if not limits.allow_private and not all(_public(a) for a in addresses):
        raise _bad(ref, f"image URL host {ascii_host!r} is a private or loopback address "
                        "(the server fetches public URLs only; see --allow-private-image-urls)")
    path = parts.path or "/"
    return _Target(parts.scheme, ascii_host, port, path + (f"?{parts.query}" if parts.query else ""),
                   str(addresses[0]))


def _connection(target: _Target, timeout: float) -> http.client.HTTPConnection:
    """An HTTP(S) connection to ``target.address`` that names ``target.host`` (Host, SNI)."""
    address = target.address

    class Pinned(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.create_connection((address, self.port), self.timeout)

    class PinnedTLS(http.client.HTTPSConnection):
        def connect(self) -> None:
            sock = socket.create_connection((address, self.port), self.timeout)
            self.sock = self._context.wrap_socket(sock, server_hostname=self.host)

    if target.scheme == "https":
        return PinnedTLS(target.host, target.port, timeout=timeout, context=ssl.create_default_context())
    return Pinned(target.host, target.port, timeout=timeout)


def _fetch(ref: ImageRef, url: str, limits: ImageLimits) -> bytes:
    """GET ``url``: every hop parsed, resolved and checked once, then connected to by the
    checked address; redirects followed by hand (at most :data:`MAX_REDIRECTS`)."""
    deadline = time.monotonic() + limits.fetch_timeout
    for _hop in range(MAX_REDIRECTS + 1):
        target = _target(ref, url, limits)
        conn = _connection(target, max(deadline - time.monotonic(), 0.01))
        try:
            conn.request("GET", target.path, headers={"User-Agent": "mlxrt", "Accept": "image/*"})
            response = conn.getresponse()
            if response.status in _REDIRECTS:
                location = response.getheader("Location")
                if not location:
                    raise _bad(ref, f"image fetch failed: {response.status} without a Location")
                url = urllib.parse.urljoin(url, location)
                continue
            if response.status != 200:
                raise _bad(ref, f"image fetch failed: {response.status}")
            length = response.getheader("Content-Length")
            if length and length.isdigit() and int(length) > limits.max_bytes:
                raise _bad(ref, f"image is larger than the {limits.max_bytes}-byte limit")
            chunks: list[bytes] = []
            size = 0
            while size <= limits.max_bytes:
                if time.monotonic() > deadline:  # a server dripping bytes is a timeout too
                    raise TimeoutError
                chunk = response.read1(min(65536, limits.max_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size > limits.max_bytes:
                raise _bad(ref, f"image is larger than the {limits.max_bytes}-byte limit")
            return b"".join(chunks)
        except InvalidRequest:
            raise
        except (OSError, http.client.HTTPException, ValueError):
            raise _bad(ref, FETCH_FAILED) from None
        finally:
            conn.close()
    raise _bad(ref, f"{FETCH_FAILED} (more than {MAX_REDIRECTS} redirects)")


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


def decode_bytes(ref: ImageRef, raw: bytes, limits: ImageLimits, spent: int = 0,
                 lease: PixelLease | None = None) -> Any:
    """Encoded bytes → an RGB image (EXIF orientation applied, first frame of animations).

    ``spent``: pixels the request's earlier images took of ``limits.max_total_pixels``; the
    budget is checked from the header, before any pixel is decoded. ``lease``: the request's
    share of the server's :class:`PixelBudget`, taken from the header too (it may wait)."""
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
            if spent + width * height > limits.max_total_pixels:
                raise _bad(ref, f"the request's images exceed the {limits.max_total_pixels}-pixel budget per "
                                "request (--max-image-pixels)")
            if lease is not None:
                lease.take(ref, width * height)
            image.seek(0)
            image.load()
            image = ImageOps.exif_transpose(image)
    except (InvalidRequest, QueueFull):
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


def load_images(refs: Sequence[ImageRef], limits: ImageLimits | None = None,
                lease: PixelLease | None = None) -> list[Any]:
    """:func:`load_image` for each reference, in order, within the per-request caps and, with
    a ``lease``, within the server's :class:`PixelBudget` (each image's pixels taken before it
    is decoded; the caller gives them back when it drops the images).

    :raises InvalidRequest: more than ``limits.max_images`` references (before anything is
        fetched), or images over ``limits.max_total_pixels`` together, naming the part.
    :raises QueueFull: no room in the server's pixel budget within :data:`PIXEL_WAIT_S`.
    """
    limits = limits or ImageLimits()
    if len(refs) > limits.max_images:
        raise _bad(refs[limits.max_images], f"the request has {len(refs)} images, over the limit of "
                                            f"{limits.max_images} per request (--max-images)")
    images: list[Any] = []
    spent = 0
    for ref in refs:
        image = decode_bytes(ref, _encoded(ref, limits), limits, spent, lease)
        spent += image.width * image.height
        images.append(image)
    return images
