"""Issue 4, test 7 (first half): drift is undone: a deleted StatefulSet comes back, a hand-edited
Service is set back. The second half, deletion, is test_operator_pool_deletion.py."""

from __future__ import annotations

import json

import pytest

from testkit.cluster.api import wait_for
from tests.e2e.pools import EXAMPLES, Pools, load_example, pool_ready

pytestmark = [pytest.mark.kind, pytest.mark.usefixtures("gpu_nodes")]

NAME = load_example("encoderpool.yaml")["metadata"]["name"]


def ready_with_two(pool: dict) -> bool:
    return pool_ready(pool) and pool["status"]["readyReplicas"] == 2


def test_deleted_statefulset_and_edited_service_are_restored(pools: Pools) -> None:
    pools.apply(EXAMPLES / "encoderpool.yaml")
    pools.wait(NAME, ready_with_two, 60, "Ready")
    old_uid = pools.child("StatefulSet", NAME)["metadata"]["uid"]  # type: ignore[index]

    pools.kubectl("delete", "statefulset", NAME, "--wait=true")
    sts = wait_for(lambda: (s := pools.child("StatefulSet", NAME)) and s["metadata"]["uid"] != old_uid and s,
                   60, "the StatefulSet to be re-created")
    assert sts["spec"]["replicas"] == 2
    pools.wait(NAME, ready_with_two, 60, "Ready again with a new StatefulSet")

    # A hand edit of fields the operator owns: another port, and not-ready pods published.
    patch = [{"op": "replace", "path": "/spec/ports/0/port", "value": 31000},
             {"op": "replace", "path": "/spec/publishNotReadyAddresses", "value": True}]
    pools.kubectl("patch", "service", NAME, "--type=json", "-p", json.dumps(patch))

    def restored() -> bool:
        service = pools.child("Service", NAME)  # None for a moment: the operator re-creates it
        spec = (service or {}).get("spec") or {}
        return [p["port"] for p in spec.get("ports", [])] == [30000] and not spec.get("publishNotReadyAddresses")

    wait_for(restored, 30, "the Service's port and publishNotReadyAddresses to be set back")
    children = pools.children(NAME)
    assert [len(children[k]) for k in ("StatefulSet", "Service", "PodDisruptionBudget")] == [1, 1, 1]
