"""Decoding image bytes into RGB PIL images, with header checks before any pixel is decoded."""

from __future__ import annotations

import io
import struct

from PIL import Image, UnidentifiedImageError

from encoder_pod.errors import MediaError

_PARSE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error)
"""What Pillow's parsers raise on malformed bytes: the item's fault, never ours."""


def decode_image(data: bytes, max_pixels: int) -> Image.Image:
    """An RGB image; :class:`MediaError` names the reason (not an image, truncated, too large)."""
    if not data:
        raise MediaError("empty item (0 bytes)")
    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise MediaError("bytes are not a decodable image") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise MediaError(f"image header declares too many pixels: {exc}") from None
    except _PARSE_ERRORS as exc:
        raise MediaError(f"bytes are not a decodable image ({type(exc).__name__}: {exc})") from None
    width, height = img.size
    # The header is read; check the declared size before decoding a single pixel.
    if width * height > max_pixels:
        raise MediaError(
            f"image is {width}x{height} pixels ({width * height}), above the limit of "
            f"{max_pixels} (ENCODER_MAX_IMAGE_PIXELS)"
        )
    if width < 1 or height < 1:
        raise MediaError(f"image is {width}x{height} pixels")
    try:
        img.load()
        return img.convert("RGB") if img.mode != "RGB" else img
    except _PARSE_ERRORS as exc:
        raise MediaError(f"image data is corrupt or truncated ({exc})") from None
