"""Item sources and image decoding policy."""

from __future__ import annotations

import base64
import binascii
import io
import os

import pytest
from PIL import Image

from encoder_pod.errors import MediaError
from encoder_pod.media.images import decode_image
from encoder_pod.media.sources import B64_SLICE, MediaSources, SourceError
from encoder_pod.settings import load_settings

pytestmark = pytest.mark.unit


def _sources(**env: str) -> MediaSources:
    settings = load_settings(env=env)
    return MediaSources(settings.media, max_bytes=settings.server.max_request_bytes)


def _png(w: int = 20, h: int = 10) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


def _jpeg_b64() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, format="JPEG")
    return base64.b64encode(buf.getvalue()).decode()


def test_data_uri_raw_base64_and_jpeg_leading_slash():
    src = _sources()
    png = _png()
    assert src.fetch("data:image/png;base64," + base64.b64encode(png).decode()) == png
    assert src.fetch(base64.b64encode(png).decode()) == png
    jpeg = _jpeg_b64()
    assert jpeg.startswith("/9j/")  # looks like a path, is base64
    assert src.fetch(jpeg)[:2] == b"\xff\xd8"


@pytest.mark.parametrize("size", [3000, B64_SLICE // 4 * 3 + 5])  # decoded at once / slice by slice
def test_base64_in_every_form_clients_send_decodes_as_the_standard_library_does(size):
    """Strict base64 takes the fast decoder; MIME line breaks, URL-safe, missing padding the careful one: same bytes."""
    src = _sources()
    data = os.urandom(size)
    strict = base64.b64encode(data).decode()
    forms = {
        "strict": strict,
        "mime": base64.encodebytes(data).decode(),  # a newline every 76 characters
        "unpadded": strict.rstrip("="),
        "urlsafe": base64.urlsafe_b64encode(data).decode(),
    }
    for name, text in forms.items():
        assert src.fetch("data:image/png;base64," + text) == data, name
        assert src.fetch(text) == data, name


@pytest.mark.parametrize("size", [3000, B64_SLICE // 4 * 3 + 5])
def test_invalid_base64_is_refused_with_the_standard_librarys_reason(size):
    text = base64.b64encode(os.urandom(size)).decode()
    bad = text[:100] + "*" + text[101:]
    with pytest.raises(binascii.Error) as stdlib:
        base64.b64decode(bad, validate=True)
    with pytest.raises(SourceError, match="invalid base64") as ours:
        _sources().fetch("data:image/png;base64," + bad)
    assert str(stdlib.value) in str(ours.value)


def test_only_items_that_surely_carry_their_bytes_count_as_in_the_body():
    """What the model thread may decode itself: never an item that needs a fetch or a disk read."""
    src = _sources()
    big = base64.b64encode(os.urandom(8000)).decode()
    assert src.in_body("data:image/png;base64," + base64.b64encode(_png()).decode())
    assert src.in_body("DATA:image/png;base64,AAAA")
    assert src.in_body(big) and src.kind(big) == "base64"
    for elsewhere in ["https://example.com/a.png", "http://10.0.0.1/" + "a" * 5000, "file://a.png", "/data/images/cat.png"]:
        assert not src.in_body(elsewhere), elsewhere
    assert not src.in_body(_jpeg_b64())  # raw base64 as short as a path: the media threads tell
    assert [src.kind(s) for s in ("data:,x", "https://h/a", "file://a", "/tmp/a.png", _jpeg_b64())] == [
        "data", "url", "file", "file", "base64"]


def test_paths_refused_without_root_and_confined_with_it(tmp_path):
    with pytest.raises(SourceError, match="ALLOWED_LOCAL_MEDIA_PATH"):
        _sources().fetch("/tmp/x.png")
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.png").write_bytes(_png())
    (tmp_path / "out.png").write_bytes(_png())
    os.symlink(tmp_path / "out.png", root / "sneaky.png")
    src = _sources(ENCODER_ALLOWED_LOCAL_MEDIA_PATH=str(root))
    assert src.fetch(str(root / "a.png")) == _png()
    assert src.fetch("file://a.png") == _png()
    for bad in ["../out.png", str(root / "sneaky.png"), "file:///etc/passwd", str(root / ".." / "out.png")]:
        with pytest.raises(SourceError, match="outside"):
            src.fetch(bad)


def test_urls_refused_when_fetching_is_off_or_the_host_is_not_allowed():
    with pytest.raises(SourceError, match="ENCODER_ALLOW_URL_FETCH"):
        _sources(ENCODER_ALLOW_URL_FETCH="false").fetch("https://example.com/a.png")
    src = _sources(ENCODER_ALLOWED_MEDIA_DOMAINS="good.example,127.0.0.1")
    with pytest.raises(SourceError, match="evil.example"):
        src.fetch("https://evil.example/a.png")
    # An allowed host that does not answer (nothing listens on the discard port): the item's fault.
    with pytest.raises(SourceError, match="failed"):
        src.fetch("http://127.0.0.1:9/a.png")


def test_unusable_paths_are_the_items_fault(tmp_path):
    src = _sources(ENCODER_ALLOWED_LOCAL_MEDIA_PATH=str(tmp_path))
    with pytest.raises(SourceError, match="not a valid file name"):
        src.fetch("a\x00.png")


def test_decode_checks_size_before_pixels():
    with pytest.raises(MediaError, match="above the limit"):
        decode_image(_png(100, 100), max_pixels=5000)
    assert decode_image(_png(100, 10), max_pixels=5000).size == (100, 10)
    with pytest.raises(MediaError, match="truncated"):
        decode_image(_png(64, 64)[:80], max_pixels=10**6)
    with pytest.raises(MediaError, match="not a decodable image"):
        decode_image(b"GIF89a-but-not-really", max_pixels=10**6)
    with pytest.raises(MediaError, match="empty"):
        decode_image(b"", max_pixels=10**6)


def test_grayscale_and_rgba_become_rgb():
    buf = io.BytesIO()
    Image.new("LA", (8, 8)).save(buf, format="PNG")
    assert decode_image(buf.getvalue(), 10**6).mode == "RGB"
