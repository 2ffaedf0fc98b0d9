"""The local control plane behaves like a real cluster where the operator tests rely on it:
version, fake GPU nodes, GPU-aware scheduling, PodSecurity admission and RBAC."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.cluster import GPU_RESOURCE, Cluster
from testkit.cluster.api import ApiError, path_for
from testkit.cluster.objects import condition, pod_ready, wait_for_pod

pytestmark = pytest.mark.e2e


def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    """A pod asking for ``gpus`` GPUs (kwok never runs it, so the image does not matter)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{
                "name": "main",
                "image": "registry.invalid/encoder:1",
                "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
            }],
        },
    }


def test_api_server_reports_the_built_version(k8s_cluster: Cluster) -> None:
    with k8s_cluster.api() as api:
        version = api.get("/version")
    assert version["gitVersion"] == k8s_cluster.binaries.k8s_version
    # kubectl talks to it through the written kubeconfig, with the admin token.
    out = k8s_cluster.kubectl("get", "--raw", "/readyz").stdout
    assert out.strip() == "ok"


def test_fake_gpu_nodes_are_ready_with_eight_gpus(k8s_cluster: Cluster) -> None:
    with k8s_cluster.api() as api:
        nodes = api.get(path_for("v1", "nodes"), labelSelector="type=kwok")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["kwok-gpu-0", "kwok-gpu-1"]
    for node in nodes:
        assert condition(node, "Ready")["status"] == "True"
        assert node["status"]["allocatable"][GPU_RESOURCE] == "8"


def test_pod_asking_two_gpus_is_scheduled_on_a_kwok_node_and_becomes_ready(
        k8s_cluster: Cluster, namespace: str) -> None:
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "pods", namespace), gpu_pod("two-gpus", 2))
        pod = wait_for_pod(api, namespace, "two-gpus", pod_ready, 30, "Ready")
    assert pod["spec"]["nodeName"].startswith("kwok-gpu-")
    assert pod["status"]["podIP"]


def test_pod_asking_more_gpus_than_any_node_has_stays_unschedulable(
        k8s_cluster: Cluster, namespace: str) -> None:
    with k8s_cluster.api() as api:
        api.create(path_for("v1", "pods", namespace), gpu_pod("sixteen-gpus", 16))
        pod = wait_for_pod(api, namespace, "sixteen-gpus", lambda p: condition(p, "PodScheduled"), 30,
                           "to get a PodScheduled condition")
    scheduled = condition(pod, "PodScheduled")
    assert pod["status"]["phase"] == "Pending"
    assert scheduled["status"] == "False"
    assert scheduled["reason"] == "Unschedulable"
    assert f"Insufficient {GPU_RESOURCE}" in scheduled["message"]


def test_restricted_namespace_rejects_a_privileged_pod_and_admits_a_hardened_one(k8s_cluster: Cluster) -> None:
    name = "e2e-restricted"
    k8s_cluster.create_namespace(name, {"pod-security.kubernetes.io/enforce": "restricted"})
    privileged = gpu_pod("privileged", 0)
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    hardened = gpu_pod("hardened", 0)
    hardened["spec"]["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    hardened["spec"]["containers"][0]["securityContext"] = {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    with k8s_cluster.api() as api:
        with pytest.raises(ApiError) as rejected:
            api.create(path_for("v1", "pods", name), privileged)
        api.create(path_for("v1", "pods", name), hardened)
        api.delete(path_for("v1", "namespaces", name=name))
    assert rejected.value.status_code == 403
    assert 'violates PodSecurity "restricted:latest"' in rejected.value.message
    assert "privileged" in rejected.value.message


def test_rbac_is_enforced_for_service_account_tokens(k8s_cluster: Cluster, namespace: str) -> None:
    k8s_cluster.kubectl("-n", namespace, "create", "serviceaccount", "nobody")
    token = k8s_cluster.kubectl("-n", namespace, "create", "token", "nobody").stdout.strip()
    as_nobody = str(k8s_cluster.kubeconfig_for_token(token, "nobody"))
    denied = k8s_cluster.kubectl("--kubeconfig", as_nobody, "-n", namespace, "get", "pods", check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr
    k8s_cluster.kubectl("-n", namespace, "create", "role", "pod-reader", "--verb=list", "--resource=pods")
    k8s_cluster.kubectl("-n", namespace, "create", "rolebinding", "nobody-reads", "--role=pod-reader",
                        f"--serviceaccount={namespace}:nobody")
    allowed = k8s_cluster.kubectl("--kubeconfig", as_nobody, "-n", namespace, "get", "pods", check=False)
    assert allowed.returncode == 0, allowed.stderr


def test_helm_reaches_the_cluster(k8s_cluster: Cluster) -> None:
    out = k8s_cluster.helm("list", "--all-namespaces", "-o", "json").stdout
    assert out.strip() == "[]"
