"""Images decoded as vLLM 0.34.0's ``ImageMediaIO`` decodes them, with the facts its hash needs.

vLLM opens the file, turns it upright by its EXIF orientation, loads it, and converts it to RGB:
an image with transparency (RGBA, LA, PA, or a ``transparency`` entry) is first made RGBA and
pasted onto a background colour (white unless ``media_io_kwargs`` says otherwise); any other
mode is ``convert("RGB")``. Whether that conversion happened is a hash factor (``io_config``),
and an EXIF ``ImageID`` UUID replaces the bytes in the hash.

The pixels the embedding is computed from must be these, or the consumer's own processor would
size a different grid (an EXIF rotation swaps width and height): :func:`vllm_image` returns the
upright RGB image, and :func:`pod_bytes` the bytes the encoder decodes to exactly those pixels.
"""

from __future__ import annotations

import io
import uuid as uuid_module
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageOps

from encoder_pod.errors import InvalidRequest, MediaError
from encoder_pod.media.images import decode_image
from encoder_pod.vllm_epd.mm_hash import ImageBytes

DEFAULT_BACKGROUND = (255, 255, 255)


def background_colour(media_io: dict[str, Any] | None, field: str) -> tuple[int, int, int]:
    """``rgba_background_color`` of an image's media_io_kwargs (vLLM's rule: 3 integers 0-255)."""
    value = (media_io or {}).get("rgba_background_color", DEFAULT_BACKGROUND)
    if isinstance(value, list):
        value = tuple(value)
    if not (isinstance(value, tuple) and len(value) == 3 and all(type(c) is int and 0 <= c <= 255 for c in value)):
        raise InvalidRequest(f"field '{field}.rgba_background_color': must be a list of 3 integers in 0..255, got {list(value) if isinstance(value, tuple) else value!r}")
    return value


def _has_transparency(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA") or "transparency" in getattr(image, "info", {})


def _to_rgb(image: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    if _has_transparency(image):
        rgba = image if image.mode == "RGBA" else image.convert("RGBA")
        out = Image.new("RGB", rgba.size, background)
        out.paste(rgba, mask=rgba.split()[3])
        return out
    return image if image.mode == "RGB" else image.convert("RGB")


def _image_id(image: Image.Image) -> bytes | None:
    try:
        value = image.getexif().get(Image.ExifTags.Base.ImageID)
    except Exception:  # noqa: BLE001 - malformed EXIF is ignored, as vLLM ignores it
        return None
    return value.bytes if isinstance(value, uuid_module.UUID) else None


@dataclass(frozen=True)
class DecodedImage:
    """One image item decoded vLLM's way."""

    hash_item: ImageBytes
    image: Image.Image
    """Upright, RGB."""
    changed: bool
    """True when the upright RGB pixels differ from what the plain bytes decode to (rotated or converted)."""


def vllm_image(data: bytes, max_pixels: int, background: tuple[int, int, int]) -> DecodedImage:
    """Decode ``data`` as vLLM does; :class:`MediaError` names why it cannot be used."""
    decode_image(data, max_pixels)  # the pod's own checks first: not an image, too many pixels, truncated
    try:
        opened = Image.open(io.BytesIO(data))
        image_id = _image_id(opened)
        try:
            upright = ImageOps.exif_transpose(opened)
        except Exception:  # noqa: BLE001 - vLLM keeps the image as it is when the transpose fails
            upright = opened
        rotated = _orientation(opened) not in (None, 1)
        upright.load()
        rgb = _to_rgb(upright, background)
    except (OSError, ValueError, SyntaxError) as exc:
        raise MediaError(f"image cannot be decoded ({type(exc).__name__}: {exc})") from None
    converted = rgb is not upright
    io_config = {"image_mode": "RGB", "rgba_background_color": background} if converted else None
    # The pod's decoder converts other modes to RGB the same way; only a rotation or a composite differs.
    return DecodedImage(ImageBytes(data, io_config, image_id), rgb, rotated or _has_transparency(upright))


def _orientation(image: Image.Image) -> int | None:
    try:
        value = image.getexif().get(Image.ExifTags.Base.Orientation)
    except Exception:  # noqa: BLE001
        return None
    return value if isinstance(value, int) else None


def pod_bytes(decoded: DecodedImage) -> bytes:
    """Bytes the encoder's own decoder turns into ``decoded.image``: the original file when that
    holds already, else the upright RGB pixels as a PNG (lossless)."""
    if not decoded.changed:
        return decoded.hash_item.data
    out = io.BytesIO()
    decoded.image.save(out, format="PNG", compress_level=1)
    return out.getvalue()
