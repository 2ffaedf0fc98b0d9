"""Bodies parsed to exactly what json.loads gives: small ones on the loop, large or busy ones off it in slices."""

from __future__ import annotations

import asyncio
import json

import pytest

from encoder_pod.api.http_server import LOOP_WALK, _parse
from encoder_pod.api.json_body import SCAN_SLICE, SEND_CHUNK, PiecesResponse, parse_large
from encoder_pod.errors import InvalidRequest
from encoder_pod.json_limits import MAX_DEPTH
from encoder_pod.offload import Offload

pytestmark = pytest.mark.unit

LONG = "A" * (3 * SCAN_SLICE + 5)

GOOD = [
    '{"req_id": "x\\"y", "mm_items": ["data:image/png;base64,%s"], "n": [1, 2.5, null, true, false]}' % LONG,
    '{"k": "\\u00e9t\\u00e9 %s", "o": {"nested": [[], {}]}}' % LONG,
    '{"k": "caf\u00e9%s"}' % ("B" * SCAN_SLICE),
    '{"k": "%s\\n"}' % LONG,
    '  [1, "two", -3e5]  ',
    '"plain"',
]

BAD = [
    '{"a": "unterminated %s' % LONG,
    '{"a": "raw\ncontrol"}',
    '{"a": ]',
    "",
    '{"a": 1} trailing',
    '{"a": "%s' % ("C" * 2 * SCAN_SLICE),
]


@pytest.mark.parametrize("text", GOOD, ids=range(len(GOOD)))
def test_same_value_as_json_loads(text):
    data = text.encode()
    assert parse_large([data[:1000], data[1000:]]) == json.loads(data)


@pytest.mark.parametrize("text", BAD, ids=range(len(BAD)))
def test_same_error_as_json_loads(text):
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text.encode())
    with pytest.raises(json.JSONDecodeError) as got:
        parse_large([text.encode()])
    assert (got.value.msg, got.value.pos) == (expected.value.msg, expected.value.pos)


def test_undecodable_bytes_are_refused_as_json_loads_does():
    with pytest.raises(UnicodeDecodeError):
        json.loads(b'{"a": "\xff"}')
    with pytest.raises(UnicodeDecodeError):
        parse_large([b'{"a": "\xff"}'])


def test_a_body_goes_out_in_few_messages_and_unchanged():
    """Each body message crosses every ASGI layer: small pieces are sent together, large ones apart."""
    import asyncio

    def sent(pieces: list[bytes]) -> list[tuple[bytes, bool]]:
        messages: list[dict] = []

        async def send(message: dict) -> None:
            messages.append(message)

        asyncio.run(PiecesResponse(pieces, media_type="application/octet-stream")({}, None, send))  # type: ignore[arg-type]
        assert messages[0]["type"] == "http.response.start"
        return [(m["body"], m["more_body"]) for m in messages[1:]]

    small = [b"head", memoryview(b"x" * 1000), b"tail"]
    assert sent(small) == [(b"head" + b"x" * 1000 + b"tail", False)]
    big = [b"h", b"a" * SEND_CHUNK, b"b" * SEND_CHUNK, b"t"]
    out = sent(big)
    assert b"".join(body for body, _ in out) == b"".join(big) and [more for _, more in out] == [True, True, False]
    assert sent([]) == [(b"", False)]


class _CountingOffload(Offload):
    """The real offload threads, counting what was sent to them."""

    def __init__(self) -> None:
        super().__init__(name="test-offload")
        self.calls: list[str] = []

    async def run(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append(fn.__name__)
        return await super().run(fn, *args, **kwargs)


def _parse_small(text: str) -> tuple[object, list[str]]:
    offload = _CountingOffload()
    try:
        return asyncio.run(_parse([text.encode()], offload)), offload.calls
    finally:
        offload.close()


def test_a_small_body_is_parsed_on_the_loop_and_its_depth_checked_there():
    body = {"req_id": "r", "modality": "IMAGE", "mm_items": ["data:image/png;base64," + "A" * 100_000,
                                                             {"url": "x"}], "extra": [[{"a": [1]}]]}
    assert _parse_small(json.dumps(body)) == (body, [])


def test_a_small_body_with_too_many_containers_to_walk_on_the_loop_is_parsed_off_it_to_the_same_value():
    text = json.dumps({"mm_items": [[] for _ in range(LOOP_WALK + 1)]})
    value, calls = _parse_small(text)
    assert value == json.loads(text) and calls == ["parse_large"]


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_a_small_body_nested_too_deep_is_a_400_naming_the_limit(depth):
    with pytest.raises(InvalidRequest, match=f"deeper than {MAX_DEPTH} levels \\(the limit\\)"):
        _parse_small('{"mm_items": ' + "[" * depth + "]" * depth + "}")
