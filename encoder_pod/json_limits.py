"""JSON from outside the process, parsed with a bound on how deeply it nests.

The standard library's parser recurses once per nested array or object: 100,000 levels of ``[``
raise RecursionError (a 500, and a traceback, for a 100 KB body). Every JSON the pod reads from a
peer (request bodies, the answers of SGLang bootstrap servers, the pod answers its receiver
library reads) goes through :func:`loads`, or through :class:`BoundedDecoder` (the HTTP edge's
large-body parser builds on it), and anything nested deeper than :data:`MAX_DEPTH` is refused
with :class:`JsonTooDeep` (a ``ValueError``) naming the limit.

The bound costs nothing on ordinary JSON: text with at most :data:`MAX_DEPTH` brackets and braces
in all cannot nest deeper, so it goes to ``json.loads`` (C) as it is. Only text with more of them
is parsed by the standard library's pure-Python scanner with a depth count, which stops at the
first level too deep. The result is the value ``json.loads`` returns for the same text.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from typing import Any, Callable

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted (SGLang's bodies nest 4 or 5 levels)."""

# In the standard library but not in its type stubs.
_py_make_scanner: Callable[[json.JSONDecoder], Any] = json.scanner.py_make_scanner  # type: ignore[attr-defined]


class JsonTooDeep(ValueError):
    """JSON nested deeper than the limit."""

    def __init__(self, limit: int, at: int) -> None:
        super().__init__(f"JSON nests arrays and objects deeper than {limit} levels (the limit), at character {at}")
        self.limit = limit


def may_nest_deeper(data: bytes | str, limit: int = MAX_DEPTH) -> bool:
    """False when ``data`` cannot nest deeper than ``limit`` (it holds at most ``limit`` brackets and braces)."""
    if isinstance(data, str):
        return data.count("[") + data.count("{") > limit
    return data.count(b"[") + data.count(b"{") > limit


class BoundedDecoder(json.JSONDecoder):
    """The standard library's pure-Python decoder, counting depth: :class:`JsonTooDeep` beyond ``limit``.

    ``parse_string`` replaces the string scanner (the HTTP edge's sliced one); one instance per parse.
    """

    def __init__(self, limit: int = MAX_DEPTH, parse_string: Callable[..., tuple[str, int]] | None = None) -> None:
        super().__init__()
        self._limit = limit
        self._depth = 0
        # The standard library's own parsers, wrapped (the attributes are untyped in its stubs).
        plain_array: Callable[..., Any] = json.decoder.JSONArray  # type: ignore[attr-defined]
        plain_object: Callable[..., Any] = json.decoder.JSONObject  # type: ignore[attr-defined]

        def bounded(plain: Callable[..., Any]) -> Callable[..., Any]:
            """``plain`` (an array or object parser) one nesting level deeper, within the bound."""

            def parse(s_and_end: tuple[str, int], *args: Any) -> Any:
                self._enter(s_and_end[1] - 1)
                try:
                    return plain(s_and_end, *args)
                finally:
                    self._depth -= 1

            return parse

        self.parse_array = bounded(plain_array)
        self.parse_object = bounded(plain_object)
        if parse_string is not None:
            self.parse_string = parse_string
        self.scan_once = _py_make_scanner(self)

    def _enter(self, at: int) -> None:
        self._depth += 1
        if self._depth > self._limit:
            raise JsonTooDeep(self._limit, at)


def decode_text(data: bytes) -> str:
    """JSON bytes as text, the way ``json.loads`` reads them (UTF-8, -16 or -32; UnicodeDecodeError if neither)."""
    return data.decode(json.detect_encoding(data), "surrogatepass")


def loads(data: bytes | str, limit: int = MAX_DEPTH) -> Any:
    """``json.loads`` refusing nesting deeper than ``limit`` (:class:`JsonTooDeep`).

    Raises ``json.JSONDecodeError`` and ``UnicodeDecodeError`` as ``json.loads`` would.
    """
    if not may_nest_deeper(data, limit):
        return json.loads(data)
    return BoundedDecoder(limit).decode(data if isinstance(data, str) else decode_text(data))
