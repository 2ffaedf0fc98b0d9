"""JSON with a bound on nesting: the same values as json.loads, and a named refusal beyond the bound."""

from __future__ import annotations

import json

import pytest

from encoder_pod.api.json_body import parse_large
from encoder_pod.json_limits import MAX_DEPTH, JsonTooDeep, loads, nesting_over

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


def test_the_walk_measures_depth_as_the_bounded_parser_does():
    for opener in "[{":
        assert nesting_over(json.loads(nested(MAX_DEPTH, opener))) is False
        assert nesting_over(json.loads(nested(MAX_DEPTH + 1, opener))) is True
    assert nesting_over(json.loads(nested(3)), limit=2) is True and nesting_over(json.loads(nested(2)), limit=2) is False
    # The deep branch is the last of many siblings, and deep inside an object's value.
    late = {"a": [[] for _ in range(100)] + [json.loads(nested(MAX_DEPTH))]}
    assert nesting_over(late) is True
    assert nesting_over("a string", limit=0) is False and nesting_over(7) is False


def test_a_bounded_walk_gives_up_on_too_many_containers_and_says_so():
    wide = [[] for _ in range(2000)]
    assert nesting_over(wide) is False
    assert nesting_over(wide, most=1000) is None
    assert nesting_over(wide, most=2001) is False


def test_errors_other_than_depth_are_json_loads_errors():
    for text in ("[" * 30 + "1," + "[]" * 40, '{"a": ]' + "[" * 70):  # bad before any level is too deep
        with pytest.raises(json.JSONDecodeError) as expected:
            json.loads(text)
        with pytest.raises(json.JSONDecodeError) as got:
            loads(text)
        assert (got.value.msg, got.value.pos) == (expected.value.msg, expected.value.pos)
    with pytest.raises(UnicodeDecodeError):
        loads(b'["\xff"' + b"[" * 70)
