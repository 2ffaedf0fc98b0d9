"""An existing cluster named by a kubeconfig: the kind path (hack/kind-e2e.sh, ``make kind-e2e``).

The operator's e2e tests run unchanged against it: ``ExternalCluster`` offers the part of
``Cluster``'s interface those tests use (``api()``, ``kubectl()``, ``helm()``, ``create_namespace()``,
``kubeconfig_for_token()``) and starts or stops nothing. What only the local control plane has
(kwok's fake GPU nodes, the local node, an operator run as a local process) is absent, and the
tests that need it skip saying so.

Selected by ``ENCODERPOOL_E2E_KUBECONFIG=<path>`` (see tests/e2e/conftest.py); kubectl and helm
come from PATH, or from ``ENCODERPOOL_E2E_KUBECTL`` / ``ENCODERPOOL_E2E_HELM``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config

from .api import ApiClient
from .tools import ClusterAccess

KUBECONFIG_ENV = "ENCODERPOOL_E2E_KUBECONFIG"
PORT_FORWARD_TIMEOUT = 30.0


class ExternalCluster(ClusterAccess):
    """A cluster someone else runs (kind, or any other), reached through its kubeconfig."""

    external = True
    tool_timeout = 300.0
    namespace_timeout = 60.0
    local_node = None

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        config = kubernetes.client.Configuration()
        # The client library understands every kubeconfig form (kind's embedded client certificate
        # included) and writes embedded certificates to files, which is what httpx needs.
        kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=config,
                                           persist_config=False)
        if not config.ssl_ca_cert:
            raise ValueError(f"{kubeconfig}: the tests need the cluster's CA in the kubeconfig")
        self.server: str = config.host
        self.ca_file = Path(config.ssl_ca_cert)
        bearer = str(config.auth_settings().get("BearerToken", {}).get("value") or "")
        self.token: str | None = bearer.removeprefix("Bearer ").strip() or None
        self._client_cert = (config.cert_file, config.key_file) if config.cert_file else None
        self._kubectl = os.environ.get("ENCODERPOOL_E2E_KUBECTL") or shutil.which("kubectl") or "kubectl"
        self._helm = os.environ.get("ENCODERPOOL_E2E_HELM") or shutil.which("helm") or "helm"
        self.workdir = Path(tempfile.mkdtemp(prefix="encoderpool-e2e-external-"))

    def api(self) -> ApiClient:
        """A new REST client with the kubeconfig's identity."""
        return ApiClient(self.server, self.token, self.ca_file, client_cert=self._client_cert)

    def log_path(self, component: str) -> Path:
        """Where a process started by the tests logs (nothing of the cluster's own is here)."""
        return self.workdir / "logs" / f"{component}.log"

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """``kubectl ARGS`` with the kubeconfig's identity."""
        return self.run_tool(self._kubectl, *args, **kwargs)

    def helm(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """``helm ARGS`` with the kubeconfig's identity."""
        return self.run_tool(self._helm, *args, **kwargs)

    @contextlib.contextmanager
    def http_base(self, namespace: str, pod: str, address: str, port: int) -> Iterator[str]:
        """A base URL that reaches ``pod`` at ``address:port``.

        Pod IPs of a kind cluster live inside its node containers, out of the host's reach, so the
        request goes through ``kubectl port-forward`` to the very pod the EndpointSlice names.
        """
        with self.workdir.joinpath("port-forward.log").open("w") as log:
            proc = subprocess.Popen(
                [self._kubectl, "-n", namespace, "port-forward", f"pod/{pod}", f":{port}"],
                stdout=subprocess.PIPE, stderr=log, text=True, env=self.tool_env())
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:43127 -> 30000"
            match = re.search(r"127\.0\.0\.1:(\d+)", line)
            if match is None:
                raise AssertionError(f"kubectl port-forward to {namespace}/{pod} ({address}) failed: {line!r}")
            yield f"http://127.0.0.1:{match.group(1)}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=PORT_FORWARD_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def close(self) -> None:
        """Remove the temp dir (kubeconfigs with tokens, helm state); the cluster stays."""
        shutil.rmtree(self.workdir, ignore_errors=True)
