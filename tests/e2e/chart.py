"""The operator under test: the chart installed by helm, and its Deployment running the operator
image on kind (tests/kind), as the chart's ServiceAccount, with the chart's env, probes and leader
election, as users get it. ``InClusterOperator`` waits for that Deployment, reads its pods' logs
and metrics (through the API server's pod proxy) and stops, kills or restarts its pods for the
tests of leader election, restarts and upgrades.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from testkit.cluster.api import MERGE, path_for, wait_for
from testkit.cluster.objects import crd_established

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "encoderpool-operator"
VALUES = Path(__file__).with_name("data") / "operator-values.yaml"
RELEASE = "e2e"
NAMESPACE = "encoderpool-system"
CRD_NAME = "encoderpools.encoderpool.io"
ENV_PREFIX = "ENCODERPOOL_OPERATOR_"


@dataclass(frozen=True)
class ChartInstall:
    """The installed release and its operator Deployment, as the API server holds it."""

    release: str
    namespace: str
    deployment: dict[str, Any]

    @property
    def deployment_name(self) -> str:
        """Name of the operator Deployment."""
        return str(self.deployment["metadata"]["name"])

    @property
    def service_account(self) -> str:
        """The ServiceAccount the chart runs the operator as."""
        return str(self.deployment["spec"]["template"]["spec"]["serviceAccountName"])

    @property
    def replicas(self) -> int:
        """Replicas of the operator Deployment."""
        return int(self.deployment["spec"].get("replicas", 1))

    def operator_env(self) -> dict[str, str]:
        """The operator settings the chart renders (literal env values of its container), plus
        what the kubelet would add: the downward API's POD_NAMESPACE."""
        container = self.deployment["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value", "") for e in container.get("env") or [] if "valueFrom" not in e}
        for var in container.get("env") or []:
            if (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                env[var["name"]] = self.namespace
        return env

    def env_value(self, name: str) -> str:
        """One literal env value of the operator container ('' when unset)."""
        return self.operator_env().get(name, "")


class Cluster(Protocol):
    """What this module needs of testkit.cluster.Cluster or ExternalCluster."""

    def api(self) -> Any: ...
    def kubectl(self, *args: str, **kwargs: Any) -> Any: ...
    def helm(self, *args: str, **kwargs: Any) -> Any: ...
    def kubeconfig_for_token(self, token: str, name: str) -> Path: ...
    def log_path(self, component: str) -> Path: ...


def install_chart(cluster: Cluster, release: str = RELEASE, namespace: str = NAMESPACE) -> ChartInstall:
    """``helm upgrade --install`` the chart (idempotent on a reused cluster), wait for its CRD."""
    cluster.helm("upgrade", "--install", release, str(CHART), "--namespace", namespace, "--create-namespace",
                 "--values", str(VALUES), "--wait", "--timeout", "5m", timeout=360)
    with cluster.api() as api:
        wait_for(lambda: crd_established(api.get_or_none(
            path_for("apiextensions.k8s.io/v1", "customresourcedefinitions", name=CRD_NAME))), 60,
            f"CRD {CRD_NAME} to be established")
        deployments = api.get(path_for("apps/v1", "deployments", namespace),
                              labelSelector=f"app.kubernetes.io/instance={release}")["items"]
    assert len(deployments) == 1, f"the chart should install one operator Deployment, found {len(deployments)}"
    return ChartInstall(release, namespace, deployments[0])


def service_account_kubeconfig(cluster: Cluster, install: ChartInstall) -> Path:
    """A kubeconfig holding a token of the chart's ServiceAccount (``kubectl create token``)."""
    token = cluster.kubectl("-n", install.namespace, "create", "token", install.service_account,
                            "--duration", "4h").stdout.strip()
    return cluster.kubeconfig_for_token(token, install.service_account)


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class InClusterOperator:
    """The chart's operator Deployment: its pods run the operator image."""

    in_cluster = True

    def __init__(self, cluster: Cluster, install: ChartInstall, kubeconfig: Path) -> None:
        self.install = install
        self.kubeconfig = kubeconfig
        self._cluster = cluster

    def _deployment(self) -> str:
        return f"deployment/{self.install.deployment_name}"

    @property
    def lease_name(self) -> str:
        """The leader Lease (named by the chart's env)."""
        return self.install.env_value(ENV_PREFIX + "LEASE_NAME") or "encoderpool-operator"

    def start(self, timeout: float = 300.0) -> None:
        """Wait until every replica of the Deployment is available and one of them leads."""
        self._cluster.kubectl("-n", self.install.namespace, "rollout", "status", self._deployment(),
                              f"--timeout={int(timeout)}s", timeout=timeout + 30)
        self.leader(timeout)

    def check_alive(self) -> None:
        """Fail with the log tail if the Deployment is not available."""
        done = self._cluster.kubectl("-n", self.install.namespace, "rollout", "status", self._deployment(),
                                     "--timeout=120s", check=False, timeout=150)
        if done.returncode != 0:
            raise AssertionError(f"the operator Deployment is not available: {done.stderr}\n{self.log_tail()}")

    def pods(self, terminating: bool = False) -> list[str]:
        """Names of the Deployment's pods (those being deleted too with ``terminating``)."""
        with self._cluster.api() as api:
            items = api.get(path_for("v1", "pods", self.install.namespace),
                            labelSelector=f"app.kubernetes.io/instance={self.install.release}")["items"]
        return sorted(p["metadata"]["name"] for p in items if terminating or not p["metadata"].get("deletionTimestamp"))

    def holder(self) -> str:
        """holderIdentity of the Lease ('' when free)."""
        with self._cluster.api() as api:
            lease = api.get_or_none(path_for("coordination.k8s.io/v1", "leases", self.install.namespace,
                                             self.lease_name))
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

    def leader(self, timeout: float = 60.0) -> str:
        """The pod holding the Lease (its identity is the pod name, the HOSTNAME, plus a suffix)."""
        def find() -> str | None:
            holder = self.holder()
            return next((p for p in self.pods() if holder.startswith(p + "_")), None)

        found: str = wait_for(find, timeout, f"a leader of Lease {self.lease_name}")
        return found

    def metrics(self, pod: str) -> str:
        """GET /metrics of one operator pod, through the API server's pod proxy."""
        port = self.install.env_value(ENV_PREFIX + "LIVENESS_PORT") or "8080"
        return self._cluster.kubectl("get", "--raw",
                                     f"/api/v1/namespaces/{self.install.namespace}/pods/{pod}:{port}/proxy/metrics").stdout

    def kill(self, *pods: str) -> None:
        """Delete pods with no grace period: the kubelet SIGKILLs them, no cleanup runs in the operator."""
        with self._cluster.api() as api:
            for pod in pods:
                api.delete(path_for("v1", "pods", self.install.namespace, pod), grace_period_seconds=0)

    def stop(self, *pods: str) -> None:
        """Delete pods gracefully: the kubelet sends SIGTERM (a leader releases its Lease)."""
        self._cluster.kubectl("-n", self.install.namespace, "delete", "pod", *pods, "--wait=false")

    def scale(self, replicas: int, wait: bool = True) -> None:
        """Scale the Deployment (0: no operator runs until it is scaled up again; ``wait`` until
        every pod is gone, terminating ones too: a stopping replica may still be reconciling)."""
        with self._cluster.api() as api:
            api.patch(path_for("apps/v1", "deployments", self.install.namespace, self.install.deployment_name) + "/scale",
                      {"spec": {"replicas": replicas}}, MERGE)
        if replicas == 0 and wait:
            wait_for(lambda: not self.pods(terminating=True), 120, "the operator pods to be gone")

    def reload(self, install: ChartInstall) -> None:
        """After a helm upgrade: wait for the Deployment's rollout with what ``install`` renders."""
        self.install = install
        self.start()

    def close(self) -> None:
        """Nothing to stop: the release stays until the cluster goes."""

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of every operator pod's log."""
        out = []
        for pod in self.pods():
            done = self._cluster.kubectl("-n", self.install.namespace, "logs", pod, f"--tail={lines}", check=False)
            out.append(f"--- {pod} ---\n{done.stdout or done.stderr}")
        return "\n".join(out)

    def log(self) -> str:
        """Every operator pod's whole log."""
        return self.log_tail(100_000)


Operator = InClusterOperator
