"""Issue 4, tests 2-5: GPU pools on the fake 8-GPU nodes (kwok marks their pods Running and Ready;
the scheduler counts nvidia.com/gpu for real). examples/encoderpool.yaml is applied as it is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.cluster.objects import condition, pod_ready
from tests.e2e.pools import EXAMPLES, GPU_RESOURCE, Pools, load_example, owner_uids, pool_ready, pool_reason

pytestmark = [pytest.mark.kind, pytest.mark.usefixtures("gpu_nodes")]

EXAMPLE = EXAMPLES / "encoderpool.yaml"
NAME = load_example("encoderpool.yaml")["metadata"]["name"]
READY_SECONDS = 60.0
REVISION = "controller-revision-hash"


def ready_pool(pools: Pools, replicas: int) -> dict[str, Any]:
    """Wait until the pool is Ready with ``replicas`` ready pods."""
    return pools.wait(NAME, lambda p: pool_ready(p) and p["status"]["readyReplicas"] == replicas, READY_SECONDS,
                      f"Ready with {replicas} replicas")


def test_example_pool_gets_owned_children_and_reports_ready(pools: Pools) -> None:
    pools.apply(EXAMPLE)
    spec = load_example("encoderpool.yaml")["spec"]
    gpus = spec["parallelism"]["tensor"] * spec["parallelism"]["data"]
    pool = ready_pool(pools, 2)

    children = pools.children(NAME)
    for kind, objects in children.items():
        assert [o["metadata"]["name"] for o in objects] == [NAME], kind
        assert owner_uids(objects[0]) == [pool["metadata"]["uid"]], f"{kind} is not owned by the pool"
    assert children["Service"][0]["spec"]["clusterIP"] == "None"
    assert children["PodDisruptionBudget"][0]["spec"]["maxUnavailable"] == 1
    pods = pools.pods(NAME)
    assert [p["metadata"]["name"] for p in pods] == [f"{NAME}-0", f"{NAME}-1"]
    for pod in pods:
        assert pod_ready(pod) and pod["spec"]["nodeName"].startswith("kwok-gpu-")
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits[GPU_RESOURCE] == str(gpus) == "4"  # tensor x data = 2 x 2

    status = pool["status"]
    assert (status["replicas"], status["readyReplicas"], status["updatedReplicas"]) == (2, 2, 2)
    assert status["gpusPerPod"] == gpus
    assert status["endpoints"] == [f"http://{NAME}-{i}.{NAME}.{pools.namespace}.svc:30000" for i in range(2)]

    # What a user sees: the printer columns, GPUs in the wide output.
    table = pools.kubectl("get", "encpool", "-o", "wide").stdout.splitlines()
    assert table[0].split() == ["NAME", "MODEL", "TP", "DP", "READY", "REASON", "GPUS", "AGE"]
    assert table[1].split()[:7] == [NAME, spec["model"], "2", "2", "2/2", "Ready", "4"]


def test_kubectl_scale_reaches_the_statefulset_and_status(pools: Pools) -> None:
    pools.apply(EXAMPLE)
    ready_pool(pools, 2)
    pools.kubectl("scale", f"encpool/{NAME}", "--replicas=3")
    pool = ready_pool(pools, 3)
    assert pools.child("StatefulSet", NAME)["spec"]["replicas"] == 3  # type: ignore[index]
    assert [p["metadata"]["name"] for p in pools.pods(NAME) if pod_ready(p)] == [f"{NAME}-{i}" for i in range(3)]
    assert pool["status"]["readyText"] == "3/3" and len(pool["status"]["endpoints"]) == 3
    scale = json.loads(pools.kubectl("get", "encpool", NAME, "--subresource=scale", "-o", "json").stdout)
    assert scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == f"encoderpool.io/pool={NAME}"


def test_spec_change_rolls_pods_and_counts_only_new_revision_pods_as_updated(
        pools: Pools, k8s_cluster: Cluster) -> None:
    pools.apply(EXAMPLE)
    ready_pool(pools, 2)
    old_revision = pools.child("StatefulSet", NAME)["status"]["updateRevision"]  # type: ignore[index]
    nodes = ["kwok-gpu-0", "kwok-gpu-1"]
    # Cordoned nodes hold the rollout at its first step: the StatefulSet replaces pod 1, whose
    # successor (new revision) cannot be scheduled, while pod 0 (old revision) keeps serving.
    k8s_cluster.kubectl("cordon", *nodes)
    try:
        pools.kubectl("patch", "encpool", NAME, "--type=merge", "-p", '{"spec":{"batching":{"maxBatchSize":8}}}')
        # Status follows the watches: wait until it describes the StatefulSet's new update revision.
        def mid_rollout(p: dict[str, Any]) -> bool:
            sts_revision = (pools.child("StatefulSet", NAME) or {}).get("status", {}).get("updateRevision")
            return (p["status"].get("observedGeneration") == p["metadata"]["generation"]
                    and p["status"].get("updateRevision") == sts_revision != old_revision
                    and p["status"]["updatedReplicas"] == 1 and p["status"]["replicas"] == 2
                    and (condition(p, "Progressing") or {}).get("reason") == "RollingUpdate")

        pool = pools.wait(NAME, mid_rollout, READY_SECONDS, "mid-rollout (one pod on the new revision)")
        new_revision = pools.child("StatefulSet", NAME)["status"]["updateRevision"]  # type: ignore[index]
        assert new_revision != old_revision
        by_revision = {p["metadata"]["name"]: (p["metadata"]["labels"][REVISION], pod_ready(p))
                       for p in pools.pods(NAME)}
        assert by_revision == {f"{NAME}-0": (old_revision, True), f"{NAME}-1": (new_revision, False)}
        status = pool["status"]
        # One ready pod exists, but it runs the old spec: updated counts the new revision only.
        assert (status["readyReplicas"], status["updatedReplicas"]) == (1, 1)
        assert not pool_ready(pool)
        progressing = condition(pool, "Progressing")
        assert progressing["status"] == "True" and progressing["reason"] == "RollingUpdate"  # type: ignore[index]
        assert status["endpoints"] == [f"http://{NAME}-0.{NAME}.{pools.namespace}.svc:30000"]

        # A pod lost mid-rollout (force-deleted, as after a node failure) comes back on the new
        # revision, not on the old spec to load the old model and be replaced again. The operator
        # writes rollingUpdate.partition out even at 0 for this: without a rollingUpdate block the
        # StatefulSet controller recreates a pod whose ordinal is below its last-read
        # status.currentReplicas on the old revision, which also made pod 1 above come back on
        # the old revision, Pending, and hold the rollout, when that status was read stale.
        lost = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pools.pods(NAME)}[f"{NAME}-0"]
        pools.kubectl("delete", "pod", f"{NAME}-0", "--grace-period=0", "--force")

        def recreated(p: dict[str, Any]) -> bool:
            pod = {q["metadata"]["name"]: q for q in pools.pods(NAME)}.get(f"{NAME}-0")
            return pod is not None and pod["metadata"]["uid"] != lost and p["status"]["replicas"] == 2

        pools.wait(NAME, recreated, READY_SECONDS, f"{NAME}-0 recreated")
        revisions = {p["metadata"]["name"]: p["metadata"]["labels"][REVISION] for p in pools.pods(NAME)}
        assert revisions == {f"{NAME}-0": new_revision, f"{NAME}-1": new_revision}
        pool = pools.wait(NAME, lambda p: p["status"]["updatedReplicas"] == 2, READY_SECONDS, "2 pods updated")
        assert pool["status"]["readyReplicas"] == 0 and not pool_ready(pool)
    finally:
        k8s_cluster.kubectl("uncordon", *nodes)

    pool = ready_pool(pools, 2)
    assert pool["status"]["updatedReplicas"] == 2
    for pod in pools.pods(NAME):
        assert pod["metadata"]["labels"][REVISION] == new_revision
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["ENCODER_MAX_BATCH_SIZE"] == "8"


def test_pool_asking_more_gpus_than_a_node_has_is_unschedulable_with_the_scheduler_message(
        pools: Pools) -> None:
    manifest = load_example("encoderpool.yaml")
    manifest["metadata"]["name"] = "too-big"
    manifest["spec"].update(replicas=1, maxGPUsPerPod=16, parallelism={"tensor": 4, "data": 4})
    pools.apply(manifest)
    pool = pools.wait("too-big", pool_reason("Unschedulable"), READY_SECONDS, "Unschedulable")

    [pod] = pools.pods("too-big")
    assert pod["status"]["phase"] == "Pending"
    assert pod["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE] == "16"
    scheduler_message = condition(pod, "PodScheduled")["message"]  # type: ignore[index]
    assert f"Insufficient {GPU_RESOURCE}" in scheduler_message
    ready = condition(pool, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Unschedulable"  # type: ignore[index]
    assert scheduler_message in ready["message"]  # type: ignore[index]
    assert pool["status"]["readyText"] == "0/1" and pool["status"]["gpusPerPod"] == 16
    warnings = [e for e in pools.events("too-big") if e["reason"] == "Unschedulable"]
    assert warnings and warnings[0]["type"] == "Warning"
