"""Issue 11, item 3: rollouts people control, on kwok's fake GPU nodes joined to kind (kwok marks
pods Ready at once; cordoned nodes hold a rollout at a step, because replaced pods cannot be
scheduled). kind runs Kubernetes' default feature gates, as users' clusters do:

- spec.rollout.maxUnavailable: StatefulSet maxUnavailable needs the MaxUnavailableStatefulSet
  gate, beta and off by default in 1.35: the API server drops the field, the operator says so
  (status.ignoredFields, SpecApplied) and the StatefulSet replaces one pod at a time;
- spec.rollout.partition: a canary, only the highest ordinals move; the pool says Canary, serves
  from both revisions and lists each one's endpoints; lowering the partition finishes the
  rollout without restarting the canary;
- spec.rollout.progressDeadlineSeconds: a rollout that stalls is reported (Progressing=False,
  ProgressDeadlineExceeded) while the pod's own problem stays the headline;
- a spec the API server refuses (a port change with a bad spec.podTemplate) is ApplyFailed with
  the API server's message, the Service keeps the port the pods have, status keeps listing the
  pods that serve, and fixing the spec rolls it out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.cluster.objects import condition, pod_ready
from tests.e2e.pools import Pools, load_example, pool_ready, pool_reason

pytestmark = [pytest.mark.kind, pytest.mark.usefixtures("gpu_nodes")]

NODES = ("kwok-gpu-0", "kwok-gpu-1")
REVISION = "controller-revision-hash"
READY_SECONDS = 60.0


def gpu_pool(name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    manifest = load_example("encoderpool.yaml")
    manifest["metadata"]["name"] = name
    manifest["spec"].update(replicas=replicas, parallelism={"tensor": 1, "data": 1}, **spec)
    return manifest


@pytest.fixture
def cordon(k8s_cluster: Cluster) -> Iterator[Any]:
    """``cordon()`` holds the rollout (replaced pods stay Pending); nodes are uncordoned after the test."""
    state = {"cordoned": False}

    def do(on: bool = True) -> None:
        k8s_cluster.kubectl("cordon" if on else "uncordon", *NODES)
        state["cordoned"] = on

    try:
        yield do
    finally:
        if state["cordoned"]:
            do(False)


def caught_up(pools: Pools, pool: dict[str, Any]) -> bool:
    """The pool's status describes its generation and the StatefulSet's current update revision
    (status follows the watches: for a moment after a change it can describe the step before)."""
    sts = pools.child("StatefulSet", pool["metadata"]["name"]) or {}
    status = pool.get("status") or {}
    return (status.get("observedGeneration") == pool["metadata"]["generation"]
            and status.get("updateRevision") == (sts.get("status") or {}).get("updateRevision"))


def revisions(pools: Pools, name: str) -> dict[str, tuple[str, bool]]:
    return {p["metadata"]["name"]: (p["metadata"]["labels"][REVISION], pod_ready(p)) for p in pools.pods(name)}


def ready_replicas(pools: Pools, name: str, count: int) -> dict[str, Any]:
    return pools.wait(name, lambda p: pool_ready(p) and p["status"]["readyReplicas"] == count, READY_SECONDS,
                      f"Ready with {count} replicas")


def test_max_unavailable_without_the_feature_gate_is_reported_and_pods_roll_one_at_a_time(
        pools: Pools, cordon: Any) -> None:
    pools.apply(gpu_pool("wide", 4, rollout={"maxUnavailable": 2}))
    pool = ready_replicas(pools, "wide", 4)
    pool = pools.wait("wide", lambda p: "spec.rollout.maxUnavailable" in (p["status"].get("ignoredFields") or []),
                      READY_SECONDS, "reporting spec.rollout.maxUnavailable as not in effect")
    applied = condition(pool, "SpecApplied")
    assert applied is not None and "MaxUnavailableStatefulSet" in applied["message"], applied
    sts = pools.child("StatefulSet", "wide")
    assert sts is not None and "maxUnavailable" not in sts["spec"]["updateStrategy"].get("rollingUpdate", {})
    old = sts["status"]["updateRevision"]
    cordon()
    pools.kubectl("patch", "encpool", "wide", "--type=merge", "-p", '{"spec":{"batching":{"maxBatchSize":4}}}')
    pool = pools.wait("wide", lambda p: caught_up(pools, p) and p["status"].get("updatedReplicas") == 1
                      and p["status"].get("replicas") == 4, READY_SECONDS, "with one pod replaced")
    new = pool["status"]["updateRevision"]
    time.sleep(5)  # a resync: with the gate off, a second pod must not go while the first is unready
    assert revisions(pools, "wide") == {"wide-0": (old, True), "wide-1": (old, True),
                                        "wide-2": (old, True), "wide-3": (new, False)}
    cordon(False)
    ready_replicas(pools, "wide", 4)
    assert {rev for rev, _ in revisions(pools, "wide").values()} == {new}


def test_a_partition_is_a_canary_that_serves_both_revisions_until_released(pools: Pools) -> None:
    pools.apply(gpu_pool("canary", 3, rollout={"partition": 2}))
    ready_replicas(pools, "canary", 3)
    old = pools.child("StatefulSet", "canary")["status"]["updateRevision"]  # type: ignore[index]
    pools.kubectl("patch", "encpool", "canary", "--type=merge", "-p", '{"spec":{"batching":{"maxBatchSize":4}}}')
    pool = pools.wait("canary", pool_reason("Canary"), READY_SECONDS, "a Canary")
    status = pool["status"]
    new = status["updateRevision"]
    assert revisions(pools, "canary") == {"canary-0": (old, True), "canary-1": (old, True), "canary-2": (new, True)}
    ready = condition(pool, "Ready")
    assert ready is not None and ready["status"] == "True" and ready["reason"] == "Canary"
    assert "held on the previous revision by spec.rollout.partition=2" in status["message"]
    url = f"http://canary-{{}}.canary.{pools.namespace}.svc:30000"
    assert status["endpoints"] == [url.format(i) for i in range(3)], "a canary serves from both on purpose"
    assert [(r["name"], r["updated"], r["endpoints"]) for r in status["revisions"]] == [
        (new, True, [url.format(2)]), (old, False, [url.format(0), url.format(1)])]
    # kubectl's columns come from the same status; a reconcile in between may briefly show the quiet
    # WaitingForStatefulSet (the controller observing the operator's last apply) before Canary again.
    deadline = time.monotonic() + 60
    while (columns := pools.kubectl("get", "encpool", "canary").stdout.splitlines()[1].split()[4:6]) != ["3/3", "Canary"]:
        assert time.monotonic() < deadline and columns[1] == "WaitingForStatefulSet", columns
        time.sleep(1)

    canary_uid = pools.pods("canary")[2]["metadata"]["uid"]
    pools.kubectl("patch", "encpool", "canary", "--type=merge", "-p", '{"spec":{"rollout":{"partition":0}}}')
    pool = ready_replicas(pools, "canary", 3)
    assert pool["status"]["updateRevision"] == new, "releasing the canary is no new revision"
    assert {rev for rev, _ in revisions(pools, "canary").values()} == {new}
    assert pools.pods("canary")[2]["metadata"]["uid"] == canary_uid, "the canary pod was not restarted"


def test_a_stalled_rollout_passes_its_progress_deadline(pools: Pools, cordon: Any) -> None:
    pools.apply(gpu_pool("stalls", 2, rollout={"progressDeadlineSeconds": 30}))
    ready_replicas(pools, "stalls", 2)
    cordon()
    began = time.monotonic()
    pools.kubectl("patch", "encpool", "stalls", "--type=merge", "-p", '{"spec":{"batching":{"maxBatchSize":4}}}')

    def stalled(pool: dict[str, Any]) -> bool:
        progressing = condition(pool, "Progressing") or {}
        return progressing.get("reason") == "ProgressDeadlineExceeded" and progressing.get("status") == "False"

    pool = pools.wait("stalls", stalled, 90, "ProgressDeadlineExceeded")
    took = time.monotonic() - began
    # lastProgressTime has whole seconds, so the deadline can pass up to 1 s early.
    assert took >= 29, f"reported after {took:.0f}s, before its 30 s deadline"
    assert pool["status"]["reason"] == "Unschedulable", "the pod's own problem is the headline"
    assert "no progress for over 30s" in condition(pool, "Progressing")["message"]  # type: ignore[index]
    print(f"\nrollout stalled (nodes cordoned): ProgressDeadlineExceeded {took:.1f}s after the spec change "
          "(deadline 30 s, resync 5 s)")
    cordon(False)
    pool = ready_replicas(pools, "stalls", 2)
    assert (condition(pool, "Progressing") or {}).get("reason") == "Complete"


def test_a_refused_spec_is_apply_failed_and_changes_nothing(pools: Pools) -> None:
    pools.apply(gpu_pool("refused", 2))
    ready_replicas(pools, "refused", 2)
    sts_before = pools.child("StatefulSet", "refused")
    # A new port and a sidecar without an image: the API server refuses the StatefulSet (dry run).
    bad = {"spec": {"port": 31000, "podTemplate": {"spec": {"containers": [{"name": "sidecar"}]}}}}
    pools.kubectl("patch", "encpool", "refused", "--type=merge", "-p", json.dumps(bad))
    pool = pools.wait("refused", pool_reason("ApplyFailed"), READY_SECONDS, "ApplyFailed")
    status = pool["status"]
    assert "spec.template.spec.containers[1].image: Required value" in status["message"], status["message"]
    # Status still tells the truth about what runs, and nothing moved.
    assert status["readyReplicas"] == 2 and len(status["endpoints"]) == 2
    assert all(e.endswith(":30000") for e in status["endpoints"])
    sts_after = pools.child("StatefulSet", "refused")
    assert sts_after["metadata"]["generation"] == sts_before["metadata"]["generation"]  # type: ignore[index]
    assert pools.child("Service", "refused")["spec"]["ports"][0]["port"] == 30000, \
        "the Service must not advertise a port the pods do not have"  # type: ignore[index]
    assert any(e["reason"] == "ApplyFailed" and e["type"] == "Warning" for e in pools.events("refused"))

    pools.kubectl("patch", "encpool", "refused", "--type=json", "-p", '[{"op": "remove", "path": "/spec/podTemplate"}]')
    pool = ready_replicas(pools, "refused", 2)
    assert pools.child("Service", "refused")["spec"]["ports"][0]["port"] == 31000  # type: ignore[index]
    assert all(e.endswith(":31000") for e in pool["status"]["endpoints"])
