"""Fixtures of the kind tier: the kind cluster hack/kind-e2e.sh made, the chart installed with the
built operator image (its Deployment runs for real, as the chart's ServiceAccount), a fresh
namespace per test (``restricted``: one enforcing the ``restricted`` Pod Security Standard, with a
client pod in it), and (``gpu_nodes``) kwok's fake 8-GPU nodes joined to the cluster.

``kind_cluster`` FAILS when ENCODERPOOL_E2E_KUBECONFIG is not set (never a silent skip): the
message names the one command that brings the tier up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cluster.external import KUBECONFIG_ENV, ExternalCluster
from tests.e2e.chart import ChartInstall, InClusterOperator, install_chart, service_account_kubeconfig
from tests.e2e.pools import Pools, pool_namespace
from tests.kind.fake_nodes import FakeGpuNodes
from tests.kind.incluster import RESTRICTED, ClientPod, refuses_a_bare_pod, scripts_configmap


@pytest.fixture(scope="session")
def kind_cluster() -> Iterator[ExternalCluster]:
    """The kind cluster of this run (``make kind-e2e`` creates it and points the tests at it)."""
    kubeconfig = os.environ.get(KUBECONFIG_ENV)
    if not kubeconfig:
        pytest.fail(f"the kind tier runs on the cluster `make kind-e2e` creates ({KUBECONFIG_ENV} is not set)",
                    pytrace=False)
    cluster = ExternalCluster(Path(kubeconfig))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def k8s_cluster(kind_cluster: ExternalCluster) -> ExternalCluster:
    """The same cluster, by the name the operator tests use."""
    return kind_cluster


@pytest.fixture(scope="session")
def fake_gpu_nodes(kind_cluster: ExternalCluster) -> Iterator[FakeGpuNodes]:
    """kwok's two fake 8-GPU nodes, joined to the kind cluster for the session."""
    with FakeGpuNodes(kind_cluster) as nodes:
        yield nodes


@pytest.fixture
def gpu_nodes(fake_gpu_nodes: FakeGpuNodes) -> None:
    """The test schedules GPU pools onto kwok's fake nodes (their pods do not run)."""


@pytest.fixture(scope="session")
def chart_install(kind_cluster: ExternalCluster) -> ChartInstall:
    """``helm install`` of the chart with the e2e values; its Deployment runs the operator image."""
    return install_chart(kind_cluster)


@pytest.fixture(scope="session")
def operator_kubeconfig(kind_cluster: ExternalCluster, chart_install: ChartInstall) -> Path:
    """A kubeconfig with a token of the chart's ServiceAccount: the operator's identity."""
    return service_account_kubeconfig(kind_cluster, chart_install)


@pytest.fixture(scope="session")
def operator_process(kind_cluster: ExternalCluster, chart_install: ChartInstall,
                     operator_kubeconfig: Path) -> Iterator[InClusterOperator]:
    """The chart's operator Deployment, available (both replicas, one of them leading)."""
    operator = InClusterOperator(kind_cluster, chart_install, operator_kubeconfig)
    operator.start()
    yield operator


@pytest.fixture
def encoderpool_operator(operator_process: InClusterOperator) -> InClusterOperator:
    """The session's operator, checked to be available before the test."""
    operator_process.check_alive()
    return operator_process


@pytest.fixture
def pools(kind_cluster: ExternalCluster, encoderpool_operator: InClusterOperator) -> Iterator[Pools]:
    """A fresh namespace for pools; deleted (its pods waited out) afterwards."""
    with pool_namespace(kind_cluster, encoderpool_operator, prefix="kind") as namespaced:
        yield namespaced


@pytest.fixture
def client(pools: Pools) -> Iterator[ClientPod]:
    """A pod in the pools' namespace that sends requests from inside the cluster (the encoder
    image's python), with the tier's scripts mounted."""
    scripts_configmap(pools)
    with ClientPod(pools) as pod:
        yield pod


@pytest.fixture
def restricted(kind_cluster: ExternalCluster, encoderpool_operator: InClusterOperator) -> Iterator[tuple[Pools, ClientPod]]:
    """A namespace enforcing ``restricted`` (a bare pod is refused there) and a client pod in it."""
    with pool_namespace(kind_cluster, encoderpool_operator, RESTRICTED, prefix="kind-restricted") as pools:
        refuses_a_bare_pod(pools)
        scripts_configmap(pools)
        with ClientPod(pools) as client:
            yield pools, client
