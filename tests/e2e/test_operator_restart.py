"""Issue 4, test 8: the operator is SIGKILLed in the middle of creating a pool's children and started
again: it converges (also on a change made while it was down), and nothing exists twice."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.e2e.operator_harness import LocalOperators, Operator
from tests.e2e.pools import EXAMPLES, Pools, load_example, owner_uids, pool_ready

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("gpu_nodes")]

NAME = load_example("encoderpool.yaml")["metadata"]["name"]


@pytest.fixture
def killable_operator(encoderpool_operator: Operator) -> Iterator[LocalOperators]:
    """The session's operator replicas, if they are local processes; running again after the test."""
    if not isinstance(encoderpool_operator, LocalOperators):
        pytest.skip("kills the operator process; on an external cluster the operator is the chart's Deployment")
    try:
        yield encoderpool_operator
    finally:
        encoderpool_operator.start()  # the replicas not running


def test_operator_killed_mid_reconcile_converges_after_restart_without_duplicates(
        pools: Pools, killable_operator: LocalOperators) -> None:
    pools.apply(EXAMPLES / "encoderpool.yaml")
    # The StatefulSet is the first child the operator applies: kill every replica (leader and
    # standby) as soon as it exists, so nobody runs while the pool changes.
    deadline = time.monotonic() + 30
    while pools.child("StatefulSet", NAME) is None:
        assert time.monotonic() < deadline, pools.diagnose(NAME)
        time.sleep(0.01)
    killable_operator.kill()
    at_kill = pools.get(NAME)
    sts_at_kill = pools.child("StatefulSet", NAME)
    assert not pool_ready(at_kill), "the pool was already Ready: the kill came too late to test anything"

    # A change the operator cannot see while it is down.
    pools.kubectl("scale", f"encpool/{NAME}", "--replicas=3")
    killable_operator.start()
    pool = pools.wait(NAME, lambda p: pool_ready(p) and p["status"]["readyReplicas"] == 3, 60,
                      "Ready with 3 replicas after the restart")

    children = pools.children(NAME)
    for kind, objects in children.items():
        assert [o["metadata"]["name"] for o in objects] == [NAME], f"{kind}: {len(objects)} objects"
        assert owner_uids(objects[0]) == [pool["metadata"]["uid"]], kind
    if sts_at_kill is not None:  # the restarted operator adopted it rather than replacing it
        assert children["StatefulSet"][0]["metadata"]["uid"] == sts_at_kill["metadata"]["uid"]
    assert children["StatefulSet"][0]["spec"]["replicas"] == 3
    assert [p["metadata"]["name"] for p in pools.pods(NAME)] == [f"{NAME}-{i}" for i in range(3)]
