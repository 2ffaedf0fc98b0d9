"""Issue 4, test 8: the operator is SIGKILLed in the middle of creating a pool's children and started
again: it converges (also on a change made while it was down), and nothing exists twice.

On kind the operator is the chart's Deployment: it is scaled to 0 and its pods deleted with no
grace period (the kubelet SIGKILLs them), so no replica runs while the pool changes; scaling it
back up is the restart. kwok's nodes are cordoned meanwhile, so that the pool cannot become Ready
before the kill lands (kwok makes pods Ready within a second)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.chart import InClusterOperator
from tests.e2e.pools import EXAMPLES, Pools, load_example, owner_uids, pool_ready

NODES = ("kwok-gpu-0", "kwok-gpu-1")

pytestmark = [pytest.mark.kind, pytest.mark.usefixtures("gpu_nodes")]

NAME = load_example("encoderpool.yaml")["metadata"]["name"]


@pytest.fixture
def killable_operator(encoderpool_operator: InClusterOperator) -> Iterator[InClusterOperator]:
    """The session's operator; its Deployment at the chart's replicas and available after the test."""
    try:
        yield encoderpool_operator
    finally:
        encoderpool_operator.scale(encoderpool_operator.install.replicas)
        encoderpool_operator.start()


def test_operator_killed_mid_reconcile_converges_after_restart_without_duplicates(
        pools: Pools, killable_operator: InClusterOperator, k8s_cluster: Any) -> None:
    k8s_cluster.kubectl("cordon", *NODES)
    try:
        sts_at_kill = killed_and_changed(pools, killable_operator)
    finally:
        k8s_cluster.kubectl("uncordon", *NODES)
    pool = pools.wait(NAME, lambda p: pool_ready(p) and p["status"]["readyReplicas"] == 3, 60,
                      "Ready with 3 replicas after the restart")
    assert_converged(pools, pool, sts_at_kill)


def killed_and_changed(pools: Pools, killable_operator: InClusterOperator) -> dict[str, Any] | None:
    """The pool applied, every operator replica SIGKILLed once its StatefulSet exists, the pool
    scaled to 3 while none runs, the operator started again; the StatefulSet as it was at the kill."""
    pools.apply(EXAMPLES / "encoderpool.yaml")
    # The StatefulSet is the first child the operator applies: kill every replica (leader and
    # standby) as soon as it exists, so nobody runs while the pool changes.
    deadline = time.monotonic() + 30
    while pools.child("StatefulSet", NAME) is None:
        assert time.monotonic() < deadline, pools.diagnose(NAME)
        time.sleep(0.01)
    running = killable_operator.pods()
    killable_operator.scale(0, wait=False)  # no replacement pods ...
    killable_operator.kill(*running)        # ... and the running ones SIGKILLed
    killable_operator.scale(0)
    at_kill = pools.get(NAME)
    sts_at_kill = pools.child("StatefulSet", NAME)
    assert not pool_ready(at_kill), "the pool was already Ready: the kill came too late to test anything"

    # A change the operator cannot see while it is down.
    pools.kubectl("scale", f"encpool/{NAME}", "--replicas=3")
    killable_operator.scale(killable_operator.install.replicas)
    killable_operator.start()
    return sts_at_kill


def assert_converged(pools: Pools, pool: dict[str, Any], sts_at_kill: dict[str, Any] | None) -> None:
    """Exactly one of each child, owned by the pool, the StatefulSet adopted, three pods."""
    children = pools.children(NAME)
    for kind, objects in children.items():
        assert [o["metadata"]["name"] for o in objects] == [NAME], f"{kind}: {len(objects)} objects"
        assert owner_uids(objects[0]) == [pool["metadata"]["uid"]], kind
    if sts_at_kill is not None:  # the restarted operator adopted it rather than replacing it
        assert children["StatefulSet"][0]["metadata"]["uid"] == sts_at_kill["metadata"]["uid"]
    assert children["StatefulSet"][0]["spec"]["replicas"] == 3
    assert [p["metadata"]["name"] for p in pools.pods(NAME)] == [f"{NAME}-{i}" for i in range(3)]
