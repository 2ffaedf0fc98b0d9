"""Large bodies are parsed off the loop in slices, to exactly what json.loads gives."""

from __future__ import annotations

import json

import pytest

from encoder_pod.api.json_body import SCAN_SLICE, SEND_CHUNK, PiecesResponse, parse_large

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
