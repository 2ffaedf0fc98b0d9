"""Leader election on a Lease: one holder, takeover after the lease duration, release on the way out.

The Lease store here is a stand-in for the API server (allowed: this tier has no control plane)
that keeps what the elector relies on: resourceVersion preconditions on PUT and conflicts on a
second create. tests/e2e kills a real leader and times the takeover on a real kube-apiserver.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest

from encoderpool_operator import errors
from encoderpool_operator.leader import LeaderElector
from encoderpool_operator.metrics import OperatorMetrics
from encoderpool_operator.settings import OperatorSettings

pytestmark = pytest.mark.unit


class LeaseStore:
    """One namespace's Leases with optimistic concurrency."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.version = 0

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.leases.get(name)
        return copy.deepcopy(found) if found else None

    def create(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if name in self.leases:
            raise errors.ConflictError("already exists", status=409)
        return self._store(body)

    def replace(self, kind: str, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if body["metadata"].get("resourceVersion") != self.leases[name]["metadata"]["resourceVersion"]:
            raise errors.ConflictError("the object has been modified", status=409)
        return self._store(body)

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.leases[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def holder(self) -> str | None:
        return self.leases["op"]["spec"]["holderIdentity"] if "op" in self.leases else None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SETTINGS = OperatorSettings.model_validate({"lease_name": "op", "lease_duration_seconds": 15,
                                            "renew_deadline_seconds": 10, "retry_period_seconds": 2})


def elector(store: LeaseStore, name: str, clock: Clock, metrics: OperatorMetrics | None = None) -> LeaderElector:
    return LeaderElector(store, SETTINGS, name, "ops", metrics, clock)


def test_one_holder_and_a_takeover_only_after_the_lease_duration() -> None:
    store, clock = LeaseStore(), Clock()
    metrics = OperatorMetrics()
    a, b = elector(store, "a", clock), elector(store, "b", clock, metrics)
    assert a.try_acquire_or_renew() and store.holder() == "a"
    assert not b.try_acquire_or_renew(), "a standby never takes a lease that is being renewed"
    clock.now += 14
    assert not b.try_acquire_or_renew(), "14 s of an unchanged record: not yet"
    clock.now += 2  # 16 s of an unchanged record since b first saw it
    assert b.try_acquire_or_renew() and store.holder() == "b"
    spec = store.leases["op"]["spec"]
    assert spec["leaseTransitions"] == 1 and spec["leaseDurationSeconds"] == 15
    assert metrics.registry.get_sample_value("encoderpool_operator_leader") == 1


def test_a_renewing_leader_is_never_replaced() -> None:
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    a.try_acquire_or_renew()
    for _ in range(20):
        clock.now += 2
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()


def test_a_leader_that_cannot_renew_gives_up_before_anyone_may_take_over() -> None:
    store, clock = LeaseStore(), Clock()

    def pause(seconds: float) -> bool:  # each pause is one retry period on the fake clock
        clock.now += seconds
        return False

    a = LeaderElector(store, SETTINGS, "a", "ops", None, clock, pause)
    a.try_acquire_or_renew()

    def refuse(*_: Any) -> Any:
        raise errors.UnavailableError("api server down")

    store.get = refuse  # type: ignore[method-assign]
    lost = threading.Event()
    a.renew_forever(threading.Event(), lost.set)
    assert lost.is_set() and not a.leading
    assert clock.now - 1000.0 <= SETTINGS.renew_deadline_seconds + SETTINGS.retry_period_seconds
    assert clock.now - 1000.0 < SETTINGS.lease_duration_seconds, "it stops before a standby may take over"


def test_a_released_lease_is_taken_at_once() -> None:
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert store.holder() == ""
    assert b.try_acquire_or_renew() and store.holder() == "b"


def test_two_standbys_racing_for_a_free_lease_cannot_both_win() -> None:
    store, clock = LeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    a.try_acquire_or_renew()
    a.release()
    stale = store.get("Lease", "ops", "op")
    assert b.try_acquire_or_renew()
    # a PUT based on the record read before b won is refused by its resourceVersion.
    with pytest.raises(errors.ConflictError):
        store.replace("Lease", "ops", "op", stale)  # type: ignore[arg-type]
    assert not elector(store, "c", clock).try_acquire_or_renew()


def test_settings_refuse_a_renew_deadline_beyond_the_lease() -> None:
    with pytest.raises(ValueError, match="renew_deadline_seconds < lease_duration_seconds"):
        OperatorSettings.model_validate({"lease_duration_seconds": 10, "renew_deadline_seconds": 12})


def test_release_stops_the_renewals_first() -> None:
    """A renewal racing the release must not take the Lease back for a process on its way out."""
    store, clock = LeaseStore(), Clock()
    a = elector(store, "a", clock)
    a.try_acquire_or_renew()
    stop = threading.Event()
    thread = a.start_renewing(stop, lambda: None)
    a.release()
    assert not thread.is_alive(), "release() waits for the renewing thread to end"
    assert store.holder() == ""
    time.sleep(SETTINGS.retry_period_seconds + 0.5)
    assert store.holder() == "", "no renewal after the release"
