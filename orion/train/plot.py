"""A loss-curve PNG with no plotting library: a small rasterizer and a PNG writer
(zlib + struct). matplotlib is not available to this project and would be a heavy
runtime dependency for one chart, so the chart is drawn here: axes, a light grid, the
loss per step, and tick labels drawn with a 3x5 pixel font."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence

import numpy as np

_FONT = {  # 3x5 glyphs, rows top to bottom, 3 bits each
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001001001001", "8": "111101111101111",
    "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
    "e": "000111111100111", "k": "100101110101101",
}


def write_png(path: str | os.PathLike[str], rgb: np.ndarray) -> None:
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].astype(np.uint8).tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    from orion.train.atomic import atomic_write_bytes

    atomic_write_bytes(path, png)


def _text(img: np.ndarray, x: int, y: int, s: str, color: tuple[int, int, int]) -> None:
    for ch in s:
        glyph = _FONT.get(ch)
        if glyph:
            for i, bit in enumerate(glyph):
                if bit == "1":
                    yy, xx = y + 2 * (i // 3), x + 2 * (i % 3)
                    img[yy:yy + 2, xx:xx + 2] = color
        x += 8


def _line(img: np.ndarray, x0: float, y0: float, x1: float, y1: float,
          color: tuple[int, int, int]) -> None:
    n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    xs = np.linspace(x0, x1, n).round().astype(int)
    ys = np.linspace(y0, y1, n).round().astype(int)
    ok = (xs >= 0) & (xs < img.shape[1]) & (ys >= 0) & (ys < img.shape[0])
    img[ys[ok], xs[ok]] = color
    img[np.clip(ys[ok] + 1, 0, img.shape[0] - 1), xs[ok]] = color


def _fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v / 1000:.1f}k"
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"


def loss_curve_png(path: str | os.PathLike[str], steps: Sequence[int],
                   losses: Sequence[float], width: int = 640, height: int = 400,
                   second: tuple[Sequence[int], Sequence[float]] | None = None) -> None:
    """The loss per step in blue; `second` (e.g. validation loss) in orange, on the
    same axes."""
    img = np.full((height, width, 3), 255, np.uint8)
    left, right, top, bottom = 60, 20, 20, 40
    pw, ph = width - left - right, height - top - bottom
    axis = (40, 40, 40)
    series = [(steps, losses, (31, 119, 180))]
    if second is not None:
        series.append((second[0], second[1], (255, 127, 14)))
    curves = []
    for st, ls, color in series:
        pts = [(s, v) for s, v in zip(st, ls, strict=True) if np.isfinite(v)]
        if pts:
            curves.append((np.array([p[0] for p in pts], float),
                           np.array([p[1] for p in pts], float), color))
    if curves:
        all_x = np.concatenate([c[0] for c in curves])
        all_y = np.concatenate([c[1] for c in curves])
        x_lo, x_hi = float(all_x.min()), float(max(all_x.max(), all_x.min() + 1))
        y_lo, y_hi = float(all_y.min()), float(all_y.max())
        if y_hi - y_lo < 1e-6:
            y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
        for i in range(5):  # grid and labels
            gy = top + i * ph / 4
            img[int(gy), left:left + pw] = (225, 225, 225)
            _text(img, 4, int(gy) - 5, _fmt(y_hi - i * (y_hi - y_lo) / 4), axis)
            gx = left + i * pw / 4
            img[top:top + ph, int(gx)] = (225, 225, 225)
            _text(img, int(gx) - 12, top + ph + 10, _fmt(x_lo + i * (x_hi - x_lo) / 4), axis)
        for xs, ys, color in curves:
            px = left + (xs - x_lo) / (x_hi - x_lo) * pw
            py = top + (1 - (ys - y_lo) / (y_hi - y_lo)) * ph
            for i in range(len(px) - 1):
                _line(img, px[i], py[i], px[i + 1], py[i + 1], color)
            if len(px) == 1:
                img[int(py[0]) - 1:int(py[0]) + 2, int(px[0]) - 1:int(px[0]) + 2] = color
    img[top:top + ph + 1, left] = axis
    img[top + ph, left:left + pw + 1] = axis
    write_png(path, img)
