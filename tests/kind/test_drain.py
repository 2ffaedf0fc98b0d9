"""Drains that lose nothing, with the real kubelet: CPU pools of two data-parallel workers per pod,
their checkpoints on a PersistentVolumeClaim, under continuous /encode load from a pod in the
cluster that resolves the pool's headless Service name for every request (tests/kind/scripts/load.py),
while

1. a model change rolls both pods: the StatefulSet controller deletes each pod; it leaves the
   Service's endpoints (and so its DNS answers), the kubelet runs the preStop sleep, then sends
   SIGTERM to the container's PID 1 (the encoder's front process), which refuses new requests 503
   + Retry-After, finishes what it holds, stops its workers and exits within the grace period; its
   successor loads the new checkpoint; and then
2. the pool is scaled from 2 pods to 1.

Every request must be answered 200, or refused by a draining pod and answered 200 on a retry to
the Service. The numbers are printed.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from testkit.cluster.api import wait_for
from tests.e2e.pools import Pools, load_example, pool_ready
from tests.kind.incluster import LoadPod
from tests.kind.volumes import tiny_checkpoints

pytestmark = pytest.mark.kind

NAME = "drains"
CLAIM = "drain-models"
READY_SECONDS = 600.0
SETTLE_SECONDS = 5.0  # the load keeps running this long after each step


def drain_pool(model: str) -> dict[str, Any]:
    manifest = load_example("encoderpool-cpu.yaml")
    manifest["metadata"]["name"] = NAME
    spec = manifest["spec"]
    spec.update(model=model, replicas=2, parallelism={"tensor": 1, "data": 2}, startupTimeoutSeconds=300,
                modelVolume={"persistentVolumeClaim": {"claimName": CLAIM}})
    # One request per batch of four 512x512 photos: a pod holds queued work for longer than its
    # preStop wait, so SIGTERM always finds requests to finish.
    spec["batching"] = {"maxBatchSize": 1, "maxQueue": 256, "requestTimeoutSeconds": 60}
    spec["drain"] = {"preStopSeconds": 5, "timeoutSeconds": 60}
    spec["resources"] = {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}}
    return manifest


def ready_on_one_revision(replicas: int) -> Any:
    def check(pool: dict[str, Any]) -> bool:
        status = pool.get("status") or {}
        return (pool_ready(pool) and status.get("readyReplicas") == replicas
                and status.get("updatedReadyReplicas") == replicas and len(status.get("revisions") or []) == 1)
    return check


def test_a_rolling_model_change_and_a_scale_down_under_load_lose_no_request(pools: Pools) -> None:
    tiny_checkpoints(pools, CLAIM, "before", "after")
    pools.apply(drain_pool("before"))
    pools.wait(NAME, ready_on_one_revision(2), READY_SECONDS, "Ready with 2 pods")

    phases: list[str] = []
    with LoadPod(pools, f"{NAME}.{pools.namespace}.svc", 30000) as load:
        time.sleep(SETTLE_SECONDS)
        began = time.monotonic()
        old_revision = pools.get(NAME)["status"]["updateRevision"]
        pools.kubectl("patch", "encpool", NAME, "--type=merge", "-p", '{"spec":{"model":"after"}}')
        pool = pools.wait(NAME, lambda p: ready_on_one_revision(2)(p) and p["status"]["updateRevision"] != old_revision,
                          READY_SECONDS, "rolled to the new model, Ready with 2 pods")
        phases.append(f"rolling update (model change) took {time.monotonic() - began:.0f}s")
        time.sleep(SETTLE_SECONDS)
        began = time.monotonic()
        pools.kubectl("scale", f"encpool/{NAME}", "--replicas=1")
        pools.wait(NAME, ready_on_one_revision(1), READY_SECONDS, "scaled down to 1 pod")
        wait_for(lambda: len(pools.pods(NAME)) == 1, 180, "the removed pod to be gone")
        phases.append(f"scale-down 2 -> 1 took {time.monotonic() - began:.0f}s")
        time.sleep(SETTLE_SECONDS)
    tally = load.tally
    [pod] = pools.pods(NAME)
    assert "/models/after" in " ".join(pod["spec"]["containers"][0]["command"]), "the pod runs the new model"
    print("\nlossless drain under in-cluster load (6 closed-loop clients through the Service's DNS name, "
          "4 photos per request, dp=2 pods):\n  " + "\n  ".join(phases) + f"\n  in all: {load.line()}")
    assert pool["status"]["endpoints"], "the pool kept serving"
    assert tally["ok"] > 0 and tally["sent"] > 30, f"the load did not run: {load.line()}"
    assert tally["lost"] == 0, f"{load.line()}\nlost:\n" + "\n".join(tally["lost_details"])
    assert tally["retried_ok"] == tally["refused_draining"]
