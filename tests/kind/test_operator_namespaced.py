"""Issue 11, item 7: a namespaced install. With watchNamespaces set, the chart grants the operator
Roles in those namespaces only (and a Role for its Lease): no ClusterRole at all. That release's
Deployment (the operator image, its ServiceAccount) manages pools in the watched namespace, leaves
other namespaces alone, and is never refused by RBAC. The session's cluster-wide operator is scaled
to 0 meanwhile (it would reconcile the same pools) and back afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from testkit.cluster import Cluster
from testkit.cluster.api import path_for
from tests.e2e.chart import CHART, VALUES, ChartInstall, InClusterOperator, service_account_kubeconfig
from tests.e2e.pools import Pools, load_example, pool_namespace, pool_ready

pytestmark = [pytest.mark.kind, pytest.mark.usefixtures("gpu_nodes")]

RELEASE = "e2e-ns"
NAMESPACE = "e2e-ns-operator"


@pytest.fixture
def quiet_session_operator(encoderpool_operator: InClusterOperator) -> Iterator[None]:
    """The cluster-wide operator scaled to 0 for the test, back to the chart's replicas after it."""
    encoderpool_operator.scale(0)
    try:
        yield
    finally:
        encoderpool_operator.scale(encoderpool_operator.install.replicas)
        encoderpool_operator.start()


@pytest.fixture
def two_namespaces(k8s_cluster: Cluster) -> Iterator[tuple[Pools, Pools]]:
    """A namespace the second operator watches, and one it does not."""
    with pool_namespace(k8s_cluster, prefix="e2e-watched") as watched, \
            pool_namespace(k8s_cluster, prefix="e2e-unwatched") as other:
        yield watched, other


def test_a_namespaced_install_manages_only_its_namespaces_without_cluster_rights(
        k8s_cluster: Cluster, two_namespaces: tuple[Pools, Pools], quiet_session_operator: None) -> None:
    watched, other = two_namespaces
    k8s_cluster.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace", "--values", str(VALUES),
                     "--set", f"watchNamespaces={{{watched.namespace}}}", "--set", "replicaCount=1",
                     "--wait", "--timeout", "5m", timeout=360)
    operator = None
    try:
        with k8s_cluster.api() as api:
            deployment = api.get(path_for("apps/v1", "deployments", NAMESPACE),
                                 labelSelector=f"app.kubernetes.io/instance={RELEASE}")["items"][0]
            cluster_roles = api.get(path_for("rbac.authorization.k8s.io/v1", "clusterrolebindings"),
                                    labelSelector=f"app.kubernetes.io/instance={RELEASE}")["items"]
        assert cluster_roles == [], "a namespaced install has no cluster-wide binding"
        install = ChartInstall(RELEASE, NAMESPACE, deployment)
        kubeconfig = service_account_kubeconfig(k8s_cluster, install)
        as_operator = ["--kubeconfig", str(kubeconfig)]

        def can(*args: str) -> bool:
            return k8s_cluster.kubectl(*as_operator, "auth", "can-i", *args, check=False).stdout.strip() == "yes"

        assert can("watch", "pods", "-n", watched.namespace) and can("patch", "encoderpools/status", "-n", watched.namespace)
        assert not can("watch", "pods", "-A") and not can("list", "encoderpools", "-n", other.namespace)
        assert not can("list", "customresourcedefinitions"), "kopf's cluster scanning is off"

        operator = InClusterOperator(k8s_cluster, install, kubeconfig)
        operator.start()
        for pools in (watched, other):
            manifest = load_example("encoderpool.yaml")
            manifest["spec"].update(replicas=1, parallelism={"tensor": 1, "data": 1})
            pools.apply(manifest)
        name = load_example("encoderpool.yaml")["metadata"]["name"]
        watched.wait(name, pool_ready, 60, "Ready, managed by the namespaced operator")
        time.sleep(12)  # two resyncs: the other namespace's pool is not touched
        assert other.get(name).get("status") is None and other.child("StatefulSet", name) is None
        operator.check_alive()
        denials = [line for line in operator.log().splitlines() if "forbidden" in line.lower()]
        assert not denials, "\n".join(denials[:5])
        print(f"\nnamespaced install: Roles in {watched.namespace} and {NAMESPACE} only; "
              f"pool Ready there, the pool in {other.namespace} untouched")
    finally:
        if operator is not None:
            operator.close()
        k8s_cluster.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", timeout=120)
        with k8s_cluster.api() as api:
            api.delete(path_for("v1", "namespaces", name=NAMESPACE))
