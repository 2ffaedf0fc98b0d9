"""Decoding image bytes into RGB PIL images, with header checks before any pixel is decoded."""

from __future__ import annotations

import io

from PIL import Image, UnidentifiedImageError


def decode_image(data: bytes, max_pixels: int) -> Image.Image:
    """An RGB image; ValueError names the reason (not an image, truncated, too large)."""
    if not data:
        raise ValueError("empty item (0 bytes)")
    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ValueError("bytes are not a decodable image") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ValueError(f"image header declares too many pixels: {exc}") from None
    width, height = img.size
    # The header is read; check the declared size before decoding a single pixel.
    if width * height > max_pixels:
        raise ValueError(
            f"image is {width}x{height} pixels ({width * height}), above the limit of "
            f"{max_pixels} (ENCODER_MAX_IMAGE_PIXELS)"
        )
    if width < 1 or height < 1:
        raise ValueError(f"image is {width}x{height} pixels")
    try:
        img.load()
    except (OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"image data is corrupt or truncated ({exc})") from None
    return img.convert("RGB") if img.mode != "RGB" else img
