"""Content negotiation of the inline answer: JSON unless the caller prefers a binary rendering."""

from __future__ import annotations

import pytest

from encoder_pod.api.answers import AnswerFormat, negotiate

pytestmark = pytest.mark.unit

J, B, M = AnswerFormat.JSON, AnswerFormat.BINARY, AnswerFormat.MSGPACK


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, J),
        ("", J),
        ("*/*", J),  # curl
        ("application/json", J),
        ("application/octet-stream", B),
        ("Application/Octet-Stream", B),
        ("application/x-msgpack", M),
        ("application/msgpack", M),
        ("application/vnd.msgpack", M),
        ("text/html", J),  # nothing this pod writes: the default, not a 406
        ("application/octet-stream, application/json", B),  # equal quality: the first listed
        ("application/json, application/octet-stream", J),
        ("application/json;q=0.5, application/octet-stream", B),
        ("application/octet-stream;q=0.9, application/x-msgpack", M),
        ("*/*, application/octet-stream", B),  # an exact type beats a wildcard of equal quality
        ("application/*;q=1, application/x-msgpack;q=0.8", J),
        ("application/octet-stream;q=0", J),  # q=0 refuses the type
        ("application/octet-stream; q=nonsense, application/x-msgpack;q=0.1", M),
        ("application/octet-stream ; charset=x ; q=0.3, application/json;q=0.2", B),
    ],
)
def test_negotiate(accept, expected):
    assert negotiate(accept) is expected
