"""Splitting items over encoders the way SGLang's receiver does."""

from __future__ import annotations

import random

import pytest

from encoder_pod.modality import Modality
from encoder_pod.receiver.client import plan_parts

pytestmark = pytest.mark.unit


def test_items_split_evenly_in_contiguous_chunks():
    plans = plan_parts("r", [("image", f"i{k}") for k in range(5)], ["http://a", "http://b"])
    assert [(p.part_idx, p.num_parts, p.encoder_url, p.items) for p in plans] == [
        (0, 2, "http://a", ("i0", "i1", "i2")),
        (1, 2, "http://b", ("i3", "i4")),
    ]
    assert plans[1].req_id == "r_local_part_1"


def test_modalities_numbered_in_order_and_extra_items_rotate():
    items = [(Modality.IMAGE, "i0"), (Modality.AUDIO, "a0"), (Modality.IMAGE, "i1"), (Modality.IMAGE, "i2")]
    plans = plan_parts("r", items, ["e0", "e1"])
    assert [(p.part_idx, p.modality, p.encoder_idx, p.items) for p in plans] == [
        (0, Modality.IMAGE, 0, ("i0", "i1")),
        (1, Modality.IMAGE, 1, ("i2",)),
        (2, Modality.AUDIO, 1, ("a0",)),  # encoder 0 got the image extra, encoder 1 gets the audio one
    ]
    assert {p.num_parts for p in plans} == {3}


def test_fewer_items_than_encoders_skips_empty_encoders():
    plans = plan_parts("r", [("VIDEO", "v")], ["e0", "e1", "e2"])
    assert [(p.part_idx, p.num_parts, p.encoder_idx) for p in plans] == [(0, 1, 0)]


def test_shuffle_keeps_every_item_once():
    items = [("IMAGE", k) for k in range(7)]
    plans = plan_parts("r", items, ["e0", "e1", "e2"], rng=random.Random(3))
    assert sorted(i for p in plans for i in p.items) == list(range(7))
    assert [p.part_idx for p in plans] == list(range(len(plans)))


def test_body_is_the_encode_contract():
    [plan] = plan_parts("r", [("IMAGE", "u")], ["http://e/"])
    assert plan.body("10.0.0.1", 5000) == {
        "req_id": "r_local_part_0", "mm_items": ["u"], "modality": "IMAGE", "num_parts": 1, "part_idx": 0,
        "prefill_host": "10.0.0.1", "embedding_port": 5000, "encoder_idx": 0,
    }
    assert plan.encoder_url == "http://e"
