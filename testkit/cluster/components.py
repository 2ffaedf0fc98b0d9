"""Command lines of the control-plane components (pure functions: settings in, argv out).

Flags follow what controller-runtime's envtest and kwokctl's binary runtime pass, plus what this
project needs to be realistic: RBAC (and the Node authorizer), PodSecurity and ServiceAccount
admission, and the controller-manager's default controllers (statefulset, endpointslice, disruption,
garbagecollector, namespace, serviceaccount-token, nodelifecycle, ...).
"""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

from .binaries import Binaries
from .pki import FRONT_PROXY_CLIENT, Pki

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_POD_CIDR = "10.244.0.1/16"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# StatefulSet maxUnavailable is beta and off by default in 1.35; on here so that spec.rollout's
# maxUnavailable can be tested (the operator also reports clusters where it is off).
FEATURE_GATES = "MaxUnavailableStatefulSet=true"
# The HPA controller's loop: 15 s by default; short so that autoscaling tests take seconds.
HPA_SYNC_PERIOD = "2s"


@dataclasses.dataclass(frozen=True)
class Ports:
    """Loopback ports of one cluster, all picked free at start."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def pick(cls) -> Ports:
        """Ask the kernel for free ports (held open together so they are distinct)."""
        sockets = []
        try:
            for _ in dataclasses.fields(cls):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind(("127.0.0.1", 0))
                sockets.append(sock)
            return cls(*(s.getsockname()[1] for s in sockets))
        finally:
            for sock in sockets:
                sock.close()


def etcd_argv(binaries: Binaries, ports: Ports, data_dir: Path) -> list[str]:
    """A single-member etcd on loopback; fsync off because the data is thrown away anyway."""
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    client = f"http://127.0.0.1:{ports.etcd_client}"
    return [
        str(binaries.etcd),
        "--name=e2e",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=e2e={peer}",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_argv(binaries: Binaries, ports: Ports, pki: Pki) -> list[str]:
    """kube-apiserver with token auth, Node+RBAC authorization and PodSecurity admission."""
    return [
        str(binaries.kube_apiserver),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.server_cert}",
        f"--tls-private-key-file={pki.server_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--token-auth-file={pki.token_file}",
        "--authorization-mode=Node,RBAC",
        # Both are on by default; named so that a future default change cannot silently drop them.
        "--enable-admission-plugins=ServiceAccount,PodSecurity,NodeRestriction",
        "--allow-privileged=true",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.service_account_key}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        # No real endpoints for the "kubernetes" Service: nothing in a pod can route to it anyway.
        "--endpoint-reconciler-type=none",
        # The aggregation layer, for APIServices (a custom metrics API in the autoscaling tests):
        # the front-proxy CA and client cert, and routing to endpoint IPs (there is no kube-proxy,
        # so a Service's cluster IP leads nowhere).
        f"--requestheader-client-ca-file={pki.front_proxy_ca}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.proxy_client_cert}",
        f"--proxy-client-key-file={pki.proxy_client_key}",
        "--enable-aggregator-routing=true",
        f"--feature-gates={FEATURE_GATES}",
        "--profiling=false",
        "--v=1",
    ]


def _serving_flags(port: int, kubeconfig: Path) -> list[str]:
    """Flags shared by controller-manager and scheduler: loopback /healthz, admin kubeconfig."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--v=1",
    ]


def controller_manager_argv(binaries: Binaries, ports: Ports, pki: Pki, kubeconfig: Path) -> list[str]:
    """kube-controller-manager running all default controllers."""
    return [
        str(binaries.kube_controller_manager),
        *_serving_flags(ports.controller_manager, kubeconfig),
        "--controllers=*",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--feature-gates={FEATURE_GATES}",
        f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
    ]


def scheduler_argv(binaries: Binaries, ports: Ports, kubeconfig: Path) -> list[str]:
    """kube-scheduler with its default profile (it enforces nvidia.com/gpu capacity)."""
    return [str(binaries.kube_scheduler), *_serving_flags(ports.scheduler, kubeconfig)]


def kwok_argv(binaries: Binaries, ports: Ports, kubeconfig: Path) -> list[str]:
    """kwok managing only the nodes annotated kwok.x-k8s.io/node=fake (never the local node)."""
    return [
        str(binaries.kwok),
        f"--kubeconfig={kubeconfig}",
        f"--config={binaries.kwok_stages}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        f"--server-address=127.0.0.1:{ports.kwok}",
        f"--cidr={KWOK_POD_CIDR}",
        "--node-ip=127.0.0.1",
        "--node-lease-duration-seconds=40",
    ]
