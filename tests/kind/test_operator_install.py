"""Issue 4, test 1: the chart installs; the CRD is established; the operator runs as the chart's
ServiceAccount (a token of it, never the admin's), with no more rights than the chart grants."""

from __future__ import annotations

import json

import httpx
import pytest

from testkit.cluster import Cluster
from testkit.cluster.api import path_for
from testkit.cluster.objects import crd_established
from tests.e2e.chart import CRD_NAME, ChartInstall, Operator

pytestmark = pytest.mark.kind


def test_helm_install_establishes_the_crd_and_the_operator_deployment(
        k8s_cluster: Cluster, chart_install: ChartInstall) -> None:
    status = json.loads(k8s_cluster.helm("status", chart_install.release, "-n", chart_install.namespace,
                                         "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    with k8s_cluster.api() as api:
        crd = api.get(path_for("apiextensions.k8s.io/v1", "customresourcedefinitions", name=CRD_NAME))
        deployment = api.get(path_for("apps/v1", "deployments", chart_install.namespace,
                                      chart_install.deployment_name))
    assert crd_established(crd)
    assert crd["spec"]["names"]["shortNames"] == ["encpool"]
    assert crd["spec"]["versions"][0]["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    # The chart's Deployment runs: both replicas of the operator image available through their probes.
    assert deployment["status"].get("availableReplicas") == chart_install.replicas == 2
    # kubectl resolves the short name through discovery: what users type works.
    assert k8s_cluster.kubectl("get", "encpool", "-A").returncode == 0
    # kubectl explain describes the day-two fields from the CRD's own descriptions.
    for field, words in (("spec.rollout.partition", "canary"), ("spec.autoscaling.metric", "encoder_queue_depth"),
                         ("spec.podTemplate", "strategic"), ("spec.modelSource.cache", "PersistentVolumeClaim"),
                         ("spec.drain.preStopSeconds", "preStop"), ("spec.sglang.registerURLs", "ENCODER_REGISTER_URLS"),
                         ("status.revisions", "revision")):
        explained = k8s_cluster.kubectl("explain", f"encpool.{field}").stdout
        assert words in explained, f"kubectl explain encpool.{field}:\n{explained}"


def test_operator_runs_with_the_chart_service_account_and_only_its_rights(
        k8s_cluster: Cluster, chart_install: ChartInstall, encoderpool_operator: Operator) -> None:
    as_operator = ["--kubeconfig", str(encoderpool_operator.kubeconfig)]
    whoami = json.loads(k8s_cluster.kubectl(*as_operator, "auth", "whoami", "-o", "json").stdout)
    assert whoami["status"]["userInfo"]["username"] == (
        f"system:serviceaccount:{chart_install.namespace}:{chart_install.service_account}")

    def can(*args: str) -> bool:
        out = k8s_cluster.kubectl(*as_operator, "auth", "can-i", *args, check=False).stdout.strip()
        return out == "yes"

    # What the operator needs, cluster-wide ...
    assert can("patch", "encoderpools.encoderpool.io/status", "-A")
    assert can("create", "statefulsets.apps", "-A")
    assert can("watch", "pods", "-A")
    # ... and not what it does not: RBAC gaps and excesses both show up here.
    assert not can("get", "secrets", "-A")
    assert not can("delete", "statefulsets.apps", "-A")
    assert not can("create", "pods", "-A")
    assert not can("*", "*")
    if not encoderpool_operator.in_cluster:
        assert httpx.get(encoderpool_operator.healthz, timeout=5).status_code == 200
    # Nothing the operator did so far was refused by RBAC ("... is forbidden: User ... cannot ...").
    denials = [line for line in encoderpool_operator.log().splitlines() if "is forbidden: User" in line]
    assert not denials, "\n".join(denials[:5])
