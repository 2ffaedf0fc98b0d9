"""JSON from outside the process, parsed with a bound on how deeply it nests.

The standard library's parser recurses once per nested array or object: 100,000 levels of ``[``
raise RecursionError (a 500, and a traceback, for a 100 KB body). Every JSON the pod reads from a
peer (request bodies, the answers of SGLang bootstrap servers, the pod answers its receiver
library reads) goes through :func:`loads`, or through :class:`BoundedDecoder` (the HTTP edge's
large-body parser builds on it), and anything nested deeper than :data:`MAX_DEPTH` is refused
with :class:`JsonTooDeep` (a ``ValueError``) naming the limit.

The bound costs next to nothing on ordinary JSON: ``json.loads`` (C) parses the text, and the
value's arrays and objects are walked for their depth (:func:`nesting_over`: a handful for an
/encode body, whatever the size of its items). Counting the brackets of the text instead took as
long as the parse itself (two passes over a 106 KB body: 83 us, the parse 92 us). Text nested far
beyond the bound makes ``json.loads`` raise RecursionError, which is caught. Only text found too
deep is parsed again, by the standard library's pure-Python scanner with a depth count, which
stops at the first level too deep and names where. The result is the value ``json.loads``
returns for the same text, and its errors are ``json.loads``'s.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import math
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


def nesting_over(value: Any, limit: int = MAX_DEPTH, most: float = math.inf) -> bool | None:
    """Whether ``value`` (as ``json.loads`` returns it) nests arrays and objects deeper than ``limit``
    (the outermost one is level 1); None once more than ``most`` of them were looked at without
    an answer (a walk bounded for an event loop)."""
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, (dict, list)) else []
    looked = 0
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        looked += 1
        if looked > most:
            return None
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


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
    try:
        value = json.loads(data)
    except RecursionError:
        pass  # nested beyond what the C parser recurses into, far beyond the limit
    else:
        if not nesting_over(value, limit):
            return value
    # Too deep: the bounded scanner finds the first level over the limit and names where.
    return BoundedDecoder(limit).decode(data if isinstance(data, str) else decode_text(data))
