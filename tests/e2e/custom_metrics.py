"""TEST-ONLY: a custom metrics API registered with the local control plane, for the HPA tests.

``CustomMetrics`` runs tests/e2e/metrics_adapter.py as a pod on the local node, puts a Service in
front of it and registers the APIService ``v1beta2.custom.metrics.k8s.io``, so that the real HPA
controller of kube-controller-manager reads pod metrics through the real aggregation layer of
kube-apiserver. The values come from the test (``set``), not from pods. On exit the APIService
goes first: a registered but unavailable API group breaks discovery for every other client.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from tests.e2e.cluster import local_node_placement
from tests.e2e.cluster.api import path_for, wait_for
from tests.e2e.cluster.objects import is_true
from tests.e2e.pools import delete_namespace

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "e2e-custom-metrics"
NAME = "test-metrics-adapter"
PORT = 6443
API_SERVICE = "v1beta2.custom.metrics.k8s.io"


def adapter_pod(cluster: Any, token_file: Path, workdir: Path) -> dict[str, Any]:
    """The adapter as a pod of the local node (its IP is then in the Service's EndpointSlice)."""
    command = [sys.executable, "-m", "tests.e2e.metrics_adapter", "--port", str(PORT), "--server", cluster.server,
               "--token-file", str(token_file), "--ca-file", str(cluster.ca_file), "--workdir", str(workdir)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"app": NAME}},
            "spec": {**local_node_placement(), "containers": [{
                "name": "adapter", "image": "test-only", "command": command,
                "env": [{"name": "PYTHONPATH", "value": str(REPO)}],
                "ports": [{"name": "https", "containerPort": PORT}],
                "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
            }]}}


def api_service() -> dict[str, Any]:
    """The registration: the aggregator routes custom.metrics.k8s.io/v1beta2 to the Service."""
    return {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
            "spec": {"group": "custom.metrics.k8s.io", "version": "v1beta2",
                     "service": {"name": NAME, "namespace": NAMESPACE, "port": PORT},
                     "insecureSkipTLSVerify": True,  # test-only: the adapter's certificate is self-signed
                     "groupPriorityMinimum": 100, "versionPriority": 100}}


class CustomMetrics:
    """The adapter pod, its Service and its APIService, for the life of a ``with`` block."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.api = cluster.api()
        self.address = ""

    def __enter__(self) -> CustomMetrics:
        cluster, api = self.cluster, self.api
        workdir = cluster.workdir / "metrics-adapter"
        workdir.mkdir(parents=True, exist_ok=True)
        token_file = workdir / "token"
        token_file.write_text(cluster.token)  # test-only: it lists pods with the admin token
        token_file.chmod(0o600)
        cluster.create_namespace(NAMESPACE)
        api.create(path_for("v1", "pods", NAMESPACE), adapter_pod(cluster, token_file, workdir))
        api.create(path_for("v1", "services", NAMESPACE), {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {"selector": {"app": NAME}, "ports": [{"port": PORT, "targetPort": PORT}]}})
        api.create(path_for("apiregistration.k8s.io/v1", "apiservices"), api_service())
        pod = wait_for(lambda: self._ready_pod(), 60, "the metrics adapter pod to be ready")
        self.address = f"https://{pod['status']['podIP']}:{PORT}"
        wait_for(lambda: is_true(api.get(path_for("apiregistration.k8s.io/v1", "apiservices", name=API_SERVICE)),
                                 "Available"), 60, f"APIService {API_SERVICE} to be Available")
        return self

    def _ready_pod(self) -> dict[str, Any] | None:
        pod = self.api.get(path_for("v1", "pods", NAMESPACE, NAME))
        return pod if is_true(pod, "Ready") else None

    def set(self, **values: float) -> None:
        """What every pod reports from now on, e.g. ``set(encoder_queue_depth=20)``."""
        response = httpx.put(self.address + "/test/values", json=values, verify=False, timeout=10)
        response.raise_for_status()

    def queries(self) -> int:
        """How many metric queries the adapter answered (the HPA controller's reads)."""
        return int(httpx.get(self.address + "/test/values", verify=False, timeout=10).json()["queries"])

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self.api.delete(path_for("apiregistration.k8s.io/v1", "apiservices", name=API_SERVICE))
            delete_namespace(self.api, NAMESPACE)
        finally:
            self.api.close()
