"""Deterministic test images as ``data:`` URIs, for tests and benchmarks alike."""

from __future__ import annotations

import base64
import io

from PIL import Image


def png_data_uri(width: int, height: int, seed: int = 0, fmt: str = "PNG") -> str:
    """A deterministic noisy image as a data: URI."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 255, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    mime = "png" if fmt == "PNG" else "jpeg"
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def jpeg_uri(width: int = 640, height: int = 480, seed: int = 0) -> str:
    """A photo-like JPEG (smooth gradients plus mild noise, so it compresses as photos do) as a data: URI."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // width), (y * 255 // height), ((x + y) * 127 // (width + height))], -1)
    arr = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
