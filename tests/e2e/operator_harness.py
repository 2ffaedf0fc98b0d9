"""The operator under test: the chart installed by helm, and the operator process itself.

On the local control plane the chart's Deployment is scheduled onto a kwok node, where it is
"Running" without running anything (kwok fakes pods). The real operator runs here instead, as a
host process: this venv's ``encoderpool-operator`` with exactly the env the installed Deployment
renders from the chart's values, and a token of the chart's ServiceAccount, never the admin's,
so a missing RBAC rule fails the tests as it would fail a user's cluster.

On an external cluster (kind, ``make kind-e2e``) the chart's Deployment runs the operator image for
real, as the same ServiceAccount; the tests only wait for it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from tests.e2e.cluster.api import path_for, wait_for
from tests.e2e.cluster.procs import ManagedProcess, Reaper

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "encoderpool-operator"
VALUES = Path(__file__).with_name("data") / "operator-values.yaml"
RELEASE = "e2e"
NAMESPACE = "encoderpool-system"
CRD_NAME = "encoderpools.encoderpool.io"
OPERATOR_BIN = Path(sys.executable).parent / "encoderpool-operator"
ENV_PREFIX = "ENCODERPOOL_OPERATOR_"
# In a pod (CI runners often are), these make the client library prefer the in-cluster identity
# over KUBECONFIG: the operator under test must talk to the test cluster, as the chart's account.
IN_CLUSTER_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


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

    def operator_env(self) -> dict[str, str]:
        """The operator settings the chart renders (literal env values of its container)."""
        container = self.deployment["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value", "") for e in container.get("env") or [] if "valueFrom" not in e}


class Cluster(Protocol):
    """What this module needs of tests.e2e.cluster.Cluster or ExternalCluster."""

    def api(self) -> Any: ...
    def kubectl(self, *args: str, **kwargs: Any) -> Any: ...
    def helm(self, *args: str, **kwargs: Any) -> Any: ...
    def kubeconfig_for_token(self, token: str, name: str) -> Path: ...
    def log_path(self, component: str) -> Path: ...


def crd_established(crd: dict[str, Any] | None) -> bool:
    """True once the API server serves the CRD (Established and NamesAccepted)."""
    conditions = {c["type"]: c["status"] for c in ((crd or {}).get("status") or {}).get("conditions") or []}
    return conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True"


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


class LocalOperator:
    """``encoderpool-operator`` as a host process, with the chart's env and ServiceAccount token."""

    in_cluster = False

    def __init__(self, cluster: Cluster, install: ChartInstall, kubeconfig: Path) -> None:
        self.install = install
        self.kubeconfig = kubeconfig
        self.log_path = cluster.log_path("encoderpool-operator")
        self.liveness_port = 0
        self._reaper = Reaper()  # kills the operator if the test runner itself is killed
        self._proc: ManagedProcess | None = None

    def environment(self) -> dict[str, str]:
        """The test runner's env without cluster identities or stray settings, plus the chart's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX) and k not in IN_CLUSTER_ENV}
        env.update(self.install.operator_env())
        env["KUBECONFIG"] = str(self.kubeconfig)
        # The chart's port is the container's; on this host it must be one that is free.
        env[ENV_PREFIX + "LIVENESS_PORT"] = str(self.liveness_port)
        return env

    @property
    def healthz(self) -> str:
        """URL of the operator's liveness endpoint."""
        return f"http://127.0.0.1:{self.liveness_port}/healthz"

    @property
    def pid(self) -> int | None:
        """PID of the running operator, None when stopped."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, timeout: float = 60.0) -> None:
        """Start it and wait until GET /healthz answers 200."""
        assert self.pid is None, "the operator is already running"
        self.liveness_port = free_port()
        with self.log_path.open("a") as log:
            log.write(f"--- encoderpool-operator starting, liveness port {self.liveness_port} ---\n")
        self._proc = ManagedProcess("encoderpool-operator", [str(OPERATOR_BIN)], self.log_path, self._reaper,
                                    env=self.environment())

        def healthy() -> bool:
            self.check_alive()
            return httpx.get(self.healthz, timeout=2).status_code == 200

        wait_for(healthy, timeout, "the operator's /healthz")

    def check_alive(self) -> None:
        """Fail with the log tail if the operator exited on its own."""
        if self._proc is None:
            raise AssertionError("the operator was never started")
        code = self._proc.poll()
        if code is not None:
            raise AssertionError(f"the operator exited with {code}:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node failure would: no cleanup runs in the operator."""
        assert self._proc is not None and self._proc.poll() is None, "the operator is not running"
        os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.stop(grace=5)  # reaps it and tells the reaper to forget the group

    def stop(self) -> None:
        """SIGTERM (kopf shuts down gracefully), SIGKILL after a grace period."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stop(grace=10)

    def close(self) -> None:
        """Stop it and the reaper."""
        self.stop()
        self._reaper.close()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of its log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no operator log)"

    def log(self) -> str:
        """Its whole log so far."""
        return self.log_path.read_text(errors="replace")


class InClusterOperator:
    """The chart's Deployment running the operator image (external clusters, e.g. kind)."""

    in_cluster = True

    def __init__(self, cluster: Cluster, install: ChartInstall, kubeconfig: Path) -> None:
        self.install = install
        self.kubeconfig = kubeconfig
        self._cluster = cluster
        self.pid = None

    def _deployment(self) -> str:
        return f"deployment/{self.install.deployment_name}"

    def start(self, timeout: float = 300.0) -> None:
        """Wait for the Deployment's pod to be available."""
        self._cluster.kubectl("-n", self.install.namespace, "rollout", "status", self._deployment(),
                              f"--timeout={int(timeout)}s", timeout=timeout + 30)

    def check_alive(self) -> None:
        """Fail with the log tail if the Deployment is not available."""
        done = self._cluster.kubectl("-n", self.install.namespace, "rollout", "status", self._deployment(),
                                     "--timeout=60s", check=False, timeout=90)
        if done.returncode != 0:
            raise AssertionError(f"the operator Deployment is not available: {done.stderr}\n{self.log_tail()}")

    def close(self) -> None:
        """Nothing to stop: the release stays until the cluster goes."""

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the operator pod's log."""
        out = self._cluster.kubectl("-n", self.install.namespace, "logs", self._deployment(), f"--tail={lines}",
                                    check=False)
        return out.stdout or out.stderr

    def log(self) -> str:
        """The operator pod's whole log."""
        return self.log_tail(100_000)


Operator = LocalOperator | InClusterOperator
