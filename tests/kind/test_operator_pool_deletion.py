"""Issue 4, test 7 (second half): deleting a pool lets the garbage collector remove its StatefulSet,
Service, PodDisruptionBudget and pods, through their ownerReferences (the operator adds no finalizer).

kube-controller-manager's garbage collector learns a new CRD's kind on its periodic 30 s resync, so
right after the chart is installed this takes up to ~40 s; the file is named to run after the
other pool tests, by when the kind is known (the bound below holds either way).
"""

from __future__ import annotations

import pytest

from testkit.cluster.api import wait_for
from tests.e2e.pools import EXAMPLES, Pools, load_example, pool_ready

pytestmark = [pytest.mark.kind, pytest.mark.usefixtures("gpu_nodes")]

NAME = load_example("encoderpool.yaml")["metadata"]["name"]
GC_SECONDS = 90.0


def test_deleting_the_pool_garbage_collects_its_children(pools: Pools) -> None:
    pools.apply(EXAMPLES / "encoderpool.yaml")
    pools.wait(NAME, lambda p: pool_ready(p) and p["status"]["readyReplicas"] == 2, 60, "Ready")
    pools.kubectl("delete", "encpool", NAME)

    def all_gone() -> bool:
        left = {kind: len(objects) for kind, objects in pools.children(NAME).items() if objects}
        return not left and not pools.pods(NAME)

    wait_for(all_gone, GC_SECONDS, "the StatefulSet, Service, PodDisruptionBudget and pods to be collected")
