"""Issue 4, test 9: in a namespace that enforces the ``restricted`` Pod Security Standard, the pool's
pods are admitted (the StatefulSet controller's pod creations pass PodSecurity admission)."""

from __future__ import annotations

import pytest

from testkit.cluster import Cluster
from testkit.cluster.api import ApiError, path_for
from testkit.cluster.objects import pod_ready
from tests.e2e.chart import Operator
from tests.e2e.pools import EXAMPLES, load_example, pool_namespace, pool_ready

pytestmark = [pytest.mark.kind, pytest.mark.usefixtures("gpu_nodes")]

NAME = load_example("encoderpool.yaml")["metadata"]["name"]
RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}


def test_pool_pods_are_admitted_in_a_restricted_namespace(
        k8s_cluster: Cluster, encoderpool_operator: Operator) -> None:
    with pool_namespace(k8s_cluster, encoderpool_operator, RESTRICTED, prefix="e2e-restricted") as pools:
        # The namespace does enforce: a pod that is not hardened is refused.
        bare = {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        with pytest.raises(ApiError) as refused:
            pools.api.create(path_for("v1", "pods", pools.namespace), bare)
        assert refused.value.status_code == 403 and 'violates PodSecurity "restricted' in refused.value.message

        pools.apply(EXAMPLES / "encoderpool.yaml")
        pools.wait(NAME, lambda p: pool_ready(p) and p["status"]["readyReplicas"] == 2, 60, "Ready")
        assert all(pod_ready(p) for p in pools.pods(NAME))
        refusals = [e["message"] for e in pools.api.get(path_for("v1", "events", pools.namespace))["items"]
                    if e["reason"] == "FailedCreate"]
        assert refusals == []
