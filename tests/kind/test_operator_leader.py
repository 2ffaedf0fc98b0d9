"""Issue 11, item 7: the operator itself is highly available, as the chart's Deployment runs it on
kind. Two replicas (the chart's default) compete for a Lease; only the holder works. Killing the
leader's pod (no grace period: the kubelet SIGKILLs it) hands over to the standby within the lease
duration, and the new leader reconciles a change made after the kill; a leader pod deleted
gracefully (SIGTERM, as a rolling update does) releases the Lease at once. Each replica serves
/metrics (leader, reconciles, errors, duration, pools by reason), read through the API server's pod
proxy. The Deployment replaces each deleted pod; the next test finds two replicas again."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from tests.e2e.chart import ENV_PREFIX, InClusterOperator
from tests.e2e.pools import Pools, load_example, pool_ready

pytestmark = [pytest.mark.kind, pytest.mark.usefixtures("gpu_nodes")]


@pytest.fixture
def replicas(encoderpool_operator: InClusterOperator) -> Iterator[InClusterOperator]:
    """The session's operator with both replicas up; both up (and one leading) again after the test."""
    assert len(encoderpool_operator.pods()) == 2, "the chart runs two replicas by default"
    try:
        yield encoderpool_operator
    finally:
        encoderpool_operator.start()


def lease_seconds(replicas: InClusterOperator, name: str) -> float:
    return float(replicas.install.env_value(ENV_PREFIX + name))


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text exposition (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = rf"^{re.escape(name)}(\{{{re.escape(wanted)}\}})? (\S+)$" if wanted else rf"^{re.escape(name)} (\S+)$"
    for line in text.splitlines():
        found = re.match(pattern, line)
        if found:
            return float(found.group(found.lastindex or 1))
    return 0.0


def small_pool(name: str) -> dict:
    manifest = load_example("encoderpool.yaml")
    manifest["metadata"]["name"] = name
    manifest["spec"].update(replicas=1, parallelism={"tensor": 1, "data": 1})
    return manifest


def standby_of(replicas: InClusterOperator, leader: str) -> str:
    [standby] = [p for p in replicas.pods() if p != leader]
    return standby


def test_killing_the_leader_hands_over_to_the_standby_within_the_lease(pools: Pools, replicas: InClusterOperator) -> None:
    pools.apply(small_pool("handover"))
    pools.wait("handover", pool_ready, 60, "Ready")
    leader = replicas.leader()
    standby = standby_of(replicas, leader)
    assert metric(replicas.metrics(standby), "encoderpool_operator_leader") == 0
    assert metric(replicas.metrics(standby), "encoderpool_operator_reconciles_total", result="ok") == 0, \
        "a standby does nothing"

    killed_at = time.monotonic()
    replicas.kill(leader)
    new_leader = replicas.leader(timeout=60)
    took_over = time.monotonic() - killed_at
    assert new_leader == standby
    duration, retry = lease_seconds(replicas, "LEASE_DURATION_SECONDS"), lease_seconds(replicas, "RETRY_PERIOD_SECONDS")
    # The standby waits out the lease duration from when it last saw the record change, then
    # retries every retry period; the rest is slack for a loaded machine.
    assert took_over <= duration + retry + 10, f"took over after {took_over:.1f}s (lease {duration:g}s)"

    changed_at = time.monotonic()
    pools.kubectl("scale", "encpool/handover", "--replicas=2")
    pools.wait("handover", lambda p: pool_ready(p) and p["status"]["readyReplicas"] == 2, 60,
               "Ready with 2 replicas, reconciled by the new leader")
    reconciled = time.monotonic() - changed_at
    text = replicas.metrics(new_leader)
    assert metric(text, "encoderpool_operator_leader") == 1
    assert metric(text, "encoderpool_operator_reconciles_total", result="ok") > 0
    assert metric(text, "encoderpool_operator_pools", reason="Ready") >= 1
    assert metric(text, "encoderpool_operator_reconcile_duration_seconds_count") > 0
    print(f"\nleader pod SIGKILLed: standby took over in {took_over:.1f}s (lease {duration:g}s, retry {retry:g}s); "
          f"a scale made after the kill was Ready in {reconciled:.1f}s")


def test_a_stopped_leader_releases_the_lease_at_once(pools: Pools, replicas: InClusterOperator) -> None:
    replicas.start()  # two replicas again (the Deployment replaced the killed pod)
    leader = replicas.leader()
    standby = standby_of(replicas, leader)
    stopped_at = time.monotonic()
    replicas.stop(leader)  # SIGTERM from the kubelet, as a rolling update of the Deployment does
    assert replicas.leader(timeout=30) == standby
    took_over = time.monotonic() - stopped_at
    duration = lease_seconds(replicas, "LEASE_DURATION_SECONDS")
    assert took_over < duration, f"a released lease is taken at the next retry, not after {duration:g}s"
    pools.apply(small_pool("after-release"))
    pools.wait("after-release", pool_ready, 60, "Ready, reconciled by the new leader")
    print(f"\nleader pod stopped (SIGTERM): the lease was released and taken over in {took_over:.1f}s")
