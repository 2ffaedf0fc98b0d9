"""The operator's start against a real kube-apiserver (the local control plane, no proxy, no
injected errors): an operator that starts before its CRD is served still reconciles the pools
created once it is.

The operator runs as a host process (as bench/operator_scale.py runs it), in a small cluster of
this test's own: the CRD must not exist before the test.

What happens without the operator's wait at its start: kopf looks up which resources the API
server serves once, right after its startup handlers, and with ``settings.scanning.disabled``
never again; it logs "Unresolved resources cannot be served" and never watches EncoderPools, and
the resync waits for a first handler call that never comes: the pool is never reconciled.

Once the CRD is served, the operator's first LIST of encoderpools creates the resource's watch
cache, and kube-apiserver answers it 429 "storage is (re)initializing" (Retry-After: 1) while that
cache fills: the log line seen at the operator's start on kind. kopf retries it (here, too, the
pool is reconciled); the test reports whether it met one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster import Cluster, ClusterOptions, load_binaries
from testkit.cluster.api import path_for, wait_for
from testkit.cluster.objects import crd_established
from testkit.server import free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "encoderpools.encoderpool.io.yaml"
CRD_NAME = "encoderpools.encoderpool.io"
NAMESPACE = "startup"
# What the operator logs once kopf has looked up the resources (before the fix) or while its
# start waits for the CRD (after): either way, kopf's start is past the point that matters.
STARTED = ("Unresolved resources cannot be served", "does not serve encoderpools")
TOO_MANY = "storage is (re)initializing"


def pool() -> dict[str, Any]:
    return {"apiVersion": "encoderpool.io/v1alpha1", "kind": "EncoderPool",
            "metadata": {"name": "late", "namespace": NAMESPACE},
            "spec": {"model": "/opt/encoderpool/models/qwen2_vl-tiny", "device": "cpu", "replicas": 1,
                     "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}}


def start_operator(cluster: Cluster, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
           "ENCODERPOOL_OPERATOR_LIVENESS_PORT": str(free_port()), "ENCODERPOOL_OPERATOR_LEADER_ELECTION": "false",
           "ENCODERPOOL_OPERATOR_RESYNC_SECONDS": "5", "ENCODERPOOL_OPERATOR_WAIT_SECONDS": "1"}
    with log.open("wb") as out:
        return subprocess.Popen([str(Path(sys.executable).parent / "encoderpool-operator")], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def test_an_operator_started_before_its_crd_reconciles_the_pools_created_after() -> None:
    with Cluster(load_binaries(), ClusterOptions(fake_gpu_nodes=())) as cluster:
        cluster.create_namespace(NAMESPACE)
        log = cluster.log_path("encoderpool-operator")
        operator = start_operator(cluster, log)
        try:
            wait_for(lambda: operator.poll() is None and any(s in log.read_text() for s in STARTED), 60,
                     "the operator's start to find no EncoderPool API")
            cluster.kubectl("apply", "--server-side", "-f", str(CRD))
            with cluster.api() as api:
                wait_for(lambda: crd_established(api.get_or_none(path_for(
                    "apiextensions.k8s.io/v1", "customresourcedefinitions", name=CRD_NAME))), 60, "the CRD")
                cluster.kubectl("apply", "-f", "-", input=json.dumps(pool()))
                path = path_for("encoderpool.io/v1alpha1", "encoderpools", NAMESPACE, "late")
                try:
                    found = wait_for(lambda: (api.get(path).get("status") or {}).get("reason"), 60,
                                     "the pool created after the CRD to be reconciled")
                except TimeoutError as err:
                    raise AssertionError(f"{err}\n--- operator log tail ---\n{log.read_text()[-3000:]}") from None
            assert operator.poll() is None, log.read_text()[-3000:]
        finally:
            operator.terminate()
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait(10)
        met = TOO_MANY in log.read_text()
        print(f"\nstartup: the pool says {found}; the operator's first LIST met 429 {TOO_MANY!r}: {met}")
