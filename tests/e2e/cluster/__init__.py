"""A real Kubernetes control plane for the e2e tier, run as local processes (no Docker, no kind).

Binaries come from hack/build-control-plane.sh (cached outside the repo). ``Cluster`` starts etcd,
kube-apiserver (RBAC, PodSecurity and ServiceAccount admission on), kube-controller-manager,
kube-scheduler and kwok on free loopback ports, registers two kwok-managed 8-GPU nodes and a
local node whose pods run as real host processes, and tears all of it down again.

``python -m tests.e2e.cluster`` (``make cluster``) starts one for people.
"""

from .binaries import BUILD_COMMAND, Binaries, MissingBinaries, load_binaries
from .control_plane import Cluster, ClusterOptions, ComponentFailed
from .nodes import GPU_RESOURCE, LOCAL_NODE_NAME, FakeGpuNode, local_node_placement

__all__ = [
    "BUILD_COMMAND",
    "Binaries",
    "Cluster",
    "ClusterOptions",
    "ComponentFailed",
    "FakeGpuNode",
    "GPU_RESOURCE",
    "LOCAL_NODE_NAME",
    "MissingBinaries",
    "load_binaries",
    "local_node_placement",
]
