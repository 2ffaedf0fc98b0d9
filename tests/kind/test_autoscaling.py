"""spec.autoscaling on real pods: the operator owns an autoscaling/v2 HPA on the pool's scale
subresource; kind's own HPA controller (kube-controller-manager, its loop every 2 s here) reads a
Pods metric (encoder_queue_depth) through the aggregation layer from a custom metrics APIService
(tests/kind/scripts/metrics_adapter.py, test-only: the test sets the value every pod reports),
scales the CPU pool up, real pods start and become Ready through their probes, and back down.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster.api import path_for, wait_for
from testkit.cluster.objects import is_true, pod_ready, wait_for_pod
from tests.e2e.pools import Pools, load_example, pool_ready
from tests.kind.incluster import MOUNT, READY_SECONDS as POD_SECONDS, ClientPod, script_pod

pytestmark = pytest.mark.kind

NAME = "autoscaled"
ADAPTER = "test-metrics-adapter"
PORT = 6443
API_SERVICE = "v1beta2.custom.metrics.k8s.io"
SCALE_SECONDS = 600.0


class Metrics:
    """The adapter pod behind its Service, registered as the custom metrics API."""

    def __init__(self, pools: Pools, client: ClientPod) -> None:
        self.pools, self.client = pools, client
        self.url = f"https://{ADAPTER}.{pools.namespace}.svc:{PORT}/test/values"

    def set(self, **values: float) -> None:
        self.client.pools.kubectl("exec", self.client.name, "--", "python", "-c",
                                  f"import httpx; httpx.put('{self.url}', json={json.dumps(values)}, verify=False, "
                                  "timeout=10).raise_for_status()")

    def queries(self) -> int:
        out = self.client.pools.kubectl("exec", self.client.name, "--", "python", "-c",
                                        f"import httpx; print(httpx.get('{self.url}', verify=False, timeout=10).text)")
        return int(json.loads(out.stdout)["queries"])


@pytest.fixture
def metrics(pools: Pools, client: ClientPod, tmp_path: Path) -> Iterator[Metrics]:
    ns = pools.namespace
    # A throwaway certificate made here (the image has no openssl); the APIService skips verification.
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={ADAPTER}",
                    "-keyout", str(tmp_path / "tls.key"), "-out", str(tmp_path / "tls.crt")], check=True,
                   capture_output=True)
    pools.kubectl("create", "secret", "tls", ADAPTER, f"--cert={tmp_path / 'tls.crt'}", f"--key={tmp_path / 'tls.key'}")
    pools.kubectl("create", "serviceaccount", ADAPTER)
    pools.kubectl("create", "role", ADAPTER, "--verb=list", "--resource=pods")
    pools.kubectl("create", "rolebinding", ADAPTER, f"--role={ADAPTER}", f"--serviceaccount={ns}:{ADAPTER}")
    pod = script_pod(ADAPTER, ["python", f"{MOUNT}/metrics_adapter.py", "--port", str(PORT),
                               "--cert-file", "/tls/tls.crt", "--key-file", "/tls/tls.key"], "Always")
    pod["spec"]["serviceAccountName"] = ADAPTER
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "tls", "mountPath": "/tls", "readOnly": True})
    pod["spec"]["volumes"].append({"name": "tls", "secret": {"secretName": ADAPTER}})
    pod["spec"]["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": PORT}, "periodSeconds": 1}
    pools.api.create(path_for("v1", "pods", ns), pod)
    pools.api.create(path_for("v1", "services", ns), {
        "metadata": {"name": ADAPTER}, "spec": {"selector": {"app": ADAPTER}, "ports": [{"port": PORT, "targetPort": PORT}]}})
    api_service = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
                   "spec": {"group": "custom.metrics.k8s.io", "version": "v1beta2",
                            "service": {"name": ADAPTER, "namespace": ns, "port": PORT},
                            "insecureSkipTLSVerify": True, "groupPriorityMinimum": 100, "versionPriority": 100}}
    pools.api.create(path_for("apiregistration.k8s.io/v1", "apiservices"), api_service)
    try:
        wait_for_pod(pools.api, ns, ADAPTER, pod_ready, POD_SECONDS, "Ready")
        wait_for(lambda: is_true(pools.api.get(path_for("apiregistration.k8s.io/v1", "apiservices", name=API_SERVICE)),
                                 "Available"), 120, f"APIService {API_SERVICE} to be Available")
        yield Metrics(pools, client)
    finally:
        # First: a registered but unavailable API group breaks discovery for every other client.
        pools.api.delete(path_for("apiregistration.k8s.io/v1", "apiservices", name=API_SERVICE))


def autoscaled_pool() -> dict[str, Any]:
    manifest = load_example("encoderpool-cpu.yaml")
    manifest["metadata"]["name"] = NAME
    spec = manifest["spec"]
    spec.pop("replicas")  # the HPA owns it
    spec["parallelism"] = {"tensor": 1, "data": 1}
    spec["resources"] = {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}}
    spec["autoscaling"] = {
        "minReplicas": 1, "maxReplicas": 2, "metric": "queueDepth", "targetAverageValue": "5",
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}, "scaleUp": {"stabilizationWindowSeconds": 0}},
    }
    return manifest


def ready_with(replicas: int) -> Any:
    return lambda p: pool_ready(p) and p["status"]["readyReplicas"] == replicas and p["spec"]["replicas"] == replicas


def test_the_hpa_controller_scales_real_pods_up_and_down_from_the_queue_depth(pools: Pools, metrics: Metrics) -> None:
    metrics.set(encoder_queue_depth=0)
    pools.apply(autoscaled_pool())
    pools.wait(NAME, ready_with(1), SCALE_SECONDS, "Ready with 1 replica")
    hpa_path = path_for("autoscaling/v2", "horizontalpodautoscalers", pools.namespace, NAME)
    hpa = pools.api.get(hpa_path)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "encoderpool.io/v1alpha1", "kind": "EncoderPool", "name": NAME}

    # 20 queued per pod against a target of 5: the HPA wants 4 pods, its maximum is 2.
    metrics.set(encoder_queue_depth=20)
    pool = pools.wait(NAME, ready_with(2), SCALE_SECONDS, "scaled up to 2 by the HPA, both pods Ready")
    assert len(pool["status"]["endpoints"]) == 2 and all(pod_ready(p) for p in pools.pods(NAME))
    assert pools.api.get(hpa_path)["status"]["currentMetrics"][0]["pods"]["current"]["averageValue"] == "20"

    metrics.set(encoder_queue_depth=0)
    pools.wait(NAME, ready_with(1), SCALE_SECONDS, "scaled down to 1 by the HPA")
    wait_for(lambda: len(pools.pods(NAME)) == 1, 180, "the removed pod to be gone")
    print(f"\nHPA on real pods: 1 -> 2 -> 1 Ready pods; {metrics.queries()} metric queries answered by the adapter")

    pools.kubectl("patch", "encpool", NAME, "--type=json", "-p", '[{"op": "remove", "path": "/spec/autoscaling"}]')
    pools.wait(NAME, lambda p: pool_ready(p) and pools.api.get_or_none(hpa_path) is None, 60, "its HPA deleted")
