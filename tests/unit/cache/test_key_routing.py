"""The data-parallel front's key directory and the router's free-slot take."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from encoder_pod.facts import CacheFacts
from encoder_pod.parallel.key_routing import KeyRouting, pod_cache_info
from encoder_pod.parallel.router import Router

pytestmark = pytest.mark.unit


def test_a_request_goes_where_most_of_its_items_went_ties_to_the_earliest_item():
    keys = KeyRouting(CollectorRegistry())
    assert keys.prefer([b"a"]) is None
    keys.record([b"a", b"b"], rank=1, by_key=False)
    keys.record([b"c"], rank=0, by_key=False)
    assert keys.prefer([b"a"]) == 1
    assert keys.prefer([b"c", b"a"]) == 0 and keys.prefer([b"a", b"c"]) == 1
    assert keys.prefer([b"c", b"a", b"b", b"new"]) == 1
    keys.record([b"a"], rank=0, by_key=False)  # recomputed elsewhere: follows the newest copy
    assert keys.prefer([b"a"]) == 0


def test_the_directory_is_bounded_least_recently_routed_first():
    keys = KeyRouting(CollectorRegistry(), limit=3)
    for k in (b"1", b"2", b"3"):
        keys.record([k], rank=0, by_key=False)
    keys.record([b"1"], rank=0, by_key=True)
    keys.record([b"4"], rank=1, by_key=False)
    assert len(keys) == 3 and keys.prefer([b"2"]) is None and keys.prefer([b"1"]) == 0


def test_take_free_respects_readiness_limits_and_waiters():
    router = Router(2, max_inflight=1)
    assert not router.take_free(0)
    router.set_ready(0, True)
    assert router.take_free(0) and not router.take_free(0)  # full
    assert router.pending == [1, 0]


def test_pod_cache_info_sums_the_workers():
    def cache(held: int, entries: int, hits: int) -> CacheFacts:
        return CacheFacts(True, 100, held, entries, 0, 0, 0, hits, 1, 0)

    info = pod_cache_info([cache(30, 2, 5), cache(20, 1, 1)], KeyRouting(CollectorRegistry()))
    assert info["budget_bytes"] == 200 and info["bytes"] == 50 and info["fill"] == 0.25 and info["workers_reporting"] == 2
    assert info["entries"] == 3 and info["hits"] == 6 and info["misses"] == 2
