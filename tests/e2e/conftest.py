"""Fixtures of the e2e tier: one real local control plane per test session.

``k8s_cluster`` fails (never skips) when the control plane is not built: a missing prerequisite
must be visible, and the message says the one command that builds it.

With ``ENCODERPOOL_E2E_KUBECONFIG=<path>`` the session uses that cluster instead (the kind path,
hack/kind-e2e.sh): nothing is started, and tests that need the local control plane's fake GPU
nodes or local operator process skip.

The operator fixtures install the chart once per session and run one operator for every test;
each pool test gets a namespace of its own (``pools``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, ClusterOptions, MissingBinaries, load_binaries
from tests.e2e.cluster.api import path_for
from tests.e2e.cluster.external import KUBECONFIG_ENV, ExternalCluster
from tests.e2e.cluster.procs import pid_alive
from tests.e2e.operator_harness import (
    ChartInstall,
    InClusterOperator,
    LocalOperators,
    Operator,
    install_chart,
    service_account_kubeconfig,
)
from tests.e2e.pools import Pools, pool_namespace


@pytest.fixture(scope="session")
def k8s_cluster() -> Iterator[Cluster]:
    """A running cluster: ``.kubeconfig``, ``.token``, ``.server``, ``.ca_file``, ``.api()``,
    ``.kubectl(...)``, ``.helm(...)``, ``.create_namespace(...)``, ``.local_node``."""
    external = os.environ.get(KUBECONFIG_ENV)
    if external:
        outside = ExternalCluster(Path(external))
        try:
            yield outside  # type: ignore[misc]  # the subset of Cluster the operator tests use
        finally:
            outside.close()
        return
    missing = None
    try:
        binaries = load_binaries()
    except MissingBinaries as err:
        missing = str(err)
    if missing is not None:  # failed outside the except block: the message alone, no chained traceback
        pytest.fail(missing, pytrace=False)
    cluster = Cluster(binaries, ClusterOptions())
    cluster.start()
    try:
        yield cluster
    finally:
        pids = cluster.pids()
        cluster.stop()
        # Teardown is part of the contract: a leaked etcd or API server is a bug, reported here.
        leaked = {name: pid for name, pid in pids.items() if pid_alive(pid)}
        assert not leaked, f"processes left behind after teardown: {leaked}"


@pytest.fixture
def namespace(k8s_cluster: Cluster) -> Iterator[str]:
    """A fresh namespace (default ServiceAccount present), deleted after the test."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    k8s_cluster.create_namespace(name)
    yield name
    with k8s_cluster.api() as api:
        api.delete(path_for("v1", "namespaces", name=name))


@pytest.fixture(scope="session")
def chart_install(k8s_cluster: Cluster) -> ChartInstall:
    """The operator chart, helm-installed with tests/e2e/data/operator-values.yaml; CRD established."""
    return install_chart(k8s_cluster)


@pytest.fixture(scope="session")
def operator_kubeconfig(k8s_cluster: Cluster, chart_install: ChartInstall) -> Path:
    """A kubeconfig with a token of the chart's ServiceAccount: the operator's identity."""
    return service_account_kubeconfig(k8s_cluster, chart_install)


@pytest.fixture(scope="session")
def operator_process(k8s_cluster: Cluster, chart_install: ChartInstall,
                     operator_kubeconfig: Path) -> Iterator[Operator]:
    """One operator for the session: a local process as the chart's ServiceAccount, or, on an
    external cluster, the chart's own Deployment."""
    kind = InClusterOperator if getattr(k8s_cluster, "external", False) else LocalOperators
    operator = kind(k8s_cluster, chart_install, operator_kubeconfig)
    try:
        operator.start()
        yield operator
    finally:
        operator.close()


@pytest.fixture
def encoderpool_operator(operator_process: Operator) -> Operator:
    """The session's operator, checked to be alive before the test (it fails with its log if not)."""
    operator_process.check_alive()
    return operator_process


@pytest.fixture
def pools(k8s_cluster: Cluster, encoderpool_operator: Operator) -> Iterator[Pools]:
    """A fresh namespace for pools, the operator running; deleted (pods waited out) afterwards."""
    with pool_namespace(k8s_cluster, encoderpool_operator) as namespaced:
        yield namespaced


@pytest.fixture
def gpu_nodes(k8s_cluster: Cluster) -> None:
    """Skip unless the cluster has the local control plane's fake 8-GPU nodes."""
    if getattr(k8s_cluster, "external", False):
        pytest.skip("needs the local control plane's fake 8-GPU nodes (kwok); an external cluster has none")
