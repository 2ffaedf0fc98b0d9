"""kwok's fake 8-GPU nodes joined to the kind cluster, for the tests where fake nodes are the right
tool: GPU-node scheduling (``Insufficient nvidia.com/gpu``, topology spread over two nodes,
cordoned rollouts) with the operator running for real in the cluster.

kwok runs as a process of this machine against kind's API server and manages only the nodes
annotated ``kwok.x-k8s.io/node=fake``; it marks the pods bound to them Running and Ready without
running anything (no image, no probe). The kind node itself is left to its kubelet.

The fake nodes are tainted ``nvidia.com/gpu:NoSchedule``, as GPU nodes commonly are (the GPU
examples tolerate it): a pod that does not ask for GPUs, a CPU pool or the operator, must never be
"run" by kwok, where it would look Ready without running. Their pod IPs come from a range of their
own, apart from kind's pod network.
"""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path
from types import TracebackType

from testkit.cluster import FakeGpuNode, fake_gpu_node_manifest, load_binaries, node_ready
from testkit.cluster.api import path_for, wait_for
from testkit.cluster.components import KWOK_NODE_ANNOTATION
from testkit.cluster.external import ExternalCluster
from testkit.cluster.procs import ManagedProcess, Reaper

NODES = (FakeGpuNode(name="kwok-gpu-0"), FakeGpuNode(name="kwok-gpu-1"))
KWOK_POD_CIDR = "10.250.0.1/16"  # kind's pods are in 10.244.0.0/16
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def tainted(node: FakeGpuNode) -> dict:
    manifest = fake_gpu_node_manifest(node)
    manifest["spec"]["taints"] = [TAINT]
    return manifest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FakeGpuNodes:
    """``with FakeGpuNodes(cluster):`` two kwok nodes of 8 GPUs each are Ready in the cluster."""

    def __init__(self, cluster: ExternalCluster) -> None:
        self.cluster = cluster
        self.log = Path(tempfile.mkdtemp(prefix="encoderpool-kwok-")) / "kwok.log"
        self._reaper = Reaper()  # kills kwok if the test runner itself is killed
        self._proc: ManagedProcess | None = None

    def __enter__(self) -> FakeGpuNodes:
        binaries = load_binaries()
        argv = [str(binaries.kwok), f"--kubeconfig={self.cluster.kubeconfig}", f"--config={binaries.kwok_stages}",
                "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{free_port()}", f"--cidr={KWOK_POD_CIDR}", "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40"]
        self._proc = ManagedProcess("kwok", argv, self.log, self._reaper)
        with self.cluster.api() as api:
            for node in NODES:
                api.create(path_for("v1", "nodes"), tainted(node))
            for node in NODES:
                wait_for(lambda name=node.name: node_ready(api.get(path_for("v1", "nodes", name=name))), 60,
                         f"kwok to make {node.name} Ready")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            with self.cluster.api() as api:
                for node in NODES:
                    api.delete(path_for("v1", "nodes", name=node.name))
        finally:
            if self._proc is not None:
                self._proc.stop(grace=5)
            self._reaper.close()
