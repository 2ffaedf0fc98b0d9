"""A real Kubernetes control plane run as local processes (no Docker, no kind), for the e2e tier,
the kind tier's fake GPU nodes and the operator benchmark.

Binaries come from hack/build-control-plane.sh (cached outside the repo). ``Cluster`` starts etcd,
kube-apiserver (RBAC, PodSecurity and ServiceAccount admission on), kube-controller-manager,
kube-scheduler and kwok on free loopback ports, registers two kwok-managed 8-GPU nodes, and tears
all of it down again. Real pods run on kind (tests/kind); this cluster has no kubelet.

``python -m testkit.cluster`` (``make cluster``) starts one for people.
"""

from .binaries import BUILD_COMMAND, Binaries, MissingBinaries, load_binaries
from .control_plane import Cluster, ClusterOptions, ComponentFailed
from .nodes import GPU_RESOURCE, FakeGpuNode, fake_gpu_node_manifest, node_ready

__all__ = [
    "BUILD_COMMAND",
    "Binaries",
    "Cluster",
    "ClusterOptions",
    "ComponentFailed",
    "FakeGpuNode",
    "GPU_RESOURCE",
    "MissingBinaries",
    "load_binaries",
    "fake_gpu_node_manifest",
    "node_ready",
]
