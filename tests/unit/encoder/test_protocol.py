"""Parsing SGLang's /encode body: every rejection names the field and the reason."""

from __future__ import annotations

import pytest

from encoder_pod.errors import InvalidRequest
from encoder_pod.modality import Modality
from encoder_pod.protocol import parse_encode_request

pytestmark = pytest.mark.unit

BASE = {"req_id": "r1_local_part_0", "mm_items": ["data:image/png;base64,AAAA"], "modality": "image"}


def test_sglang_body_parses_with_unknown_fields_ignored():
    body = {**BASE, "num_parts": 3, "part_idx": 2, "prefill_host": "10.0.0.1", "embedding_port": [5000, 5001],
            "encoder_idx": 1, "time_stats_json": "{}", "encoder_url": "http://x"}
    req = parse_encode_request(body)
    assert req.modality is Modality.IMAGE and req.ports == (5000, 5001) and req.part_idx == 2
    assert req.encoder_idx == 1


def test_nested_items_and_dict_items_are_flattened():
    req = parse_encode_request({**BASE, "mm_items": [["a.png", {"url": "b.png", "detail": "high"}], "c.png"]})
    assert [i.source for i in req.items] == ["a.png", "b.png", "c.png"]
    assert req.items[1].options == {"detail": "high"}


@pytest.mark.parametrize(
    "change, words",
    [
        ({"modality": None}, ["'modality'", "required"]),
        ({"modality": "text"}, ["'modality'", "IMAGE, AUDIO, VIDEO"]),
        ({"modality": 3}, ["'modality'"]),
        ({"mm_items": []}, ["'mm_items'", "empty"]),
        ({"mm_items": None}, ["'mm_items'", "missing"]),
        ({"mm_items": {"url": "x"}}, ["'mm_items'", "dict"]),
        ({"mm_items": [""]}, ["mm_items[0]"]),
        ({"mm_items": ["a", {"nourl": 1}]}, ["mm_items[1]"]),
        ({"req_id": ""}, ["'req_id'"]),
        ({"req_id": 5}, ["'req_id'"]),
        ({"num_parts": 0}, ["'num_parts'", "at least 1"]),
        ({"num_parts": "2"}, ["'num_parts'", "integer"]),
        ({"part_idx": 1}, ["'part_idx'", "0..0"]),
        ({"part_idx": -1}, ["'part_idx'"]),
        ({"embedding_port": 70000}, ["'embedding_port'", "1..65535"]),
        ({"embedding_port": []}, ["'embedding_port'"]),
        ({"embedding_port": [1, True]}, ["'embedding_port'"]),
        ({"hashes": {"a": 1}}, ["'hashes'", "list, a string or an integer"]),
        ({"hashes": 1.5}, ["'hashes'"]),
        ({"mm_items": [{"url": "a.png", "content_hash": "md5:abc"}]}, ["mm_items[0]", "sha256:<64 hex digits>"]),
        ({"mm_items": ["a", {"url": "b", "content_hash": "sha256:" + "g" * 64}]}, ["mm_items[1]", "content_hash"]),
        ({"mm_items": [{"url": "a.png", "content_hash": 7}]}, ["mm_items[0]", "content_hash"]),
        ({"mm_items": [{"detail": "high"}]}, ["mm_items[0]", "without 'url'"]),
        ({"prefill_host": 5}, ["'prefill_host'"]),
    ],
)
def test_rejections_name_field(change, words):
    body = {**BASE, **change}
    with pytest.raises(InvalidRequest) as info:
        parse_encode_request({k: v for k, v in body.items() if v is not None or k == "mm_items"})
    assert info.value.http_status == 400
    for word in words:
        assert word in info.value.message


def test_dict_items_as_sglang_sends_them_keep_options_and_a_normalised_content_hash():
    digest = "AB" * 32
    items = [{"url": "http://img/b.png", "content_hash": f" SHA256:{digest} ", "detail": "high", "max_pixels": 1000,
              "preprocess_kwargs": {"min_pixels": 4}, "max_dynamic_patch": 4}, "http://img/a.png"]
    req = parse_encode_request({**BASE, "mm_items": items})
    first, second = req.items
    assert first.content_hash == "sha256:" + digest.lower() and second.content_hash is None
    assert first.options == {"detail": "high", "max_pixels": 1000, "preprocess_kwargs": {"min_pixels": 4}, "max_dynamic_patch": 4}


@pytest.mark.parametrize("hashes, carried", [(["h0", "h1"], ("h0", "h1")), ("h", ("h",)), (42, (42,)), (None, None)])
def test_hashes_are_carried_in_every_form_sglang_accepts(hashes, carried):
    assert parse_encode_request({**BASE, "hashes": hashes}).hashes == carried


def test_non_object_body():
    with pytest.raises(InvalidRequest, match="JSON object"):
        parse_encode_request([1, 2])
