"""Fetching an item's bytes: data: URIs, raw base64, http(s) URLs (opt-in), local files (opt-in).

Each source is refused unless the operator allowed it: URL fetching needs ALLOW_URL_FETCH and a
host in ALLOWED_URL_HOSTS; file paths need ALLOWED_LOCAL_MEDIA_PATH and may not escape it
through ``..`` or symbolic links.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from pathlib import Path
from urllib.parse import unquote_to_bytes, urlsplit

import httpx

from encoder_pod.errors import MediaError
from encoder_pod.settings import MediaSettings

_BASE64 = re.compile(r"^[A-Za-z0-9+/_\-\s]*={0,2}\s*$")

B64_SLICE = 1 << 19
"""Characters decoded per step (a multiple of 4): a multi-megabyte item never holds the GIL long."""


class SourceError(MediaError):
    """The item's bytes cannot be had (refused source, bad base64, fetch failed); the message says why."""


def _b64decode(text: str) -> bytes:
    if len(text) > B64_SLICE and "-" not in text and "_" not in text:
        return _b64decode_sliced(text)
    compact = "".join(text.split())
    compact += "=" * (-len(compact) % 4)
    try:
        if "-" in compact or "_" in compact:
            return base64.urlsafe_b64decode(compact)
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SourceError(f"invalid base64 ({exc})") from None


def _b64decode_sliced(text: str) -> bytes:
    """As :func:`_b64decode` (standard alphabet, validated), one slice at a time.

    A media thread decoding a multi-megabyte item then gives the GIL back between slices, so the
    event loop of the same process keeps answering.
    """
    decoded: list[bytes] = []
    carry = ""
    try:
        for start in range(0, len(text), B64_SLICE):
            piece = carry + "".join(text[start : start + B64_SLICE].split())
            if start + B64_SLICE >= len(text):
                carry = ""
                piece += "=" * (-len(piece) % 4)
            else:
                cut = len(piece) - len(piece) % 4
                piece, carry = piece[:cut], piece[cut:]
                if "=" in piece:
                    raise binascii.Error("padding before the end")  # as validating the whole string says
            decoded.append(base64.b64decode(piece, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise SourceError(f"invalid base64 ({exc})") from None
    return b"".join(decoded)


def _data_uri(uri: str) -> bytes:
    header, sep, payload = uri[5:].partition(",")
    if not sep:
        raise SourceError("malformed data: URI (no comma)")
    if header.endswith(";base64"):
        return _b64decode(payload)
    return unquote_to_bytes(payload)


def looks_like_base64(text: str) -> bool:
    """Raw base64 (JPEG's starts with '/9j/', so a leading '/' alone does not make a path)."""
    return len(text) >= 16 and bool(_BASE64.match(text))


class MediaSources:
    """Turns an item's source string into bytes under the configured policy."""

    def __init__(self, media: MediaSettings, max_bytes: int) -> None:
        """``max_bytes``: the largest item fetched from a URL or a file (the body limit)."""
        self._settings = media
        self._max_bytes = max_bytes
        root = media.allowed_local_media_path
        self._root = Path(os.path.realpath(root)) if root else None

    def fetch(self, source: str) -> bytes:
        """The item's bytes; raises :class:`SourceError` naming the reason."""
        lowered = source[:16].lower()
        if lowered.startswith("data:"):
            return _data_uri(source)
        if lowered.startswith(("http://", "https://")):
            return self._url(source)
        if lowered.startswith("file://"):
            return self._file(source[7:])
        if not looks_like_base64(source) and any(c in source for c in "/.\\"):
            return self._file(source)
        return _b64decode(source)

    def _url(self, url: str) -> bytes:
        if not self._settings.allow_url_fetch:
            raise SourceError("URL items are refused: fetching is off (ENCODER_ALLOW_URL_FETCH=false)")
        try:
            host = (urlsplit(url).hostname or "").lower()
        except ValueError as exc:  # e.g. an unclosed IPv6 bracket
            raise SourceError(f"malformed URL ({exc})") from None
        if host not in self._settings.allowed_url_hosts:
            raise SourceError(f"host {host!r} is not in ENCODER_ALLOWED_URL_HOSTS")
        timeout = httpx.Timeout(self._settings.url_fetch_timeout)
        # Redirects are not followed: a redirect could lead off the allowed hosts.
        try:
            with httpx.Client(timeout=timeout, follow_redirects=False) as client:
                with client.stream("GET", url) as resp:
                    if resp.status_code != 200:
                        raise SourceError(f"fetching {url} gave HTTP {resp.status_code}")
                    chunks, size = [], 0
                    for chunk in resp.iter_bytes():
                        size += len(chunk)
                        if size > self._max_bytes:
                            raise SourceError(f"{url} is larger than {self._max_bytes} bytes")
                        chunks.append(chunk)
                    return b"".join(chunks)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # unreachable, timed out, reset: the URL's fault
            raise SourceError(f"fetching {url} failed ({type(exc).__name__}: {exc})") from None

    def _file(self, path: str) -> bytes:
        if self._root is None:
            raise SourceError("file paths are refused (ENCODER_ALLOWED_LOCAL_MEDIA_PATH is unset)")
        # realpath resolves '..' and every symbolic link, so the check sees where the bytes live.
        try:
            real = Path(os.path.realpath(self._root / path if not os.path.isabs(path) else path))
        except ValueError:  # an embedded NUL: no file can have this name
            raise SourceError(f"path {path!r} is not a valid file name") from None
        if not real.is_relative_to(self._root):
            raise SourceError(f"path {path!r} is outside the allowed media directory")
        if not real.is_file():
            raise SourceError(f"no such file {path!r} under the allowed media directory")
        try:
            if real.stat().st_size > self._max_bytes:
                raise SourceError(f"file {path!r} is larger than {self._max_bytes} bytes")
            return real.read_bytes()
        except OSError as exc:  # unreadable (permissions, vanished): this item's file, not the server
            raise SourceError(f"file {path!r} cannot be read ({type(exc).__name__})") from None
