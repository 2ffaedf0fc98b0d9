"""Fake GPU nodes (kwok), for the local control plane and for a kind cluster alike.

Fake GPU nodes carry kwok's annotation, so kwok initialises them, keeps their lease and marks the
pods bound to them Running and Ready. The scheduler sees their ``nvidia.com/gpu`` capacity and
enforces it for real.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .components import KWOK_NODE_ANNOTATION

GPU_RESOURCE = "nvidia.com/gpu"


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


def node_ready(node: dict[str, Any]) -> bool:
    """True when the node's Ready condition is True."""
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
