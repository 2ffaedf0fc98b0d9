"""A corpus of image files that exercise every branch of vLLM's image decoding and hashing.

Modes RGB, RGBA, LA, L, 1, P (with and without a tRNS transparency entry), CMYK; PNG, JPEG,
WebP, GIF, BMP, TIFF; EXIF orientation (a rotated JPEG) and EXIF ``ImageID`` UUIDs. Deterministic
(seeded), small, built with Pillow at test time.
"""

from __future__ import annotations

import io
import uuid
from typing import Iterator

import numpy as np
from PIL import Image


def _pixels(seed: int, width: int, height: int, channels: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (height // 4 + 1, width // 4 + 1, channels), dtype=np.uint8)
    return np.kron(base, np.ones((4, 4, 1), dtype=np.uint8))[:height, :width]  # blocks survive JPEG


def _save(image: Image.Image, fmt: str, **kw: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **kw)
    return out.getvalue()


def _exif(**tags: object) -> Image.Exif:
    exif = Image.Exif()
    for name, value in tags.items():
        exif[getattr(Image.ExifTags.Base, name)] = value
    return exif


def image_corpus(count_per_kind: int = 3) -> Iterator[tuple[str, bytes]]:
    """``(name, file bytes)`` pairs; ``count_per_kind`` seeds and sizes of each kind."""
    for i in range(count_per_kind):
        w, h = 40 + 12 * i, 28 + 20 * i
        rgb = Image.fromarray(_pixels(i, w, h, 3), "RGB")
        rgba = Image.fromarray(_pixels(100 + i, w, h, 4), "RGBA")
        yield f"rgb-png-{i}", _save(rgb, "PNG")
        yield f"rgb-jpeg-{i}", _save(rgb, "JPEG", quality=90)
        yield f"rgb-webp-{i}", _save(rgb, "WEBP", lossless=True)
        yield f"rgb-bmp-{i}", _save(rgb, "BMP")
        yield f"rgb-tiff-{i}", _save(rgb, "TIFF")
        yield f"rgba-png-{i}", _save(rgba, "PNG")
        yield f"rgba-webp-{i}", _save(rgba, "WEBP", lossless=True)
        yield f"la-png-{i}", _save(rgba.convert("LA"), "PNG")
        yield f"l-png-{i}", _save(rgb.convert("L"), "PNG")
        yield f"l-jpeg-{i}", _save(rgb.convert("L"), "JPEG")
        yield f"bilevel-png-{i}", _save(rgb.convert("1"), "PNG")
        palette = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
        yield f"p-png-{i}", _save(palette, "PNG")
        yield f"p-trns-png-{i}", _save(palette, "PNG", transparency=3)
        yield f"p-gif-{i}", _save(palette, "GIF")
        yield f"cmyk-jpeg-{i}", _save(rgb.convert("CMYK"), "JPEG")
        yield f"exif-rotated-jpeg-{i}", _save(rgb, "JPEG", exif=_exif(Orientation=6 + (i % 3)))
        yield f"exif-imageid-jpeg-{i}", _save(rgb, "JPEG", exif=_exif(ImageID=str(uuid.UUID(int=7_000 + i))))
        yield f"exif-imageid-rgba-png-{i}", _save(rgba, "PNG", exif=_exif(ImageID=str(uuid.UUID(int=9_000 + i))))
