"""Fixtures of the local control plane's tier: one real control plane per test session (etcd,
kube-apiserver, controller-manager, scheduler, kwok with two fake 8-GPU nodes; no kubelet).

``k8s_cluster`` fails (never skips) when the control plane is not built: a missing prerequisite
must be visible, and the message says the one command that builds it. Tests that need an operator
or real pods are in tests/kind.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from testkit.cluster import Cluster, ClusterOptions, MissingBinaries, load_binaries
from testkit.cluster.api import path_for
from testkit.cluster.procs import pid_alive


@pytest.fixture(scope="session")
def k8s_cluster() -> Iterator[Cluster]:
    """A running cluster: ``.kubeconfig``, ``.token``, ``.server``, ``.ca_file``, ``.api()``,
    ``.kubectl(...)``, ``.helm(...)``, ``.create_namespace(...)``."""
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
