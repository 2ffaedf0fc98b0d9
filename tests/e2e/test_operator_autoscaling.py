"""Issue 11, item 6: spec.autoscaling. The operator owns an autoscaling/v2 HPA on the pool's scale
subresource; the REAL HPA controller of kube-controller-manager reads a Pods metric
(encoder_queue_depth) through the REAL aggregation layer from a custom metrics APIService
(tests/e2e/metrics_adapter.py, test-only: the test sets the value every pod reports), scales
the pool up, and back down. Pods are on the fake GPU nodes (kwok); the HPA loop runs every 2 s
here (kube-controller-manager --horizontal-pod-autoscaler-sync-period), 15 s by default.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.cluster.api import path_for
from tests.e2e.cluster.objects import condition
from tests.e2e.custom_metrics import CustomMetrics
from tests.e2e.pools import Pools, load_example, pool_ready

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("gpu_nodes")]

NAME = "autoscaled"
SCALE_SECONDS = 120.0


@pytest.fixture(scope="module")
def custom_metrics(k8s_cluster: Cluster) -> Iterator[CustomMetrics]:
    """The test-only custom metrics API, registered for this module."""
    node = k8s_cluster.local_node
    if node is None or not node.pod_ips_routable:
        pytest.skip("the aggregation layer routes to the adapter pod's IP, which needs routed pod IPs "
                    "(run as root, as CI does)")
    with CustomMetrics(k8s_cluster) as metrics:
        yield metrics


def autoscaled_pool() -> dict[str, Any]:
    manifest = load_example("encoderpool.yaml")
    manifest["metadata"]["name"] = NAME
    spec = manifest["spec"]
    spec.pop("replicas")  # the HPA owns it
    spec["parallelism"] = {"tensor": 1, "data": 1}
    spec["autoscaling"] = {
        "minReplicas": 1, "maxReplicas": 4, "metric": "queueDepth", "targetAverageValue": "5",
        # No stabilization: each HPA loop acts on what it reads (the default waits 5 minutes to scale down).
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}, "scaleUp": {"stabilizationWindowSeconds": 0}},
    }
    return manifest


def ready_with(pools: Pools, replicas: int) -> Any:
    return lambda p: pool_ready(p) and p["status"]["readyReplicas"] == replicas and p["spec"]["replicas"] == replicas


def wait_scaled(pools: Pools, replicas: int, what: str) -> dict[str, Any]:
    """Wait for the pool at ``replicas``; on a timeout, say what the HPA saw."""
    try:
        return pools.wait(NAME, ready_with(pools, replicas), SCALE_SECONDS, what)
    except AssertionError as err:
        hpa = pools.api.get_or_none(path_for("autoscaling/v2", "horizontalpodautoscalers", pools.namespace, NAME))
        raise AssertionError(f"{err}\nHPA: {json.dumps((hpa or {}).get('status'), indent=1)}\n"
                             f"HPA spec: {json.dumps((hpa or {}).get('spec'))}") from None


def test_the_hpa_controller_scales_the_pool_up_and_down_from_the_queue_depth(
        pools: Pools, custom_metrics: CustomMetrics) -> None:
    custom_metrics.set(encoder_queue_depth=0)
    pools.apply(autoscaled_pool())
    pools.wait(NAME, ready_with(pools, 1), 60, "Ready with 1 replica")
    hpa = pools.api.get(path_for("autoscaling/v2", "horizontalpodautoscalers", pools.namespace, NAME))
    owner = hpa["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("EncoderPool", NAME, True)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "encoderpool.io/v1alpha1", "kind": "EncoderPool", "name": NAME}
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "encoder_queue_depth"

    # 20 queued per pod against a target of 5: the HPA wants ceil(1 x 20 / 5) = 4 pods (its max).
    began = time.monotonic()
    custom_metrics.set(encoder_queue_depth=20)
    pool = wait_scaled(pools, 4, "scaled up to 4 by the HPA")
    up = time.monotonic() - began
    assert len(pool["status"]["endpoints"]) == 4
    assert pools.child("StatefulSet", NAME)["spec"]["replicas"] == 4  # type: ignore[index]
    hpa = pools.api.get(path_for("autoscaling/v2", "horizontalpodautoscalers", pools.namespace, NAME))
    current = hpa["status"]["currentMetrics"][0]["pods"]["current"]["averageValue"]
    assert current == "20", hpa["status"]

    # The queue drains: the HPA goes back to its minimum.
    began = time.monotonic()
    custom_metrics.set(encoder_queue_depth=0)
    wait_scaled(pools, 1, "scaled down to 1 by the HPA")
    down = time.monotonic() - began
    active = condition(pools.api.get(path_for("autoscaling/v2", "horizontalpodautoscalers", pools.namespace, NAME)),
                       "ScalingActive")
    assert active is not None and active["status"] == "True", active
    print(f"\nHPA (sync period 2 s): 1 -> 4 pods in {up:.1f}s after the queue depth rose to 20 (target 5); "
          f"4 -> 1 in {down:.1f}s after it fell to 0; {custom_metrics.queries()} metric queries answered")


def test_turning_autoscaling_off_removes_the_hpa(pools: Pools, custom_metrics: CustomMetrics) -> None:
    custom_metrics.set(encoder_queue_depth=0)
    pools.apply(autoscaled_pool())
    hpa_path = path_for("autoscaling/v2", "horizontalpodautoscalers", pools.namespace, NAME)
    pools.wait(NAME, pool_ready, 60, "Ready")
    assert pools.api.get_or_none(hpa_path) is not None
    pools.kubectl("patch", "encpool", NAME, "--type=json", "-p", '[{"op": "remove", "path": "/spec/autoscaling"}]')
    pools.wait(NAME, lambda p: pool_ready(p) and pools.api.get_or_none(hpa_path) is None, 30, "its HPA deleted")
