"""The cache-affinity rule over a pool's endpoints, and the client's plan that follows it."""

from __future__ import annotations

import hashlib

import pytest

from encoder_pod.modality import Modality
from encoder_pod.receiver import plan_affinity_parts
from encoder_pod.rendezvous import affinity_key, choose, score

pytestmark = pytest.mark.unit


def pool(n: int) -> list[str]:
    return [f"http://qwen-{i}.qwen.default.svc:30000" for i in range(n)]


KEYS = [affinity_key(f"data:image/png;base64,item-{k}") for k in range(6000)]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_scaling_n_to_n_plus_1_moves_about_one_in_n_plus_1_keys_all_to_the_new_pod(n):
    before, after = pool(n), pool(n + 1)
    moved = [k for k in KEYS if before[choose(k, before)] != after[choose(k, after)]]
    assert all(after[choose(k, after)] == after[-1] for k in moved)  # nothing reshuffles between old pods
    expected = len(KEYS) / (n + 1)
    assert abs(len(moved) - expected) < 0.15 * expected + 30, (len(moved), expected)


def test_removing_a_pod_moves_only_its_own_keys_and_the_load_stays_even():
    endpoints = pool(4)
    shares = [sum(1 for k in KEYS if choose(k, endpoints) == i) for i in range(4)]
    assert max(shares) < 1.15 * len(KEYS) / 4
    without = endpoints[:1] + endpoints[2:]
    for k in KEYS:
        old = endpoints[choose(k, endpoints)]
        new = without[choose(k, without)]
        assert old == new or old == endpoints[1]


def test_the_rule_is_the_documented_one():
    key = affinity_key("https://img.example/cat.png")
    assert key == hashlib.sha256(b"source:https://img.example/cat.png").digest()
    digest = hashlib.sha256(b"pixels").hexdigest()
    assert affinity_key("anything", "sha256:" + digest) == bytes.fromhex(digest)
    url = "http://qwen-0.qwen.default.svc:30000"
    assert score(url + "/", key) == int.from_bytes(hashlib.sha256(url.encode() + b"\n" + key).digest()[:8], "big")
    order, reverse = pool(3), pool(3)[::-1]
    assert order[choose(key, order)] == reverse[choose(key, reverse)]  # independent of the list's order


def test_affinity_plan_sends_each_item_to_its_pod_and_keeps_order_in_contiguous_parts():
    endpoints = pool(3)
    items = [("IMAGE", f"img-{k}") for k in range(12)] + [("AUDIO", {"url": "a.wav", "content_hash": "sha256:" + "ab" * 32})]
    plans = plan_affinity_parts("req", items, endpoints)
    assert [p.part_idx for p in plans] == list(range(len(plans))) and {p.num_parts for p in plans} == {len(plans)}
    flat = [(p.modality, item) for p in plans for item in p.items]
    assert flat == [(Modality.parse(m), i) for m, i in items]  # parts merged in part order = item order
    for plan in plans:
        for item in plan.items:
            source, content_hash = (item["url"], item["content_hash"]) if isinstance(item, dict) else (item, None)
            assert plan.encoder_url == endpoints[choose(affinity_key(source, content_hash), endpoints)]
    for a, b in zip(plans, plans[1:]):
        assert (a.modality, a.encoder_url) != (b.modality, b.encoder_url)  # runs are maximal
    again = plan_affinity_parts("req2", items[3:5], endpoints)
    assert [p.encoder_url for p in again for _ in p.items] == [
        p.encoder_url for p in plans for i in p.items if i in ("img-3", "img-4")
    ]
