"""Node objects of the local cluster: fake GPU nodes (kwok) and the local node (our harness).

Fake GPU nodes carry kwok's annotation, so kwok initialises them, keeps their lease and marks the
pods bound to them Running and Ready. The scheduler sees their ``nvidia.com/gpu`` capacity and
enforces it for real.

The local node is not annotated, so kwok leaves it alone; the local-node harness runs its pods
as real processes. It is tainted so that only pods that ask for it (toleration + nodeSelector, see
``local_node_placement``) land there: a Deployment installed by a chart must not be started as a
host process by accident.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .components import KWOK_NODE_ANNOTATION

GPU_RESOURCE = "nvidia.com/gpu"
LOCAL_NODE_NAME = "local-0"
LOCAL_NODE_LABEL = "encoderpool.io/local-node"
LOCAL_NODE_TAINT = "encoderpool.io/local-node"


@dataclasses.dataclass(frozen=True)
class FakeGpuNode:
    """Shape of one kwok-managed GPU node."""

    name: str
    gpus: int = 8
    cpu: str = "64"
    memory: str = "512Gi"
    pods: str = "110"
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"


def fake_gpu_node_manifest(node: FakeGpuNode) -> dict[str, Any]:
    """A Node that kwok manages (annotation) with GPU capacity the scheduler will count."""
    capacity = {"cpu": node.cpu, "memory": node.memory, "pods": node.pods, GPU_RESOURCE: str(node.gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": node.gpu_product,
                "nvidia.com/gpu.count": str(node.gpus),
            },
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def default_fake_gpu_nodes() -> list[FakeGpuNode]:
    """The two 8-GPU nodes every e2e test can count on."""
    return [FakeGpuNode(name="kwok-gpu-0"), FakeGpuNode(name="kwok-gpu-1")]


def local_node_manifest(name: str = LOCAL_NODE_NAME, cpu: str = "8", memory: str = "32Gi") -> dict[str, Any]:
    """The host-process node: no GPUs, tainted, labelled for nodeSelector."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "local",
                LOCAL_NODE_LABEL: "true",
            },
        },
        "spec": {"taints": [{"key": LOCAL_NODE_TAINT, "value": "true", "effect": "NoSchedule"}]},
    }


def local_node_placement() -> dict[str, Any]:
    """Pod spec fields that put a pod on the local node (merge them into ``spec``)."""
    return {
        "nodeSelector": {LOCAL_NODE_LABEL: "true"},
        "tolerations": [{"key": LOCAL_NODE_TAINT, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    }


def node_ready(node: dict[str, Any]) -> bool:
    """True when the node's Ready condition is True."""
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
