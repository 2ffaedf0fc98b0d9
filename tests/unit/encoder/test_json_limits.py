"""JSON with a bound on nesting: the same values as json.loads, and a named refusal beyond the bound."""

from __future__ import annotations

import json

import pytest

from encoder_pod.api.json_body import parse_large
from encoder_pod.json_limits import MAX_DEPTH, JsonTooDeep, loads, may_nest_deeper

pytestmark = pytest.mark.unit


def nested(depth: int, opener: str = "[") -> str:
    if opener == "[":
        return "[" * depth + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


SHALLOW_BUT_BUSY = [
    nested(MAX_DEPTH),  # exactly at the limit
    nested(MAX_DEPTH, "{"),
    "[" + ",".join(["[]", "{}"] * 500) + "]",  # a thousand siblings: two levels
    json.dumps({"req_id": "[[[[" * 40, "mm_items": [{"url": f"u{i}"} for i in range(200)]}),  # brackets in strings
    '{"k": "\\u005b\\u005b", "v": [[[1]]], "w": "\\"[\\""}',
]


@pytest.mark.parametrize("text", SHALLOW_BUT_BUSY, ids=range(len(SHALLOW_BUT_BUSY)))
def test_anything_within_the_bound_is_what_json_loads_gives(text):
    assert loads(text) == loads(text.encode()) == json.loads(text)
    assert parse_large([text.encode()]) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    [nested(MAX_DEPTH + 1), nested(MAX_DEPTH + 1, "{"), "[" * 100_000, '{"a": ' * 100_000, '[{"a": ' * 50_000,
     '{"mm_items": ' + "[" * 300_000 + "]" * 300_000 + "}"],
    ids=["limit+1", "objects-limit+1", "100k-open", "100k-objects", "mixed", "300k-closed"],
)
def test_deeper_than_the_bound_is_refused_naming_it(text):
    # Without the bound json.loads itself recurses into a RecursionError for most of these.
    for parse in (loads, lambda t: parse_large([t.encode()])):
        with pytest.raises(JsonTooDeep, match=f"deeper than {MAX_DEPTH} levels \\(the limit\\)") as info:
            parse(text)
        assert isinstance(info.value, ValueError)


def test_the_count_only_lets_through_what_cannot_be_too_deep():
    assert not may_nest_deeper(nested(MAX_DEPTH)) and not may_nest_deeper(b"{}" * MAX_DEPTH)
    assert may_nest_deeper("[" * (MAX_DEPTH + 1)) and may_nest_deeper(b"[]" * (MAX_DEPTH + 1))


def test_errors_other_than_depth_are_json_loads_errors():
    for text in ("[" * 30 + "1," + "[]" * 40, '{"a": ]' + "[" * 70):  # bad before any level is too deep
        with pytest.raises(json.JSONDecodeError) as expected:
            json.loads(text)
        with pytest.raises(json.JSONDecodeError) as got:
            loads(text)
        assert (got.value.msg, got.value.pos) == (expected.value.msg, expected.value.pos)
    with pytest.raises(UnicodeDecodeError):
        loads(b'["\xff"' + b"[" * 70)
