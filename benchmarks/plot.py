"""Line charts for the serving benchmark, drawn with Pillow's ImageDraw (no matplotlib).

`concurrency_png` draws aggregate output tokens/s against the number of concurrent clients:
one panel per model (each with its own y scale, since a tiny random model and a real one
differ by orders of magnitude), one line per server, a shared legend.

    from plot import concurrency_png
    concurrency_png({"tiny": {"mlxrt": [(1, 90.0), (8, 400.0)], "mlx_lm.server": [...]}},
                    "out.png", title="Aggregate output tok/s")
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from PIL import Image, ImageDraw, ImageFont

__all__ = ["concurrency_png", "nice_ticks"]

# One colour and marker per server, in legend order; unknown servers cycle through the rest.
_STYLES = [((31, 119, 180), "circle"), ((214, 39, 40), "square"), ((44, 160, 44), "triangle"),
           ((148, 103, 189), "diamond")]
_PANEL_W, _PANEL_H = 520, 380
_MARGIN = {"left": 78, "right": 24, "top": 44, "bottom": 58}


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 up to at least `top` (steps of 1, 2, 2.5 or 5 times 10^k)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 or v == int(v) else f"{v:.1f}"


def _text_size(draw: ImageDraw.ImageDraw, text: str, font) -> tuple[int, int]:
    box = draw.textbbox((0, 0), text, font=font)
    return box[2] - box[0], box[3] - box[1]


def _marker(draw: ImageDraw.ImageDraw, x: float, y: float, kind: str, colour) -> None:
    r = 5
    if kind == "square":
        draw.rectangle((x - r, y - r, x + r, y + r), fill=colour)
    elif kind == "triangle":
        draw.polygon([(x, y - r - 1), (x - r - 1, y + r), (x + r + 1, y + r)], fill=colour)
    elif kind == "diamond":
        draw.polygon([(x, y - r - 1), (x + r + 1, y), (x, y + r + 1), (x - r - 1, y)], fill=colour)
    else:
        draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)


def _panel(img: Image.Image, x0: int, name: str, lines: Mapping[str, Sequence[tuple[int, float]]],
           styles: Mapping[str, tuple]) -> None:
    draw = ImageDraw.Draw(img)
    small, label = _font(13), _font(15)
    left, top = x0 + _MARGIN["left"], _MARGIN["top"]
    right, bottom = x0 + _PANEL_W - _MARGIN["right"], _PANEL_H - _MARGIN["bottom"]
    xs = sorted({c for pts in lines.values() for c, _ in pts})
    ymax = max((v for pts in lines.values() for _, v in pts), default=1.0)
    yticks = nice_ticks(ymax * 1.05)

    # x positions: concurrency 1, 2, 4, 8 are evenly spaced (a log2 axis).
    def px(c: int) -> float:
        if len(xs) == 1:
            return (left + right) / 2
        lo, hi = math.log2(xs[0]), math.log2(xs[-1])
        return left + 20 + (math.log2(c) - lo) / (hi - lo) * (right - left - 40)

    def py(v: float) -> float:
        return bottom - v / yticks[-1] * (bottom - top)

    w, _ = _text_size(draw, name, label)
    draw.text(((left + right - w) / 2, 12), name, fill="black", font=label)
    for v in yticks:
        y = py(v)
        draw.line((left, y, right, y), fill=(228, 228, 228))
        draw.line((left - 5, y, left, y), fill="black")
        tw, th = _text_size(draw, _fmt(v), small)
        draw.text((left - 9 - tw, y - th / 2 - 2), _fmt(v), fill="black", font=small)
    for c in xs:
        x = px(c)
        draw.line((x, bottom, x, bottom + 5), fill="black")
        tw, _ = _text_size(draw, str(c), small)
        draw.text((x - tw / 2, bottom + 8), str(c), fill="black", font=small)
    draw.rectangle((left, top, right, bottom), outline="black")
    xl = "concurrent clients"
    tw, _ = _text_size(draw, xl, label)
    draw.text(((left + right - tw) / 2, bottom + 30), xl, fill="black", font=label)

    # y label: drawn horizontally on its own strip, then turned a quarter.
    yl = "output tokens/s (all clients)"
    tw, th = _text_size(draw, yl, label)
    strip = Image.new("RGB", (tw + 4, th + 8), "white")
    ImageDraw.Draw(strip).text((2, 0), yl, fill="black", font=label)
    strip = strip.rotate(90, expand=True)
    img.paste(strip, (x0 + 6, int((top + bottom - strip.height) / 2)))

    for server, pts in lines.items():
        colour, kind = styles[server]
        pts = sorted(pts)
        coords = [(px(c), py(v)) for c, v in pts]
        if len(coords) > 1:
            draw.line(coords, fill=colour, width=3)
        for x, y in coords:
            _marker(draw, x, y, kind, colour)


def concurrency_png(data: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]],
                    path: str | os.PathLike, *, title: str = "", note: str = "") -> None:
    """Write a PNG with one panel per model; `data` is model -> server -> [(clients, tok/s)]."""
    servers: list[str] = []
    for lines in data.values():
        servers += [s for s in lines if s not in servers]
    styles = {s: _STYLES[i % len(_STYLES)] for i, s in enumerate(servers)}
    panels = max(1, len(data))
    # the legend in as many lines as the width needs, the note on a line of its own below it
    f = _font(14)
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    rows: list[list[tuple[str, int]]] = [[]]
    x = 20
    for s in servers:
        w = 38 + _text_size(measure, s, f)[0] + 44
        if rows[-1] and x + w > _PANEL_W * panels - 10:
            rows.append([])
            x = 20
        rows[-1].append((s, x))
        x += w
    header, legend_h = (30 if title else 0), 26 * len(rows) + (20 if note else 0) + 8
    img = Image.new("RGB", (_PANEL_W * panels, _PANEL_H + header + legend_h), "white")
    body = Image.new("RGB", (_PANEL_W * panels, _PANEL_H), "white")
    for i, (model, lines) in enumerate(data.items()):
        _panel(body, i * _PANEL_W, model, lines, styles)
    img.paste(body, (0, header))
    draw = ImageDraw.Draw(img)
    if title:
        f = _font(17)
        tw, _ = _text_size(draw, title, f)
        draw.text(((img.width - tw) / 2, 6), title, fill="black", font=f)
    y = header + _PANEL_H + 6
    for row in rows:
        for s, x in row:
            colour, kind = styles[s]
            draw.line((x, y + 9, x + 30, y + 9), fill=colour, width=3)
            _marker(draw, x + 15, y + 9, kind, colour)
            draw.text((x + 38, y), s, fill="black", font=f)
        y += 26
    if note:
        tw, _ = _text_size(draw, note, _font(12))
        draw.text((img.width - tw - 12, y), note, fill=(90, 90, 90), font=_font(12))
    img.save(path)
