"""Fetching an item's bytes: data: URIs, raw base64, http(s) URLs, local files (opt-in).

http(s) URLs follow SGLang's ``--allowed-media-domains`` rule plus a private-address guard
(:mod:`encoder_pod.media.url_fetch`; ALLOW_URL_FETCH=false refuses them all). File paths need
ALLOWED_LOCAL_MEDIA_PATH and may not escape it through ``..`` or symbolic links. An item that
names a ``content_hash`` gets exactly the bytes it names: ``sha256:<hex>`` of what was fetched
(the decoded payload of a data: URI or base64 string), else 400, as SGLang's encoder checks it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from pathlib import Path
from urllib.parse import unquote_to_bytes

import pybase64

from encoder_pod.media.url_fetch import SourceError, UrlPolicy, fetch_url
from encoder_pod.protocol import ItemSpec
from encoder_pod.settings import MediaSettings

_BASE64 = re.compile(r"^[A-Za-z0-9+/_\-\s]*={0,2}\s*$")

PATH_MAX = 4096
"""Longest path Linux opens: a longer item string is never a file."""

B64_SLICE = 1 << 19
"""Characters decoded per step (a multiple of 4): a multi-megabyte item never holds the GIL long."""

__all__ = ["MediaSources", "SourceError", "looks_like_base64"]


def _b64decode(text: str) -> bytes:
    """The bytes of standard or URL-safe base64, whitespace and missing padding allowed.

    Strict, well-formed base64 (what clients send) is decoded at once with ``pybase64`` (SIMD:
    about 40x the standard library's speed); anything else takes the careful path below, which
    accepts the same inputs the standard library does and names the reason for a refusal.
    """
    if len(text) <= B64_SLICE:
        try:
            return pybase64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            pass
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
            try:
                decoded.append(pybase64.b64decode(piece, validate=True))
            except binascii.Error:
                decoded.append(base64.b64decode(piece, validate=True))  # raises, naming the fault
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
        self._policy = UrlPolicy(media)

    def fetch_item(self, spec: ItemSpec) -> bytes:
        """The item's bytes, checked against its ``content_hash`` when it names one."""
        data = self.fetch(spec.source)
        if spec.content_hash is not None:
            got = "sha256:" + hashlib.sha256(data).hexdigest()
            if got != spec.content_hash:
                raise SourceError(f"content hash mismatch: expected {spec.content_hash}, got {got}")
        return data

    @staticmethod
    def kind(source: str) -> str:
        """How ``source`` carries its bytes: ``data`` (a data: URI), ``url``, ``file`` or ``base64``."""
        lowered = source[:16].lower()
        if lowered.startswith("data:"):
            return "data"
        if lowered.startswith(("http://", "https://")):
            return "url"
        if lowered.startswith("file://") or (not looks_like_base64(source) and any(c in source for c in "/.\\")):
            return "file"
        return "base64"

    @staticmethod
    def in_body(source: str) -> bool:
        """True when ``source`` surely carries its bytes itself: no fetch, no disk read.

        Cheap enough for the event loop (no scan of the whole string): a data: URI, or a string
        longer than any path (``PATH_MAX``) that names no URL. Shorter raw base64 counts as not.
        """
        lowered = source[:16].lower()
        if lowered.startswith("data:"):
            return True
        return len(source) > PATH_MAX and not lowered.startswith(("http://", "https://", "file://"))

    def fetch(self, source: str) -> bytes:
        """The item's bytes; raises :class:`SourceError` naming the reason."""
        kind = self.kind(source)
        if kind == "data":
            return _data_uri(source)
        if kind == "url":
            return self._url(source)
        if kind == "file":
            return self._file(source[7:] if source[:7].lower() == "file://" else source)
        return _b64decode(source)

    def _url(self, url: str) -> bytes:
        if not self._settings.allow_url_fetch:
            raise SourceError("URL items are refused: fetching is off (ENCODER_ALLOW_URL_FETCH=false)")
        return fetch_url(url, self._policy, timeout=self._settings.url_fetch_timeout, max_bytes=self._max_bytes)

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
