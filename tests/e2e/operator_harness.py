"""The operator under test: the chart installed by helm, and the operator processes themselves.

On the local control plane the chart's Deployment is scheduled onto a kwok node, where it is
"Running" without running anything (kwok fakes pods). The real operator runs here instead, as
host processes, one per replica of the Deployment (two by default, with leader election): this
venv's ``encoderpool-operator`` with exactly the env the installed Deployment renders from the
chart's values (its downward-API POD_NAMESPACE and a HOSTNAME per replica added), and a token of
the chart's ServiceAccount, never the admin's, so a missing RBAC rule fails the tests as it
would fail a user's cluster.

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
    """One replica of ``encoderpool-operator`` as a host process, with the chart's env and
    ServiceAccount token."""

    in_cluster = False

    def __init__(self, cluster: Cluster, install: ChartInstall, kubeconfig: Path, replica: int = 0) -> None:
        self.install = install
        self.kubeconfig = kubeconfig
        self.replica = replica
        self.hostname = f"{install.deployment_name}-{replica}"
        self.log_path = cluster.log_path(f"encoderpool-operator-{replica}")
        self.liveness_port = 0
        self._reaper = Reaper()  # kills the operator if the test runner itself is killed
        self._proc: ManagedProcess | None = None

    def environment(self) -> dict[str, str]:
        """The test runner's env without cluster identities or stray settings, plus the chart's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX) and k not in IN_CLUSTER_ENV}
        env.update(self.install.operator_env())
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["HOSTNAME"] = self.hostname  # the pod name: the first part of its Lease identity
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

    def metrics(self) -> str:
        """Its GET /metrics text."""
        return httpx.get(f"http://127.0.0.1:{self.liveness_port}/metrics", timeout=5).text

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
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class LocalOperators:
    """The Deployment's replicas as host processes; with leader election one of them leads."""

    in_cluster = False

    def __init__(self, cluster: Cluster, install: ChartInstall, kubeconfig: Path) -> None:
        self.install = install
        self.kubeconfig = kubeconfig
        self._cluster = cluster
        self.replicas = [LocalOperator(cluster, install, kubeconfig, i) for i in range(install.replicas)]

    @property
    def lease_name(self) -> str:
        """The leader Lease (named by the chart's env)."""
        return self.install.env_value(ENV_PREFIX + "LEASE_NAME") or "encoderpool-operator"

    def lease(self) -> dict[str, Any] | None:
        """The leader Lease as the API server holds it."""
        with self._cluster.api() as api:
            return api.get_or_none(path_for("coordination.k8s.io/v1", "leases", self.install.namespace,
                                            self.lease_name))

    def holder(self) -> str:
        """holderIdentity of the Lease ('' when free)."""
        return str(((self.lease() or {}).get("spec") or {}).get("holderIdentity") or "")

    def leader(self, timeout: float = 60.0) -> LocalOperator:
        """The running replica holding the Lease (waits for one)."""
        def find() -> LocalOperator | None:
            holder = self.holder()
            return next((r for r in self.replicas if r.pid is not None and holder.startswith(r.hostname + "_")),
                        None)

        found: LocalOperator = wait_for(find, timeout, f"a leader of Lease {self.lease_name}")
        return found

    def start(self, timeout: float = 60.0) -> None:
        """Start every replica that is not running; wait for /healthz of each and for a leader."""
        for replica in self.replicas:
            if replica.pid is None:
                replica.start(timeout)
        self.leader(timeout)

    @property
    def pid(self) -> int | None:
        """PID of a running replica (None when all are stopped)."""
        return next((r.pid for r in self.replicas if r.pid is not None), None)

    @property
    def healthz(self) -> str:
        """/healthz of the first running replica."""
        return next(r for r in self.replicas if r.pid is not None).healthz

    def check_alive(self) -> None:
        """Fail with the log tail if a replica exited on its own."""
        for replica in self.replicas:
            replica.check_alive()

    def standbys(self) -> list[LocalOperator]:
        """The running replicas that do not hold the Lease."""
        leader = self.leader()
        return [r for r in self.replicas if r.pid is not None and r is not leader]

    def reload(self, install: ChartInstall) -> None:
        """Stop every replica and start them again with what ``install`` renders (after a helm upgrade)."""
        self.stop()
        self.install = install
        for replica in self.replicas:
            replica.install = install
        self.start()

    def kill(self) -> None:
        """SIGKILL every replica: the operator is down."""
        for replica in self.replicas:
            if replica.pid is not None:
                replica.kill()

    def stop(self) -> None:
        """Stop every replica (SIGTERM: a leader releases its Lease); they can be started again."""
        for replica in self.replicas:
            replica.stop()

    def close(self) -> None:
        """Stop every replica for good (their reapers too)."""
        for replica in self.replicas:
            replica.close()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of every replica's log."""
        return "\n".join(f"--- replica {r.replica} ---\n{r.log_tail(lines)}" for r in self.replicas)

    def log(self) -> str:
        """Every replica's whole log."""
        return "\n".join(r.log() for r in self.replicas)


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


Operator = LocalOperators | InClusterOperator
